"""On PostgreSQL a send committed in one process wakes the dispatchers of the others at once
(NOTIFY in the enqueue's transaction, a LISTEN thread per delivering runtime); polling is
only the fallback, and the listener reconnects when its connection drops."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.actors.schedule_driver import POLL_SECONDS
from kinbox.persistence import NewMessage, open_database
from kinbox.persistence.inbox_notify import reconnect_delays

from .conftest import Stores
from .helpers import wait_for

pytestmark = pytest.mark.postgres
CHILD = Path(__file__).with_name("post_child.py")
NO_POLL = 60.0
"""A tick interval longer than the tests: only a notification can wake the dispatcher."""
NO_POLL_LEASE = 4 * NO_POLL
"""A lease long enough that the tick, at most a quarter of a lease apart, stays NO_POLL."""


class Seen:
    """A brain that notes when each message's turn started."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def __call__(self, turn: Turn) -> None:
        self.at[turn.messages[0].message_id] = time.monotonic()


def listener_stats(rt: Runtime) -> dict[str, int]:
    return rt.statistics().get("listener", {})


@pytest.mark.timeout(120)
def test_a_send_from_another_process_is_claimed_at_once_without_polling(
        pg_url: str, tmp_path: Path) -> None:
    seen = Seen()
    rt = Runtime(db=pg_url, brain=seen, tick_interval=NO_POLL, lease_seconds=NO_POLL_LEASE,
                 data_dir=str(tmp_path)).start()
    try:
        sid = rt.create_session(rt.create_project("n").id, "N").id
        wait_for(lambda: listener_stats(rt).get("connects") == 1, what="the listener")
        out = subprocess.run([sys.executable, str(CHILD), pg_url, sid, "wake up"],
                             capture_output=True, text=True, timeout=30, check=True)
        sent_at = time.monotonic()
        mid = out.stdout.strip()
        wait_for(lambda: mid in seen.at, timeout=NO_POLL / 2,
                 what="the turn of the other process's send")
        # Before any tick could claim it (a wall-clock second was the bound here: a loaded
        # machine takes longer, and the tick interval is what tells the two apart).
        assert seen.at[mid] - sent_at < NO_POLL / 2
        assert listener_stats(rt)["notifications"] >= 1
    finally:
        rt.stop()


@pytest.mark.timeout(120)
def test_the_listener_reconnects_after_its_connection_is_killed(
        pg_url: str, tmp_path: Path) -> None:
    seen = Seen()
    rt = Runtime(db=pg_url, brain=seen, tick_interval=NO_POLL, lease_seconds=NO_POLL_LEASE,
                 data_dir=str(tmp_path)).start()
    sender = Runtime(db=pg_url, data_dir=str(tmp_path)).start()  # another connection, no brain
    admin = open_database(pg_url)
    try:
        sid = rt.create_session(rt.create_project("r").id, "R").id
        wait_for(lambda: listener_stats(rt).get("connects") == 1, what="the listener")
        killed = admin.execute_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'kinbox-listener' AND datname = current_database()"
        ).fetchall()
        assert killed == [(True,)]
        wait_for(lambda: listener_stats(rt).get("connects") == 2, what="the reconnect")
        assert listener_stats(rt)["drops"] == 1
        mid = sender.post(sid, "still there?").message_id
        wait_for(lambda: mid in seen.at, timeout=NO_POLL / 2, what="the turn after the reconnect")
    finally:
        admin.close()
        sender.stop()
        rt.stop()


def test_reconnect_delays_double_up_to_their_maximum() -> None:
    delays = reconnect_delays(initial=0.05, maximum=1.0)
    assert [next(delays) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


class LaggingClock:
    """The system clock, read ``lag`` seconds behind (a process whose reading of the
    server's clock came back late)."""

    def __init__(self, lag: float) -> None:
        self.lag = lag

    def now(self) -> float:
        return time.time() - self.lag


@pytest.mark.timeout(120)
def test_a_send_stamped_ahead_of_this_clock_is_claimed_when_due_not_at_the_next_tick(
        pg_url: str, tmp_path: Path) -> None:
    # The sender's clock reads 0.3 s ahead of the receiver's: the claim the notification
    # wakes finds the row not yet due. It must come back for it then, not a tick later.
    lag = 0.3
    seen = Seen()
    rt = Runtime(db=pg_url, brain=seen, tick_interval=NO_POLL, lease_seconds=NO_POLL_LEASE,
                 clock=LaggingClock(lag),
                 data_dir=str(tmp_path)).start()
    sender = Runtime(db=pg_url, clock=LaggingClock(0.0), data_dir=str(tmp_path)).start()
    try:
        sid = rt.create_session(rt.create_project("s").id, "S").id
        wait_for(lambda: listener_stats(rt).get("connects") == 1, what="the listener")
        sent_at = time.monotonic()
        mid = sender.post(sid, "from a clock ahead").message_id
        wait_for(lambda: mid in seen.at, timeout=NO_POLL / 2,
                 what="the turn of the early-stamped send")
        assert lag * 0.9 <= seen.at[mid] - sent_at < NO_POLL / 2  # when due, not at a tick
        assert rt.statistics()["alarms"] >= 1
    finally:
        sender.stop()
        rt.stop()


@pytest.mark.timeout(120)
def test_a_row_an_operator_requeues_in_another_process_is_claimed_at_once(
        pg_url: str, tmp_path: Path) -> None:
    """Only sends notified: a failed row requeued from another process (``kinbox inbox
    requeue``, the HTTP API of a send-only ``kinbox serve``) waited for the workers'
    next poll. A requeue, a cancel and a hand-back notify as a send does."""
    seen = Seen()
    sender = Runtime(db=pg_url, data_dir=str(tmp_path)).start()  # no brain: sends only
    rt = None
    try:
        sid = sender.create_session(sender.create_project("q").id, "Q").id
        prepared = Stores(pg_url)
        try:
            j, now = prepared.journal, sender.context.now()
            j.enqueue(NewMessage("m-failed", sid, "again", max_attempts=1), now)
            assert [r.message_id for r in j.claim("gone", now).rows] == ["m-failed"]
            assert j.retry("gone", "m-failed", "boom", now).state.value == "failed"
        finally:
            prepared.close()
        rt = Runtime(db=pg_url, brain=seen, tick_interval=NO_POLL, lease_seconds=NO_POLL_LEASE,
                     data_dir=str(tmp_path)).start()
        wait_for(lambda: listener_stats(rt).get("connects") == 1, what="the listener")
        heard = listener_stats(rt)["notifications"]
        sender.requeue("m-failed")
        wait_for(lambda: "m-failed" in seen.at, timeout=NO_POLL / 2,
                 what="the requeued row's turn")
        assert listener_stats(rt)["notifications"] > heard
    finally:
        if rt is not None:
            rt.stop()
        sender.stop()


@pytest.mark.timeout(120)
def test_a_cron_job_triggered_in_another_process_runs_at_once_not_at_the_next_poll(
        pg_url: str, tmp_path: Path) -> None:
    """``kinbox serve`` (send-only) beside workers: "run now" from its API or CLI waited
    for a worker's next look at the job tables, up to 15 s; the trigger's transaction
    notifies the workers, as a send does."""
    started = threading.Event()
    worker = Runtime(db=pg_url, brain=lambda turn: started.set(),
                     data_dir=str(tmp_path / "w")).start()
    front = Runtime(db=pg_url, data_dir=str(tmp_path / "f")).start()  # send-only
    try:
        wait_for(lambda: listener_stats(worker).get("connects") == 1, what="the listener")
        job = front.cron.add("digest", "0 0 1 1 *", "write the digest")["job_id"]
        asked = time.monotonic()
        front.cron.trigger(job)
        assert started.wait(POLL_SECONDS - 5), "the run waited for the poll"
        assert time.monotonic() - asked < 2.0
        wait_for(lambda: [r["status"] for r in front.cron.runs(job)] == ["success"], 10,
                 what="the run's commit")
    finally:
        front.stop()
        worker.stop()
