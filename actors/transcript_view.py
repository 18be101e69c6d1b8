"""What ``agent_read`` shows of a transcript (T2). Pure.

Only visible user and assistant text; never reasoning, tool output or
markers. The newest messages are kept within the character budget; a first
line says how many older ones were left out; a single newest message that
alone exceeds the budget keeps its tail behind a truncation marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .errors import ConfigError

READ_LIMIT = 20_000
SHOWN_ROLES = frozenset({"user", "assistant"})
TRUNCATED = "[... message truncated ...]"
MIN_READ_LIMIT = len(TRUNCATED) + 2
"""The smallest limit a read keeps within: the truncation marker, its line break and one
character of the newest message's tail."""


USER_KINDS = frozenset({None, "agent_message"})
"""Kinds of a message without a sender that come from the user."""
USER_SENDERS = frozenset({None, "user"})
"""Senders that mean the user: none (``rt.post`` from a product), or ``"user"`` spelled
out (``rt.post(..., sender="user")``)."""


@dataclass(frozen=True)
class Line:
    """A transcript entry as the view sees it."""

    role: str
    text: str
    visible: bool
    sender_id: str | None = None
    kind: str | None = None


class Shown(Protocol):
    """What :func:`shown` reads of an entry (a :class:`Line`, a stored entry record)."""

    @property
    def role(self) -> str: ...

    @property
    def visible(self) -> bool: ...


E = TypeVar("E", bound=Shown)


def shown(entries: Iterable[E]) -> list[E]:
    """The entries a model may see (its read of a transcript, a turn's history): user and
    assistant text, visible."""
    return [e for e in entries if e.visible and e.role in SHOWN_ROLES]


def from_user(sender_id: str | None, kind: str | None) -> bool:
    """Did the user write this message (a user's sender and kind)?"""
    return sender_id in USER_SENDERS and kind in USER_KINDS


def speaker(role: str, sender_id: str | None, kind: str | None) -> str:
    """Who said it, in a form a model can use: ``user``, ``assistant``, or the kind of an
    agent's message and its sender (``agent_message from chat-1f2e``,
    ``subagent_result from subagent-sub_0a1b``)."""
    if role != "user" or from_user(sender_id, kind):
        return role
    return f"{kind or 'message'} from {sender_id}" if sender_id else f"{kind}"


def omitted_line(n: int) -> str:
    """The first line when ``n`` older messages are left out."""
    return f"[... {n} earlier messages omitted ...]"


def block(e: Line) -> str:
    """One message as a read shows it: who said it, then its text."""
    return f"{speaker(e.role, e.sender_id, e.kind)}: {e.text}"


def render(entries: Sequence[Line], limit: int = READ_LIMIT, older: int = 0) -> str:
    """The readable transcript, newest messages kept within ``limit`` characters (the
    omitted-messages line apart); ``older`` shown messages came before ``entries`` and
    are counted as omitted. :class:`ConfigError` for a limit below
    :data:`MIN_READ_LIMIT`, which could not hold an over-long message's marker."""
    if limit < MIN_READ_LIMIT:
        raise ConfigError(f"a read's limit must be at least {MIN_READ_LIMIT} characters "
                          f"(the truncation marker and some of the message), not {limit}",
                          field="limit")
    blocks = [block(e) for e in shown(entries)]
    kept: list[str] = []
    used = 0
    for one in reversed(blocks):
        cost = len(one) + (2 if kept else 0)
        if used + cost > limit:
            break
        kept.append(one)
        used += cost
    kept.reverse()
    omitted = older + len(blocks) - len(kept)
    if not kept and blocks:
        newest = blocks[-1]
        tail = newest[-(limit - len(TRUNCATED) - 1):]
        kept = [f"{TRUNCATED}\n{tail}"]
        omitted = older + len(blocks) - 1
    if omitted:
        return "\n\n".join([omitted_line(omitted), *kept])
    return "\n\n".join(kept)
