"""What a turn is made of and how it ended: the messages a brain is handed and the outcome
its end hooks see (values only; the :class:`.turn.Turn` that holds them owns the rules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..persistence import ClaimedRow, TurnEntry
from .transcript_view import from_user, speaker


@dataclass(frozen=True)
class Message:
    """A message delivered to a turn."""

    message_id: str
    """The journal id (idempotency key) of the message."""
    kind: str
    """``agent_message``, ``subagent_result``, ..."""
    content: str
    """The text of the message."""
    sender_id: str | None
    """The sending session's id, or None for the runtime or an operator."""
    payload: dict[str, Any]
    """Structured extras of the message (JSON object)."""

    @classmethod
    def from_row(cls, row: ClaimedRow) -> Message:
        """Build the brain's view of a claimed inbox row."""
        return cls(row.message_id, row.kind, row.content, row.sender, dict(row.payload))

    @property
    def from_user(self) -> bool:
        """Did the user write it (not an agent, a scheduler or a notification)?"""
        return from_user(self.sender_id, self.kind)

    @property
    def speaker(self) -> str:
        """Who sent it, as ``agent_read`` shows it: ``user``, or e.g.
        ``agent_message from chat-1f2e`` / ``subagent_result from subagent-sub_0a1b``."""
        return speaker("user", self.sender_id, self.kind)

    def as_prompt(self) -> str:
        """The message as a line for a model's prompt: ``<speaker>: <content>``."""
        return f"{self.speaker}: {self.content}"

    def entry(self) -> TurnEntry:
        """The transcript entry that records this message (sender and kind kept)."""
        return TurnEntry("user", self.content, True, self.message_id, self.sender_id, self.kind)


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended, as seen by the hooks that add messages to its commit."""

    ok: bool
    """True when the brain returned; False when it raised."""
    error: str | None
    """The brain's exception as text, when it raised."""
    stopped_by: str | None
    """Who called ``agent_stop`` on the turn, if anyone (a session id or "operator")."""
