"""The agent tools a Brain calls, bound to the calling session (SPEC §2).

The caller's identity comes from the runtime (``rt.tools_for(session_id)``
or ``turn.tools``), never from an argument. Each tool validates its
arguments, applies the pure access rules, and only then writes; a refusal
is a :class:`ToolError` and leaves nothing behind.
"""

from __future__ import annotations

from typing import Any

from ..persistence import NewMessage, SessionRecord
from . import access
from .context import RuntimeContext
from .errors import ToolError
from .validation import require_id, require_message

SEND_LIMIT = 20_000
"""Longest ``agent_send`` message, in characters (after stripping)."""

SELF_SEND = "Use a normal follow-up turn instead of sending to the current agent."


def unavailable(agent_id: str) -> ToolError:
    """The one answer for hidden, missing and other-project targets (S3)."""
    return ToolError("not_found", f"Agent '{agent_id}' is not available in the current project.")


def subject(s: SessionRecord) -> access.Subject:
    """The authorization view of a session record."""
    return access.Subject(s.id, s.project_id, s.kind, s.platform)


class AgentTools:
    """The agent tools as seen by one calling session."""

    def __init__(self, ctx: RuntimeContext, caller_id: str) -> None:
        self._ctx = ctx
        self.caller_id = caller_id

    def _caller(self) -> SessionRecord:
        self._ctx.require_running()
        caller = self._ctx.store.session(self.caller_id)
        if caller is None:
            raise ToolError("execution_failed",
                            f"The calling session '{self.caller_id}' does not exist; "
                            "tools must be bound to an existing session.")
        return caller

    def _target(self, caller: SessionRecord, agent_id: str, *, allow_self: bool) -> SessionRecord:
        target = self._ctx.store.session(agent_id)
        me = subject(caller)
        if not access.can_reach(me, subject(target) if target else None, allow_self=allow_self):
            raise unavailable(agent_id)
        assert target is not None
        return target

    def agent_send(self, agent_id: Any, message: Any) -> dict[str, Any]:
        """Queue ``message`` for ``agent_id``; returns once the inbox row is committed."""
        target_id = require_id("agent_id", agent_id)
        text = require_message(message, SEND_LIMIT)
        caller = self._caller()
        if target_id == caller.id:
            raise ToolError("invalid_argument", SELF_SEND)
        self._target(caller, target_id, allow_self=False)
        ctx = self._ctx
        result = ctx.journal.enqueue(
            NewMessage(f"msg-{ctx.new_id()}", target_id, text, sender=caller.id), ctx.now())
        ctx.emit("sent", message_id=result.message_id, sender=caller.id, target=target_id,
                 kind="agent_message")
        ctx.wake_dispatcher()
        return {"message_id": result.message_id, "agent_id": target_id, "status": result.status}
