"""The rules of tasks (K1): statuses, what ``blocked`` needs, and what an update means.

Pure. A session "closes" when its last open task becomes ``completed`` or
``cancelled``; a task "blocks" when it becomes ``blocked`` on ``user`` or
``error``, or its reason changes while blocked. The Focal agent listens for
both (FO5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ToolError
from .validation import quoted, require_str

TASK_STATUSES = ("pending", "in_progress", "blocked", "completed", "cancelled")
OPEN_STATUSES = frozenset({"pending", "in_progress", "blocked"})
BLOCKED_ON = ("user", "error")
REASON_LIMIT = 2_000
"""Characters in a task's reason (it travels in Focal's notifications)."""


@dataclass(frozen=True)
class TaskView:
    """The task fields the rules look at."""

    status: str
    blocked_on: str | None
    reason: str | None


def check_update(current: TaskView, status: Any, blocked_on: Any,
                 reason: Any) -> dict[str, Any]:
    """Validate an update and return the column changes; raise :class:`ToolError` if wrong."""
    if status is None and blocked_on is None and reason is None:
        raise ToolError("invalid_argument",
                        "give at least one of status, blocked_on or reason to change.")
    if status is not None and status not in TASK_STATUSES:
        raise ToolError("invalid_argument",
                        f"status must be one of {', '.join(TASK_STATUSES)}, got {quoted(status)}.")
    if reason is not None:
        require_str("reason", reason)
        if len(reason.strip()) > REASON_LIMIT:
            raise ToolError("invalid_argument", f"reason is {len(reason.strip()):,} characters; "
                            f"the limit is {REASON_LIMIT:,}.")
    new_status = status or current.status
    changes: dict[str, Any] = {"status": new_status}
    if new_status == "blocked":
        on = blocked_on if blocked_on is not None else current.blocked_on
        if on not in BLOCKED_ON:
            raise ToolError("invalid_argument",
                            "a blocked task needs blocked_on='user' or blocked_on='error'.")
        changes["blocked_on"] = on
    elif blocked_on is not None:
        raise ToolError("invalid_argument", "blocked_on is only for status='blocked'.")
    else:
        changes["blocked_on"] = None
    if reason is not None:
        changes["reason"] = reason.strip() or None
    return changes


def became_blocked(before: TaskView | None, after: TaskView) -> bool:
    """Blocked on user/error now, and newly so or with a changed reason."""
    if after.status != "blocked" or after.blocked_on not in BLOCKED_ON:
        return False
    if before is None or before.status != "blocked" or before.blocked_on != after.blocked_on:
        return True
    return before.reason != after.reason


def closes_session(before: TaskView | None, after: TaskView, open_left: int) -> bool:
    """This change finished the session's last open task."""
    was_open = before is None or before.status in OPEN_STATUSES
    return was_open and after.status not in OPEN_STATUSES and open_left == 0
