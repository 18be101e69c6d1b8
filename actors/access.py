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
    only where the tool allows self (``allow_self``). ``None`` is a target
    that does not exist.
    """
    if target is None or is_hidden(target):
        return False
    if target.id == caller.id:
        return allow_self
    return caller.project_id is not None and caller.project_id == target.project_id


def can_list(caller: Subject, target: Subject) -> bool:
    """Is ``target`` in ``caller``'s ``agent_list``? (Same rule; self included.)"""
    return can_reach(caller, target, allow_self=True)
