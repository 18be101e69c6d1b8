"""A runtime process that SIGKILLs itself at a named crash point (a test-only hook).

Usage: python crash_point_child.py DB_URL LOG_PATH LIFE [POINT:WHEN]
WHEN is ``first``, ``middle``, ``last`` or a hit number.

Nothing here is in production code: the hook wraps public :class:`Journal`
methods of a real :class:`Runtime` *by name*, in :data:`HOOKS` (one table,
so a rename on main is a one-line fix), and the brain is the Runtime's own
public surface. On the chosen hit the process kills itself with SIGKILL
right after the wrapped call returned, i.e. after its writer transaction
committed and before the caller heard of it (for a method that returns a
writer reply, in the reply's callback on the writer thread, right after
the commit).

The points (the turn's commit and its ack are one transaction in the
runtime, so "turn committed before the ack would have been" and "ack" are
the same instant, ``turn_committed``; :meth:`Journal.ack` itself is called
only by the deliberately broken variant):

``claim``          claim committed (a call that leased at least one row)
``turn_started``   inside the brain, after the turn's start was logged
``turn_marked``    a taken-over row's start recorded (``submit_turn_started``, answered)
``turn_committed`` turn, markers and ack committed (``submit_turn``, once its writer
                   reply is answered: on the writer thread, right after the commit)
``retry``          a failed attempt's retry scheduled (``submit_retry``, answered)
``renew``          leases renewed (``renew`` that extended at least one lease)
``peer_acked``     an outbound peer frame was sent and the receiver committed it: its
                   ack arrived, and the process dies *before* the sender commits the ack
                   (``PeerOutbox.submit_ack``)

The workload (:func:`kinbox.actors.crash_run.prepare` with 4 sessions and
24 messages) is known here: :data:`FLAKY` messages fail their first
attempt, :data:`SLOW` ones hold their turn until a lease renewal happened.
``middle`` is half the hits the workload is certain to make; ``last`` is
decided from the journal at the hit (no more hits of that point can follow).
The turn log gets ``LIFE MESSAGE_ID`` for every turn that goes on to commit.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kinbox.actors import Runtime, Turn
from kinbox.persistence import Journal
from kinbox.persistence.peer_outbox import PeerOutbox

SESSIONS, MESSAGES = 4, 24
FLAKY = frozenset({"m00002", "m00009", "m00015"})
"""Fail their first attempt (so ``retry`` has hits)."""
SLOW = frozenset({"m00005", "m00012", "m00019"})
"""Hold the turn until the dispatcher renewed its lease (so ``renew`` has hits)."""
LEASE_SECONDS = 0.6
BACKOFF_JUMP = 5.0
"""Seconds the injected clock jumps when only rows in backoff are left."""
CHAIN_LIMIT = 16

HOOKS: dict[str, tuple[type, str]] = {
    "claim": (Journal, "claim"),
    "turn_marked": (Journal, "submit_turn_started"),
    "turn_committed": (Journal, "submit_turn"),
    "retry": (Journal, "submit_retry"),
    "renew": (Journal, "renew"),
    "peer_acked": (PeerOutbox, "submit_ack"),
}
"""Crash point -> the public method it follows. The only place that names them."""
BEFORE = frozenset({"peer_acked"})
"""Points hit as the method is called (before its write), not after it returned."""
ANSWERED = frozenset({"turn_committed", "turn_marked", "retry"})
"""Points whose method returns a writer reply: hit once the reply is answered (committed)."""

MIDDLE = {"claim": 3, "turn_started": 12, "turn_committed": 12, "retry": 2, "renew": 2,
          "turn_marked": 1, "peer_acked": 2}
"""Half the hits the workload certainly makes (claims: one per target and per retry; peer
acks: the peer test sends more than two windows of frames, so three ack commits at least)."""


class OffsetClock:
    """The wall clock plus a jump, so rows in backoff come due without waiting."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


def _open(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] in ("pending", "processing")]


def _will_fail(row: dict[str, Any]) -> bool:
    return row["message_id"] in FLAKY and row["attempts"] == 0


def _is_hit(point: str, result: Any) -> bool:
    if point == "claim":
        return bool(result.rows)
    if point == "renew":
        return bool(result)
    return True


class CrashPoint:
    """Counts the hits of every point and kills the process on the chosen one."""

    def __init__(self, spec: str | None) -> None:
        self.point, self.when = spec.split(":") if spec else ("", "")
        if spec and self.point not in (*HOOKS, "turn_started"):
            raise SystemExit(f"unknown crash point {self.point!r}")
        self.hits: dict[str, int] = {}
        self.renewed = threading.Event()
        self.acks_asked: set[str] = set()
        """Every row a peer ack was asked for so far (``peer_acked`` hits)."""
        self.last_slow_running = False
        self.journal: Journal | None = None
        self.rt: Runtime | None = None

    def rows(self) -> list[dict[str, Any]]:
        """Every inbox row now (read through the journal the hooks saw, or the runtime)."""
        if self.journal is not None:
            return self.journal.rows()
        assert self.rt is not None
        return self.rt.inbox()

    def is_last(self, point: str, args: tuple[Any, ...], result: Any) -> bool:
        """No further hit of ``point`` can follow this one (read from the journal)."""
        left = _open(self.rows())
        if point == "turn_committed":
            return not left
        if point == "turn_started":
            return len(left) == 1 and not _will_fail(left[0])
        if point == "retry":
            return not any(_will_fail(r) for r in left)
        if point == "claim":
            target = result.rows[0].target
            return (all(r["target_chat_id"] == target for r in left)
                    and not any(_will_fail(r) for r in left) and len(left) <= CHAIN_LIMIT)
        if point == "renew":
            return self.last_slow_running
        if point == "peer_acked":
            # These acks settle every open row, with the earlier acks that may still wait
            # for their commit (submit_ack answers later: their rows can still read open).
            return {r["message_id"] for r in left} <= self.acks_asked
        return True  # turn_marked: one taken-over row per kill

    def hit(self, point: str, args: tuple[Any, ...] = (), result: Any = None) -> None:
        n = self.hits[point] = self.hits.get(point, 0) + 1
        if point == "peer_acked":
            self.acks_asked.update(args[1])
        if point != self.point:
            return
        w = self.when
        if (w == "first" and n == 1) or (w == "middle" and n == MIDDLE[point]) or (
                w.isdigit() and n == int(w)) or (w == "last" and self.is_last(point, args,
                                                                              result)):
            print(f"killed at {self.point}:{self.when} (hit {n})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        """Wrap every method of :data:`HOOKS` (hits are counted for all of them)."""
        for point, (cls, name) in HOOKS.items():
            setattr(cls, name, self._wrap(point, getattr(cls, name)))

    def _wrap(self, point: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapped(journal: Any, *args: Any, **kwargs: Any) -> Any:
            if point in BEFORE:
                self.hit(point, args)
                return original(journal, *args, **kwargs)
            self.journal = journal
            result = original(journal, *args, **kwargs)
            if point in ANSWERED:
                result.add_done_callback(lambda: self._answered(point, args, result))
            elif _is_hit(point, result):
                self.hit(point, args, result)
                if point == "renew":  # after the hit, so a slow turn's flags still hold
                    self.renewed.set()
            return result
        return wrapped

    def _answered(self, point: str, args: tuple[Any, ...], reply: Any) -> None:
        try:
            value = reply.outcome()
        except Exception:
            return  # refused (a lost lease): nothing committed, no hit
        self.hit(point, args, value)


def main() -> None:
    url, log_path, life, *spec = sys.argv[1:]
    crash = CrashPoint(spec[0] if spec else None)
    crash.install()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        row = turn.row
        mid = row.message_id
        if mid in FLAKY and row.attempts == 0:
            raise RuntimeError(f"{mid} fails its first attempt")
        if mid in SLOW:
            crash.renewed.clear()
            crash.last_slow_running = not any(
                r["message_id"] in SLOW for r in _open(crash.rows()) if r["message_id"] != mid)
        with lock:
            log.write(f"{life} {mid}\n")
        crash.hit("turn_started")
        if mid in SLOW and not crash.renewed.wait(10):
            raise RuntimeError(f"no lease renewal during the turn of {mid}")
        crash.last_slow_running = False
        turn.reply(f"processed {mid}")

    clock = OffsetClock()
    rt = Runtime(db=url, brain=brain, clock=clock, max_active_sessions=1,
                 lease_seconds=LEASE_SECONDS, tick_interval=0.05)
    crash.rt = rt
    # Before the start: its first turn may begin (and hit ``turn_started:first``) before
    # start() returns, and a child killed before it said "ready" fails the harness.
    print("ready", flush=True)
    with rt:
        deadline = time.monotonic() + 60
        pause = threading.Event()
        while time.monotonic() < deadline:
            rt.run_until_idle(timeout=60)  # the local rows
            left = _open(rt.inbox())
            if not left:
                break
            if any(r["transport"] == "local" for r in left):
                clock.offset += BACKOFF_JUMP  # only rows in backoff (or dead leases) are left
            else:
                pause.wait(0.01)  # peer rows: the link delivers them on its own thread
    print("done " + " ".join(f"{k}={v}" for k, v in sorted(crash.hits.items())), flush=True)


if __name__ == "__main__":
    main()
