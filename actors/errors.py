"""The exception tree of kinbox, drawn whole, and the errors of the actors layer.

One root, :class:`KinboxError` (defined in the bottom layer so that
``kinbox.persistence`` shares it). Catch ``KinboxError`` for anything kinbox
refuses; decide on the types and their attributes, never on message text::

    KinboxError
    ├── ToolError              .code: not_found, invalid_argument or
    │                          execution_failed; .retry_after: seconds until a
    │                          rate-limited call may succeed (else None);
    │                          .to_dict() is the tool result
    ├── RuntimeStateError      .state: the runtime is not started, or stopped; a
    │                          turn's call refused (ended, event_loop)
    ├── IdleTimeout            .timeout, .statistics: run_until_idle ran out of time
    ├── ConfigError            .field: an argument given to kinbox is invalid
    │   └── BrainRefError      .spec: ``module:attribute`` names no callable brain
    ├── PairingFailed          .reason, .retry, .status: pairing with another device
    │                          did not complete (refused, or unreachable: try again)
    ├── ScenarioError          .path, .lineno: a scenario script could not run
    ├── ToolRoundsExceeded     .rounds: a framework brain's model kept calling tools
    ├── PermanentFailure       a brain's attempt failed for good: no further attempt
    │                          (``brain_failure``)
    ├── RetryLater             .retry_after: a brain's attempt failed; the next no
    │                          sooner than that many seconds (``brain_failure``)
    ├── ProtocolError          .event, .phase: the delivery protocol refused an
    │                          event in its phase (a bug in a shell; ``delivery``)
    └── PersistenceError       the database refused (``kinbox.persistence``)
        ├── DatabaseOpenError  .url (password masked), .reason
        │   └── DatabaseMissing  a read found no database and created none
        ├── SchemaError        the schema is older than this code, or newer
        │   ├── SchemaTooNew   .found, .known, .compatible: a newer kinbox upgraded it
        │   └── SchemaIncomplete  .found, .known, .compatible, .missing: a newer one
        │                      lacks what this code needs
        ├── IdempotencyConflict  .message_id reused for another message
        ├── IllegalTransition  .message_id, .current, .event
        ├── LeaseLost          .message_id, .owner (fencing)
        ├── RowNotFound        .kind, .key, .by
        ├── DuplicateError     .kind, .field, .value
        ├── InvalidArgument    .field, .value: a store's argument outside its
        │                      contract (a page's limit of 0); also a ValueError
        ├── DatabaseInUse      .path: another runtime owns the SQLite file
        ├── LifeLockLost       .owner: the connection holding the life lock died
        ├── DatabaseFailed     .kind, .sqlstate, .detail: a statement failed (a lost
        │                      connection, a lock timeout, a full disk); also the
        │                      peewee error
        └── WriterClosed       the group-commit writer stopped
"""

from __future__ import annotations

from typing import Any, Literal

from ..persistence.errors import KinboxError

ToolErrorCode = Literal["not_found", "invalid_argument", "execution_failed"]

__all__ = [
    "BrainRefError",
    "ConfigError",
    "IdleTimeout",
    "KinboxError",
    "PairingFailed",
    "PermanentFailure",
    "RetryLater",
    "RuntimeStateError",
    "ScenarioError",
    "ToolError",
    "ToolErrorCode",
    "ToolRoundsExceeded",
]


class ToolError(KinboxError):
    """A tool call was refused. ``code`` says how; the message says what to do.
    ``retry_after``: for a refusal that time lifts (a family send's rate limit), the
    seconds after which the same call is let through, as the message tells them; None
    for any other."""

    def __init__(
        self, code: ToolErrorCode, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.code: ToolErrorCode = code
        self.message = message
        self.retry_after = retry_after

    def to_dict(self) -> dict[str, str]:
        """The error as a tool result a language model can read."""
        return {"error": self.code, "message": self.message}


def tool_result(exc: ToolError | RuntimeStateError) -> dict[str, str]:
    """What a model's tool call gets back when it was refused: a refusal of the call's own,
    or of the runtime's (it is stopping: a turn wrapping up its work still gets a result
    it can read, not an exception through its model loop; or the call was made on the
    event loop of async brains, :mod:`.loop_rule`)."""
    if isinstance(exc, ToolError):
        return exc.to_dict()
    if exc.state == EVENT_LOOP:  # a sync tool called on the loop of async brains
        return {"error": "execution_failed", "message": f"{exc}; this call did nothing."}
    return {
        "error": "execution_failed",
        "message": f"The runtime is not running ({exc}); this call did nothing.",
    }


EVENT_LOOP = "event_loop"
"""The :attr:`RuntimeStateError.state` of a call refused on the event loop of async brains
(:mod:`.loop_rule`)."""


class RuntimeStateError(KinboxError):
    """The runtime is not running (never started, stopped, or crashed), or a turn refuses a
    call in the state it is in; ``state`` says which (``ended``: the turn's brain returned;
    ``event_loop``: a call that would read or write the database, made on the event loop
    of async brains, which names its awaitable twin)."""

    def __init__(self, message: str, state: str = "") -> None:
        super().__init__(message)
        self.state = state


class IdleTimeout(KinboxError):
    """``run_until_idle`` gave up; ``statistics`` is the runtime's state at that moment."""

    def __init__(self, timeout: float, statistics: dict[str, Any]) -> None:
        super().__init__(f"runtime still busy after {timeout:.1f}s: {statistics}")
        self.timeout = timeout
        self.statistics = statistics


class ConfigError(KinboxError):
    """An argument given to kinbox is invalid; ``field`` names it when there is one."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class BrainRefError(ConfigError):
    """``--brain module:attribute`` does not name a callable brain; ``spec`` is what was given."""

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"--brain {spec!r}: {reason}", field="brain")
        self.spec = spec
        self.reason = reason


class PairingFailed(KinboxError):
    """Pairing with another device did not complete. ``reason``: the other device's
    refusal (a ``kinbox.transport.grants.Refusal`` value; ``refused`` when what answered
    gave no such code; ``malformed`` for an answer that broke the protocol), or
    ``unavailable`` when it could not be reached or asked to be tried again (``status``:
    the HTTP status of a refused upgrade, else None); ``retry``: whether the same command
    with the same code may still pair. The transport error is its ``__cause__``."""

    def __init__(
        self, message: str, reason: str, *, retry: bool, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry
        self.status = status


class ScenarioError(KinboxError):
    """A scenario script failed to load or raised; ``path`` and ``lineno`` point at the cause."""

    def __init__(self, message: str, path: str = "", lineno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.lineno = lineno


class ToolRoundsExceeded(KinboxError):
    """A framework brain's model still called tools after ``rounds`` rounds of them and a
    last request for an answer without tools: the turn has no reply, so it is a failed
    attempt (retried), not a silent delivery."""

    def __init__(self, rounds: int) -> None:
        super().__init__(
            f"the model still called tools after {rounds} rounds of tool calls "
            "and a request for its answer"
        )
        self.rounds = rounds


class PermanentFailure(KinboxError):
    """Raised by a brain: this attempt failed and no other would succeed (the model API
    refused the key, or refused the prompt). An inbox row ends ``failed`` at once, its
    error recorded; a cron run deactivates its job; an exception raised ``from`` one (its
    ``__cause__``), or an exception group holding one, counts as one
    (:func:`.brain_failure.classify`)."""


class RetryLater(KinboxError):
    """Raised by a brain: this attempt failed; try again no sooner than ``retry_after``
    seconds (a model API's rate limit, its ``Retry-After``). Still a failed attempt,
    counted toward the row's limit; the wait is at least the usual backoff, and at most
    :data:`.brain_failure.RETRY_AFTER_MAX`."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        super().__init__(message or f"retry no sooner than {retry_after} s")
        self.retry_after = retry_after
