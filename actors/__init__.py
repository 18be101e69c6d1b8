"""kinbox.actors: the runtime, its actors and the agent tools. Start here.

from kinbox.actors import Runtime

def brain(turn):
    turn.reply(f"got {turn.messages[0].content}")

with Runtime(db="sqlite:///app.db", brain=brain) as rt:
    ...
"""

from importlib import metadata as _metadata

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
    WriterClosed,
    WriteTimeout,
)
from .access import HIDDEN_KINDS, SESSION_KINDS
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
from .runtime import Runtime
from .tools import AgentTools, SubagentTools, TaskTools
from .turn import Brain, Message, Turn, TurnOutcome

try:
    __version__ = _metadata.version("kinbox")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

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
