"""Errors raised by the actors layer (the runtime and the agent tools).

::

    KinboxError
    ├── ToolError          a tool call was refused; .code is not_found,
    │                      invalid_argument or execution_failed (SPEC §2)
    ├── RuntimeStateError  the runtime is not started, or already stopped
    ├── IdleTimeout        run_until_idle ran out of time; .statistics says why
    └── ConfigError        a Runtime argument is invalid

Errors from the layers below (``kinbox.persistence``) pass through unchanged
so a caller can tell "the database refused" from "the runtime refused".
"""

from __future__ import annotations

from typing import Any, Literal

ToolErrorCode = Literal["not_found", "invalid_argument", "execution_failed"]


class KinboxError(Exception):
    """Base class of every error raised by ``kinbox.actors``."""


class ToolError(KinboxError):
    """A tool call was refused. ``code`` says how; the message says what to do."""

    def __init__(self, code: ToolErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ToolErrorCode = code
        self.message = message

    def to_dict(self) -> dict[str, str]:
        """The error as a tool result a language model can read."""
        return {"error": self.code, "message": self.message}


class RuntimeStateError(KinboxError):
    """The runtime is not running (never started, stopped, or crashed)."""


class IdleTimeout(KinboxError):
    """``run_until_idle`` gave up; ``statistics`` is the runtime's state at that moment."""

    def __init__(self, timeout: float, statistics: dict[str, Any]) -> None:
        super().__init__(f"runtime still busy after {timeout:.1f}s: {statistics}")
        self.statistics = statistics


class ConfigError(KinboxError):
    """An argument given to the runtime is invalid."""
