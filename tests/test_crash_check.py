"""The pure crash checker on hand-made evidence: each violation is named and counted."""

from __future__ import annotations

from kinbox.actors.crash_check import Evidence, judge, parse_turn_log


def evidence(**changes: object) -> Evidence:
    base: dict[str, object] = {
        "status": {"a": "delivered", "b": "delivered"}, "seq": {"a": 1, "b": 2},
        "markers": {"a": 1, "b": 1}, "marker_order": [("s", "a"), ("s", "b")],
        "starts": [(1, "a"), (1, "b")], "delivered_before_kill": []}
    base.update(changes)
    return Evidence(**base)  # type: ignore[arg-type]


def test_a_clean_run_has_no_problems() -> None:
    v = judge(evidence(), ["a", "b"])
    assert v.problems == [] and v.as_dict()["lost"] == 0


def test_each_violation_is_counted() -> None:
    assert judge(evidence(markers={"a": 1}), ["a", "b"]).lost == 1
    assert judge(evidence(status={"a": "delivered", "b": "failed"}), ["a", "b"]).lost == 1
    assert judge(evidence(markers={"a": 2, "b": 1}), ["a", "b"]).duplicate_turns == 1
    assert judge(evidence(status={"a": "delivered", "b": "processing"}), ["a", "b"]).stuck == 1
    assert judge(evidence(marker_order=[("s", "b"), ("s", "a")]),
                 ["a", "b"]).out_of_order_targets == 1
    acked = judge(evidence(starts=[(1, "a"), (2, "a"), (2, "b")],
                           delivered_before_kill=[frozenset({"a"})]), ["a", "b"])
    assert acked.ran_after_ack == 1 and acked.reexecuted_turns == 1
    assert acked.most_reexecuted_by_one_kill == 1


def test_reexecutions_are_charged_to_the_life_that_died() -> None:
    v = judge(evidence(starts=[(1, "a"), (1, "b"), (2, "a"), (2, "b"), (3, "b")]),
              ["a", "b"])
    assert v.reexecuted_turns == 3 and v.most_reexecuted_by_one_kill == 2


def test_the_turn_log_parser_skips_a_torn_last_line() -> None:
    assert parse_turn_log(["1 m1", "", "2 m2", "3"]) == [(1, "m1"), (2, "m2")]
