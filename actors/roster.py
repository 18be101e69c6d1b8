"""The nuclear family of a session (F1, F2): who it may message, and how a name resolves.

Pure. The roster of a session is its parent, its siblings (sessions with
the same parent; roots are siblings only when they share a parent worker)
and its direct children, active or not, in roster order: parent, siblings
by name, children by name. Everyone else (grandchildren, cousins, strangers)
is out of reach; so is kin in another project, which the caller filters out
with :func:`.access.can_reach` before asking (the project boundary is S2's
rule, kept in one place).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .validation import quoted

ROLES = ("parent", "sibling", "child")
REACH_ERROR = "Agent reach is limited to parent, siblings, and children"


@dataclass(frozen=True)
class Member:
    """What the roster rules know of a session."""

    id: str
    name: str
    parent_id: str | None
    worker: str | None
    status: str
    hidden: bool = False


@dataclass(frozen=True)
class Entry:
    """One roster line."""

    relationship: str
    name: str
    id: str
    status: str

    def to_dict(self) -> dict[str, str]:
        """The line as ``list_agents`` returns it."""
        return {"relationship": self.relationship, "name": self.name, "id": self.id,
                "status": self.status}


def shares_a_worker(me: Member) -> bool:
    """Can a root other than its parent be on ``me``'s roster? Only when ``me`` is a root
    with a worker: roots that share one are siblings (:func:`_siblings`); the family read
    leaves the project's other roots out otherwise."""
    return me.parent_id is None and me.worker is not None


def _siblings(me: Member, other: Member) -> bool:
    if other.id == me.id:
        return False
    if me.parent_id is not None:
        return other.parent_id == me.parent_id
    return other.parent_id is None and shares_a_worker(me) and other.worker == me.worker


def designates(key: str, name: str, id_: str) -> bool:
    """Does ``key`` (a stripped ``receiver_name``) name the session ``name``/``id_``? The id
    exactly; the name up to Unicode normalisation (NFC): "Café" typed precomposed and
    stored decomposed look the same in ``list_agents``, and a model copying one cannot
    tell which it has, so an exact match said no sibling had the name it was shown."""
    return key == id_ or unicodedata.normalize("NFC", key) == unicodedata.normalize("NFC", name)


def named(entries: Sequence[Entry], key: str) -> list[Entry]:
    """The roster entries ``key`` (a stripped ``receiver_name``) designates, whatever
    their role, in roster order."""
    return [e for e in entries if designates(key, e.name, e.id)]


def roster(me: Member, family: Sequence[Member]) -> list[Entry]:
    """The sessions ``me`` may message, in roster order."""
    visible = [m for m in family if not m.hidden]
    by_name = sorted(visible, key=lambda m: (m.name, m.id))
    parent = [Entry("parent", m.name, m.id, m.status) for m in visible if m.id == me.parent_id]
    siblings = [Entry("sibling", m.name, m.id, m.status) for m in by_name if _siblings(me, m)]
    children = [Entry("child", m.name, m.id, m.status) for m in by_name if m.parent_id == me.id]
    return parent[:1] + siblings + children


class Unresolved(Enum):
    """Why a role and name designate no single roster member."""

    BAD_ROLE = "bad_role"
    NAME_FOR_PARENT = "name_for_parent"
    NO_PARENT = "no_parent"
    NAME_REQUIRED = "name_required"
    NO_MATCH = "no_match"
    AMBIGUOUS = "ambiguous"


class ResolveError(ValueError):
    """A role and name that do not name exactly one roster member; ``reason`` says why."""

    def __init__(self, reason: Unresolved, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def resolve(entries: Sequence[Entry], role: str, name: str | None) -> Entry:
    """The one roster entry ``role``/``name`` designates; :class:`ResolveError` otherwise."""
    if role not in ROLES:
        raise ResolveError(Unresolved.BAD_ROLE, "receiver_role must be 'parent', 'sibling' "
                           f"or 'child', got {quoted(role)}")
    if role == "parent":
        if name is not None:
            raise ResolveError(Unresolved.NAME_FOR_PARENT,
                               "receiver_name must be omitted for the parent")
        parents = [e for e in entries if e.relationship == "parent"]
        if not parents:
            raise ResolveError(Unresolved.NO_PARENT,
                               "this agent has no parent to message (it is a root, or its "
                               "parent is outside its project)")
        return parents[0]
    if name is None or not name.strip():
        raise ResolveError(Unresolved.NAME_REQUIRED, f"receiver_name is required for a {role}")
    key = name.strip()
    # An id picks its one session first: it is what an ambiguous name is told to use, and
    # a session titled with another's id would otherwise make that id match both.
    matches = ([e for e in entries if e.relationship == role and e.id == key]
               or [e for e in entries if e.relationship == role
                   and designates(key, e.name, e.id)])
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # Kin under another role is in reach: say what it is, not that nothing matched
        # (the caller would look for it farther off).
        other = named(entries, key)
        hint = f" ({quoted(key)} is your {other[0].relationship})" if other else ""
        raise ResolveError(Unresolved.NO_MATCH,
                           f"no {role} matches receiver_name {quoted(key)}{hint}")
    ids = ", ".join(e.id for e in matches)
    plural = "children" if role == "child" else f"{role}s"
    raise ResolveError(Unresolved.AMBIGUOUS, f"{len(matches)} {plural} match receiver_name "
                       f"{quoted(key)} ({ids}); use the id to pick one")
