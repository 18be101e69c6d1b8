"""The access rules: a matrix over kinds and projects, and a Hypothesis oracle."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.actors.access import FOCAL_ID, HIDDEN_KINDS, SESSION_KINDS, Subject, decide

TOOLS = ("agent_list", "agent_read", "agent_send", "agent_stop")
KINDS = sorted(SESSION_KINDS | HIDDEN_KINDS)


@pytest.mark.parametrize(("caller_id", "caller_kind", "target_kind", "same_project", "tool"),
                         list(itertools.product(("caller", FOCAL_ID), KINDS, KINDS,
                                                (True, False), TOOLS)))
def test_matrix_of_kinds_projects_and_tools(caller_id: str, caller_kind: str, target_kind: str,
                                            same_project: bool, tool: str) -> None:
    caller = Subject(caller_id, "p1", caller_kind)
    target = Subject("target", "p1" if same_project else "p2", target_kind)
    # Only the Focal session (its fixed id and kind) crosses projects; the kind alone does not.
    reach = same_project or (caller_id == FOCAL_ID and caller_kind == "focal")
    expected = "allow" if reach and target_kind not in HIDDEN_KINDS else "unavailable"
    assert decide(tool, caller, target) == expected


@pytest.mark.parametrize("tool", TOOLS)
def test_hidden_missing_and_other_project_targets_get_the_same_answer(tool: str) -> None:
    assert decide(tool, Subject(FOCAL_ID, "hidden", "focal"),
                  Subject("x", "p9", "cron")) == "allow"
    assert decide(tool, Subject("f", "hidden", "focal"),
                  Subject("x", "p9", "cron")) == "unavailable"
    caller = Subject("me", "p1", "interactive")
    answers = {decide(tool, caller, t) for t in (
        None,
        Subject("dream", "p1", "dream"),
        Subject("wake", "p1", "interactive", platform="subagent_wakeup"),
        Subject("far", "p2", "interactive"),
    )}
    assert answers == {"unavailable"}


@pytest.mark.parametrize(("tool", "expected"), [
    ("agent_list", "allow"), ("agent_read", "allow"),
    ("agent_send", "self_refused"), ("agent_stop", "self_refused")])
def test_self_is_readable_but_not_a_send_or_stop_target(tool: str, expected: str) -> None:
    me = Subject("me", None, "interactive")
    assert decide(tool, me, me) == expected


def test_a_session_without_a_project_reaches_only_itself() -> None:
    loner = Subject("me", None, "cron")
    other = Subject("x", None, "cron")
    assert decide("agent_read", loner, other) == "unavailable"
    assert decide("agent_read", loner, loner) == "allow"


def test_unknown_tools_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown tool"):
        decide("agent_delete", Subject("a", None, "interactive"), None)


# -- the oracle -----------------------------------------------------------------------------

def oracle(tool: str, caller: dict[str, object], target: dict[str, object] | None) -> str:
    """An independent statement of S2/S3/T3/T4, written from the spec text."""
    if target is None:
        return "unavailable"
    if tool in ("agent_send", "agent_stop") and target["id"] == caller["id"]:
        return "self_refused"
    if target["kind"] in ("dream", "subagent_wakeup") or target["platform"] in (
            "dream", "subagent_wakeup"):
        return "unavailable"
    if target["id"] == caller["id"]:
        return "allow"
    if caller["id"] == "focal-suzent" and caller["kind"] == "focal":
        return "allow"  # FO1: one session, focal-suzent, of kind focal

    if caller["project"] is None:
        return "unavailable"
    return "allow" if caller["project"] == target["project"] else "unavailable"


session = st.fixed_dictionaries({
    "project": st.sampled_from([None, "p1", "p2", "p3"]),
    "kind": st.sampled_from(KINDS),
    "platform": st.sampled_from([None, None, "desktop", "dream", "subagent_wakeup", "focal"]),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(session, min_size=1, max_size=12), st.data())
def test_every_decision_matches_the_oracle_on_random_trees(sessions: list[dict[str, object]],
                                                           data: st.DataObject) -> None:
    focal_at = data.draw(st.integers(-1, len(sessions) - 1))  # which one has Focal's id, if any
    tree = [{**s, "id": FOCAL_ID if i == focal_at else f"s{i}"} for i, s in enumerate(sessions)]
    subjects = {s["id"]: Subject(str(s["id"]), s["project"], str(s["kind"]),  # type: ignore[arg-type]
                                 s["platform"]) for s in tree}  # type: ignore[arg-type]
    ghost = data.draw(st.booleans())
    for caller, tool in itertools.product(tree, TOOLS):
        targets: list[dict[str, object] | None] = [*tree, None] if ghost else list(tree)
        for target in targets:
            got = decide(tool, subjects[str(caller["id"])],
                         subjects[str(target["id"])] if target else None)
            assert got == oracle(tool, caller, target), (tool, caller, target)
