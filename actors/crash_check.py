"""The crash checker: every delivery-guarantee violation the evidence of a run proves.

Pure: it takes what was read from the journal (rows, committed markers in
commit order), the turn log the brain wrote (which life started which
message) and what was acknowledged at each kill, and returns problems as
text plus the counts ``kinbox bench crash`` and the crash tests report. It
reads no database and starts no process, so the same rule judges a test run
and a benchmark run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

OPEN_STATES = frozenset({"pending", "processing"})
"""Row states that still owe a turn (a row left in one after the drain is stuck)."""


@dataclass(frozen=True)
class Evidence:
    """What a crash run left behind."""

    status: Mapping[str, str]
    """message id -> row state now."""
    seq: Mapping[str, int]
    """message id -> the row's journal order."""
    markers: Mapping[str, int]
    """message id -> committed delivery markers (committed turns)."""
    marker_order: Sequence[tuple[str, str]]
    """(session id, message id) of every marker, in commit order."""
    starts: Sequence[tuple[int, str]]
    """(life, message id) of every turn start the brain logged, in order."""
    delivered_before_kill: Sequence[frozenset[str]] = ()
    """The ids acknowledged when kill k (0-based) ended life k + 1."""


@dataclass
class Verdict:
    """The counts of one run and every violation found (``problems`` empty: all held)."""

    lost: int = 0
    duplicate_turns: int = 0
    reexecuted_turns: int = 0
    most_reexecuted_by_one_kill: int = 0
    stuck: int = 0
    ran_after_ack: int = 0
    out_of_order_targets: int = 0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        """The counts (no problem text), for JSON reports."""
        return {"lost": self.lost, "duplicate_turns": self.duplicate_turns,
                "reexecuted_turns": self.reexecuted_turns,
                "most_reexecuted_by_one_kill": self.most_reexecuted_by_one_kill,
                "stuck": self.stuck,
                "ran_after_ack": self.ran_after_ack,
                "out_of_order_targets": self.out_of_order_targets}


def parse_turn_log(lines: Iterable[str]) -> list[tuple[int, str]]:
    """``"LIFE MESSAGE_ID"`` lines (blank lines and a torn last line are skipped)."""
    found: list[tuple[int, str]] = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            found.append((int(parts[0]), parts[1]))
    return found


def judge(ev: Evidence, ids: Iterable[str]) -> Verdict:
    """Check the guarantees for the message ids the run enqueued."""
    v = Verdict()
    for mid in ids:
        state = ev.status.get(mid)
        turns = ev.markers.get(mid, 0)
        if state in OPEN_STATES:
            v.stuck += 1
            v.problems.append(f"{mid} stuck in {state}")
        elif state != "delivered":
            v.lost += 1
            v.problems.append(f"{mid} not delivered ({state})")
        elif turns == 0:
            v.lost += 1
            v.problems.append(f"{mid} acknowledged without a committed turn (lost)")
        if turns > 1:
            v.duplicate_turns += turns - 1
            v.problems.append(f"{mid} has {turns} committed turns")
    per_life: dict[int, set[str]] = {}
    lives_of: dict[str, list[int]] = {}
    for life, mid in ev.starts:
        per_life.setdefault(life, set()).add(mid)
        lives_of.setdefault(mid, []).append(life)
    v.reexecuted_turns = sum(len(x) - 1 for x in lives_of.values())
    # a turn started again is charged to the life its earlier start died in
    charged: dict[int, int] = {}
    for started_in in lives_of.values():
        for life in started_in[:-1]:
            charged[life] = charged.get(life, 0) + 1
    v.most_reexecuted_by_one_kill = max(charged.values(), default=0)
    lives = max(per_life, default=0)
    for k, acked in enumerate(ev.delivered_before_kill):
        # kill number k ended life k + 1; later lives must not run what it had acked
        for life in range(k + 2, lives + 1):
            for mid in sorted(acked & per_life.get(life, set())):
                v.ran_after_ack += 1
                v.problems.append(f"{mid} acknowledged before kill {k + 1} but ran in "
                                  f"life {life}")
    per_target: dict[str, list[int]] = {}
    for session_id, mid in ev.marker_order:
        if mid in ev.seq:
            per_target.setdefault(session_id, []).append(ev.seq[mid])
    for session_id, seqs in per_target.items():
        if seqs != sorted(seqs):
            v.out_of_order_targets += 1
            v.problems.append(f"turns of {session_id} committed out of order")
    return v
