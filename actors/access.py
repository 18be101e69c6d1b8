"""Who may see and address whom: the project boundary (S2) and hidden sessions (S3).

Pure rules over small records. Every refusal looks the same from outside:
a hidden, a nonexistent and an other-project target all produce the same
"not available" answer, so the tools never become an existence oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

HIDDEN_KINDS = frozenset({"dream", "subagent_wakeup"})
"""Kinds and platforms of internal sessions that are never listed or addressed."""

SESSION_KINDS = frozenset({"interactive", "subagent", "cron", "social", "remote", "focal"})
"""The kinds a visible session can have (S1)."""


@dataclass(frozen=True)
class Subject:
    """The facts about a session that authorization looks at."""

    id: str
    project_id: str | None
    kind: str
    platform: str | None = None


def is_hidden(s: Subject) -> bool:
    """Internal sessions: never listed, never addressable."""
    return s.kind in HIDDEN_KINDS or (s.platform or "") in HIDDEN_KINDS


def can_reach(caller: Subject, target: Subject | None, *, allow_self: bool) -> bool:
    """May ``caller`` read, message or stop ``target``?

    Same project only; a session without a project reaches only itself, and
    only where the tool allows self (``allow_self``). The Focal agent
    reaches every visible session of every project. ``None`` is a target
    that does not exist.
    """
    if target is None or is_hidden(target):
        return False
    if target.id == caller.id:
        return allow_self
    if caller.kind == "focal":
        return True  # the Focal agent sees every project (FO3, FO4)
    return caller.project_id is not None and caller.project_id == target.project_id


TOOLS_ALLOWING_SELF = frozenset({"agent_list", "agent_read"})
TOOLS_REFUSING_SELF = frozenset({"agent_send", "agent_stop"})


def decide(tool: str, caller: Subject, target: Subject | None) -> str:
    """The decision of one tool call: ``allow``, ``self_refused`` or ``unavailable``.

    Send and stop refuse the caller itself with their own message (a
    feedback loop is a usage mistake, not a secret); everything else that
    cannot be reached is ``unavailable``, whatever the reason.
    """
    if tool not in TOOLS_ALLOWING_SELF | TOOLS_REFUSING_SELF:
        raise ValueError(f"unknown tool {tool!r}")
    if tool in TOOLS_REFUSING_SELF and target is not None and target.id == caller.id:
        return "self_refused"
    return "allow" if can_reach(caller, target, allow_self=True) else "unavailable"
