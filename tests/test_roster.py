"""The family roster and name resolution, and the token bucket: pure rules, table-driven."""

from __future__ import annotations

import pytest

from kinbox.actors import rate_limit
from kinbox.actors.roster import REACH_ERROR, Member, ResolveError, resolve, roster

#            root(w1)            root2(w1)     root3(w2)    loner
#           /    |    \             |
#        bob   alice  carl        dana
#         |
#       gus (grandchild)
TREE = [
    Member("root", "Root", None, "w1", "idle"),
    Member("root2", "Root Two", None, "w1", "active"),
    Member("root3", "Root Three", None, "w2", "idle"),
    Member("loner", "Loner", None, None, "idle"),
    Member("bob", "bob", "root", None, "active"),
    Member("alice", "alice", "root", None, "idle"),
    Member("carl", "carl", "root", None, "idle"),
    Member("dream", "dream", "root", None, "idle", hidden=True),
    Member("dana", "dana", "root2", None, "idle"),
    Member("gus", "gus", "bob", None, "idle"),
]
BY_ID = {m.id: m for m in TREE}


@pytest.mark.parametrize(("who", "expected"), [
    ("bob", [("parent", "root"), ("sibling", "alice"), ("sibling", "carl"), ("child", "gus")]),
    ("alice", [("parent", "root"), ("sibling", "bob"), ("sibling", "carl")]),
    ("root", [("sibling", "root2"), ("child", "alice"), ("child", "bob"), ("child", "carl")]),
    ("root3", []),
    ("loner", []),
    ("gus", [("parent", "bob")]),
    ("dana", [("parent", "root2")]),
])
def test_roster_is_parent_then_siblings_then_children_by_name(
        who: str, expected: list[tuple[str, str]]) -> None:
    entries = roster(BY_ID[who], TREE)
    assert [(e.relationship, e.id) for e in entries] == expected


def test_roster_lines_carry_relationship_name_id_and_status() -> None:
    entry = roster(BY_ID["alice"], TREE)[1]
    assert entry.to_dict() == {"relationship": "sibling", "name": "bob", "id": "bob",
                               "status": "active"}


@pytest.mark.parametrize(("who", "role", "name", "expected"), [
    ("bob", "parent", None, "root"),
    ("bob", "sibling", "alice", "alice"),
    ("bob", "sibling", "carl", "carl"),
    ("bob", "child", "gus", "gus"),
    ("root", "child", " alice ", "alice"),
    ("root", "sibling", "Root Two", "root2"),
])
def test_resolve_finds_exactly_one_member(who: str, role: str, name: str | None,
                                          expected: str) -> None:
    assert resolve(roster(BY_ID[who], TREE), role, name).id == expected


@pytest.mark.parametrize(("who", "role", "name", "fragment"), [
    ("bob", "parent", "root", "must be omitted for the parent"),
    ("root", "parent", None, "no parent"),
    ("bob", "sibling", None, "required for a sibling"),
    ("bob", "child", "  ", "required for a child"),
    ("bob", "child", "alice", "no child matches receiver_name 'alice'"),
    ("bob", "cousin", "x", "receiver_role must be"),
])
def test_resolve_explains_what_is_wrong(who: str, role: str, name: str | None,
                                        fragment: str) -> None:
    with pytest.raises(ResolveError, match=fragment):
        resolve(roster(BY_ID[who], TREE), role, name)


def test_several_matches_are_refused_naming_the_candidates() -> None:
    twins = [Member("p", "P", None, None, "idle"), Member("c1", "twin", "p", None, "idle"),
             Member("c2", "twin", "p", None, "idle")]
    with pytest.raises(ResolveError, match=r"2 children match receiver_name 'twin' \(c1, c2\)"):
        resolve(roster(twins[0], twins), "child", "twin")
    assert resolve(roster(twins[0], twins), "child", "c2").id == "c2"



def test_an_id_picks_its_session_even_when_another_is_titled_with_that_id() -> None:
    """The id is what an ambiguous name is told to use ("use the id to pick one"), so it
    must pick: a child titled with its sibling's id (a model naming a child after the
    one it follows up) made that id match two children, and the sibling it names could
    be reached by no name at all. A title equal to an id still designates its session
    when no session has that id."""
    kin = [Member("p", "P", None, None, "idle"), Member("c1", "report", "p", None, "idle"),
           Member("c2", "c1", "p", None, "idle"), Member("c3", "report", "p", None, "idle")]
    entries = roster(kin[0], kin)
    assert resolve(entries, "child", "c1").id == "c1"
    assert resolve(entries, "child", "c2").id == "c2"
    with pytest.raises(ResolveError, match=r"2 children match receiver_name 'report'"):
        resolve(entries, "child", "report")
    titled = [kin[0], Member("c9", "c7", "p", None, "idle")]
    assert resolve(roster(titled[0], titled), "child", "c7").id == "c9"

def test_a_name_matches_up_to_unicode_normalisation_and_no_further() -> None:
    """A title stored decomposed ("Cafe" + U+0301) and typed precomposed (U+00E9) is the
    one name list_agents shows; it designates the session (two such are ambiguous).
    Case still counts, and an id matches only exactly."""
    nfd, nfc = "Cafe\u0301", "Caf\u00e9"
    kin = [Member("p", "P", None, None, "idle"), Member("c1", nfd, "p", None, "idle"),
           Member("c2", "Tea", "p", None, "idle")]
    assert resolve(roster(kin[0], kin), "child", nfc).id == "c1"
    assert resolve(roster(kin[0], kin), "child", nfd).id == "c1"
    with pytest.raises(ResolveError, match="no child matches"):
        resolve(roster(kin[0], kin), "child", "tea")
    twins = [*kin, Member("c3", nfc, "p", None, "idle")]
    with pytest.raises(ResolveError, match=r"\(c1, c3\)"):
        resolve(roster(twins[0], twins), "child", nfc)


def test_the_reach_error_text_is_the_spec_text() -> None:
    assert REACH_ERROR == "Agent reach is limited to parent, siblings, and children"


def test_bucket_allows_three_then_one_per_second_and_refunds() -> None:
    b = None
    for _ in range(3):
        b, wait = rate_limit.take(b, 100.0)
        assert wait == 0
    b, wait = rate_limit.take(b, 100.0)
    assert wait == pytest.approx(1.0)
    b, wait = rate_limit.take(b, 100.5)
    assert wait == pytest.approx(0.5)
    b, wait = rate_limit.take(b, 101.0)
    assert wait == 0
    b = rate_limit.refund(b)
    b, wait = rate_limit.take(b, 101.0)
    assert wait == 0
    assert rate_limit.refill(b, 1000.0).tokens == 3.0
