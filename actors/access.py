"""Who may see and address whom: the project boundary (S2), hidden sessions (S3), and Focal.

Pure rules over small records. Every refusal looks the same from outside:
a hidden, a nonexistent and an other-project target all produce the same
"not available" answer, so the tools never become an existence oracle.

Who counts as the Focal agent, the one session that reaches every project
(FO1), is decided here and only here (:func:`is_focal`): the session with the
fixed id ``focal-suzent`` and kind ``focal``. Both facts are written only by
the runtime, which creates that session itself; :func:`focal_claim` names
what a product's new session would use to pass as Focal, so that
``create_session`` can refuse it. Config flags and platforms are hints for
products' interfaces, never an identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

HIDDEN_KINDS = frozenset({"dream", "subagent_wakeup"})
"""Kinds and platforms of internal sessions that are never listed or addressed."""

SESSION_KINDS = frozenset({"interactive", "subagent", "cron", "social", "remote", "focal"})
"""The kinds a visible session can have (S1)."""


FOCAL_ID = "focal-suzent"
"""The fixed id of the one Focal session (FO1)."""

FOCAL_KIND = "focal"
FOCAL_CONFIG_MARKERS = ("is_focal_agent",)
"""Config keys that earlier products used to mark a Focal chat (refused on new sessions)."""


class Identity(Protocol):
    """What :func:`is_focal` looks at: a :class:`Subject` or a session record."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...


def is_focal(s: Identity) -> bool:
    """Is this the Focal session? Its fixed id and kind, nothing a product can set."""
    return s.id == FOCAL_ID and s.kind == FOCAL_KIND


def focal_claim(session_id: str | None, kind: str, platform: str | None,
                config: Mapping[str, Any] | None) -> str | None:
    """The argument by which a new session would pose as Focal, or None.

    Only the runtime creates the Focal session; a product's session that
    takes its id, its kind, its platform or a Focal config marker is refused
    rather than silently being, or looking like, a second Focal.
    """
    if session_id == FOCAL_ID:
        return "session_id"
    if kind == FOCAL_KIND:
        return "kind"
    if platform == FOCAL_KIND:
        return "platform"
    cfg = config or {}
    if any(cfg.get(k) for k in FOCAL_CONFIG_MARKERS) or cfg.get("platform") == FOCAL_KIND:
        return "config"
    return None


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
    if is_focal(caller):
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
