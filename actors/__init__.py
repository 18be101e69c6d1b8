"""kinbox.actors: the runtime, its actors and the agent tools. Start here.

from kinbox.actors import Runtime

def brain(turn):
    turn.reply(f"got {turn.messages[0].content}")

with Runtime(db="sqlite:///app.db", brain=brain) as rt:
    ...
"""

import importlib
from typing import TYPE_CHECKING

from ..persistence.errors import (
    DatabaseFailed,
    DatabaseInUse,
    DatabaseMissing,
    DatabaseOpenError,
    DuplicateError,
    IdempotencyConflict,
    IllegalTransition,
    LeaseLost,
    PersistenceError,
    RowNotFound,
    SchemaError,
    SchemaIncomplete,
    SchemaTooNew,
    WriterClosed,
    WriteTimeout,
)
from .clock import Clock, ManualClock, SystemClock
from .errors import (
    BrainRefError,
    ConfigError,
    IdleTimeout,
    KinboxError,
    PairingFailed,
    PermanentFailure,
    RetryLater,
    RuntimeStateError,
    ScenarioError,
    ToolError,
    ToolRoundsExceeded,
)

if TYPE_CHECKING:
    from .access import HIDDEN_KINDS, SESSION_KINDS
    from .runtime import Runtime
    from .tools import AgentTools, SubagentTools, TaskTools
    from .turn import Brain, Message, Turn, TurnOutcome

_ON_FIRST_USE = {
    "HIDDEN_KINDS": ".access",
    "SESSION_KINDS": ".access",
    "Runtime": ".runtime",
    "AgentTools": ".tools",
    "SubagentTools": ".tools",
    "TaskTools": ".tools",
    "Brain": ".turn",
    "Message": ".turn",
    "Turn": ".turn",
    "TurnOutcome": ".turn",
}
"""Names imported when first used: the runtime brings the scheduler, the HTTP stack and the
peer links, which a ``kinbox`` command that reads or changes rows never needs."""


def __getattr__(name: str) -> object:
    module = _ON_FIRST_USE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    # ``__version__`` is read from the installed metadata on first use only: reading it
    # cost every process that imports kinbox (each CLI command) about 0.1 s.
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        found = metadata.version("kinbox")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE) | {"__version__"})


__all__ = [
    "HIDDEN_KINDS",
    "SESSION_KINDS",
    "AgentTools",
    "Brain",
    "BrainRefError",
    "Clock",
    "ConfigError",
    "DatabaseFailed",
    "DatabaseInUse",
    "DatabaseMissing",
    "DatabaseOpenError",
    "DuplicateError",
    "IdempotencyConflict",
    "IdleTimeout",
    "IllegalTransition",
    "KinboxError",
    "LeaseLost",
    "ManualClock",
    "Message",
    "PairingFailed",
    "PermanentFailure",
    "PersistenceError",
    "RetryLater",
    "RowNotFound",
    "Runtime",
    "RuntimeStateError",
    "ScenarioError",
    "SchemaError",
    "SchemaIncomplete",
    "SchemaTooNew",
    "SubagentTools",
    "SystemClock",
    "TaskTools",
    "ToolError",
    "ToolRoundsExceeded",
    "Turn",
    "TurnOutcome",
    "WriteTimeout",
    "WriterClosed",
]
