"""``turn.history(limit)`` / ``await turn.ahistory(limit)``: the session's conversation
before the turn (its newest visible user and assistant entries, oldest first, as the
transcript stores them), on SQLite and PostgreSQL. A brain used to see only its turn's
messages: a chat's second turn knew nothing of its first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime, Turn
from kinbox.actors.running import StopFlag
from kinbox.actors.turn_history import HISTORY_MAX
from kinbox.persistence import TurnEntry

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., Runtime]


def test_a_turn_reads_the_newest_visible_entries_before_it_oldest_first(
    make_runtime: MakeRuntime, any_db_url: str, clock: ManualClock
) -> None:
    seen: list[tuple[list[tuple[str, str]], list[str]]] = []
    ids: dict[str, str] = {}

    def brain(turn: Turn) -> str:
        if turn.session_id != ids["chat"]:
            return "elsewhere"
        every = [(e.role, e.text) for e in turn.history()]
        seen.append((every, [e.text for e in turn.history(3)]))
        return f"answer {len(seen)}"

    rt = make_runtime(db=any_db_url, brain=brain)
    project = rt.create_project("p")
    session = ids["chat"] = rt.create_session(project.id, "Chat").id
    rt.post(rt.create_session(project.id, "Other").id, "not this session's")
    for n, question in enumerate(("q1", "q2", "q3"), start=1):
        rt.post(session, question)
        rt.run_until_idle(timeout=30)
        if n == 1:  # a social delivery's note: hidden, never history, never counted
            rt.context.store.append(
                session, [TurnEntry("delivery", "note", False, None)], clock.now()
            )
    assert seen[0] == ([], [])  # a fresh session has none
    assert seen[2] == (
        [("user", "q1"), ("assistant", "answer 1"), ("user", "q2"), ("assistant", "answer 2")],
        ["answer 1", "q2", "answer 2"],
    )


def test_a_failed_attempt_leaves_nothing_in_the_history_of_its_retry(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    histories: list[list[str]] = []

    def brain(turn: Turn) -> None:
        histories.append([e.text for e in turn.history()])
        turn.reply("half an answer")
        if len(histories) == 1:
            raise ConnectionError("model unreachable")

    rt = make_runtime(brain=brain)
    session = rt.create_session(rt.create_project("p").id, "Chat").id
    rt.post(session, "hello")
    rt.run_until_idle()
    clock.advance(2)
    rt.run_until_idle()
    assert histories == [[], []]
    rt.post(session, "again")
    rt.run_until_idle()
    assert histories[-1] == ["hello", "half an answer"]


@pytest.mark.parametrize("limit", [-1, HISTORY_MAX + 1, True, "20", 2.0, None])
def test_a_bad_limit_is_a_config_error_naming_it(limit: object) -> None:
    reads: list[int] = []
    turn = Turn(
        "s", [], lambda: None, StopFlag(), list, fetch_history=lambda n: reads.append(n) or []
    )
    with pytest.raises(ConfigError) as err:
        turn.history(limit)  # type: ignore[arg-type]
    assert err.value.field == "limit" and reads == []


def test_a_limit_of_zero_reads_nothing_and_the_largest_is_read_as_asked() -> None:
    reads: list[int] = []
    turn = Turn(
        "s", [], lambda: None, StopFlag(), list, fetch_history=lambda n: reads.append(n) or []
    )
    assert turn.history(0) == [] and reads == []
    turn.history(HISTORY_MAX)
    assert reads == [HISTORY_MAX]
