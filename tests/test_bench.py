"""The benchmark harness on tiny workloads: every system runs and the JSON has its keys.

No test here asserts a speed: speed is what ``kinbox bench`` reports.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kinbox.actors import bench_runs, bench_systems
from kinbox.actors.bench import plot, table
from kinbox.actors.bench_bare import BarePipeline
from kinbox.actors.bench_bare_rows import SCHEMA, BareRowsPipeline
from kinbox.actors.bench_stages import STAGES
from kinbox.actors.bench_systems import SYSTEMS, Workload, bounded, fresh_dir
from kinbox.actors.bench_workload import Measured, Recorder, order_violations, stamp
from kinbox.actors.cli import main

from .helpers import wait_for

ORDERED = {"kinbox", "kinbox_normal", "memory", "bare", "bare_rows"}  # one turn a session at once


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_every_system_runs_the_workload_to_the_last_message(name: str) -> None:
    w = Workload(sessions=5, messages=60, producers=3)
    workdir = fresh_dir()
    measured = SYSTEMS[name](w, workdir)
    shutil.rmtree(workdir)
    assert measured.elapsed > 0
    if name != "sqlite_ceiling":
        assert len(measured.latencies) == 60
        assert isinstance(measured.order_violations, int)
        assert 0 <= measured.order_violations < 60
        assert min(measured.latencies) > 0
    if name in ORDERED:
        assert measured.order_violations == 0


def test_order_violations_counts_each_message_handled_after_a_later_one_of_its_stream() -> None:
    assert order_violations([]) == 0
    assert order_violations([("a", 1), ("a", 2), ("b", 1), ("a", 3)]) == 0
    assert order_violations([("a", 2), ("a", 1)]) == 1
    # 3 handled first: 1 and 2 are both late; streams do not interfere
    assert order_violations([("a", 3), ("b", 9), ("a", 1), ("a", 2), ("b", 10)]) == 2
    assert order_violations([("a", 1), ("a", 3), ("a", 2), ("a", 4)]) == 1
    assert order_violations([(("t0", "p1"), 5), (("t0", "p2"), 1), (("t0", "p1"), 4)]) == 1


def test_the_recorder_reads_target_producer_and_seq_from_the_body_and_counts_reordering() -> None:
    rec = Recorder(4)
    for seq in (33, 1, 65, 97):  # producer 1 to target 1, 33 handled before 1
        rec.handled(stamp(100, target=1, producer=1, seq=seq))
    assert rec.done.is_set()
    measured = rec.measured(1.0)
    assert measured.order_violations == 1 and len(measured.latencies) == 4
    assert len(stamp(100, 7, 3, 12345)) == 100


def test_slow_systems_are_bounded_by_message_count_only_beyond_their_limits() -> None:
    quick, full = Workload(100, 10_000), Workload(1_000, 100_000)
    assert bounded("dbos", Workload(5, 60), quick=True).messages == 60
    assert bounded("dbos", quick, quick=True) == Workload(100, 1_000)
    assert bounded("dbos", full, quick=False) == Workload(1_000, 5_000)
    for system in ("naive", "huey"):  # 5,000 of the quick workload; 40,000 of the full one
        assert bounded(system, quick, quick=True) == Workload(100, 5_000)
        assert bounded(system, full, quick=False) == Workload(1_000, 40_000)
    for system in ("kinbox", "bare", "bare_rows", "memory", "sqlite_ceiling"):
        assert bounded(system, full, quick=False) == full


@pytest.mark.timeout(60)
def test_the_bare_pipeline_commits_each_turn_with_its_marker_and_ack_and_rehydrates(
        tmp_path: Path) -> None:
    handled: list[tuple[int, str]] = []
    lock = threading.Lock()
    hold = threading.Event()

    def brain(target: int, body: str) -> str:
        if body.startswith("held"):
            hold.wait(30)
        with lock:
            handled.append((target, body))
        return "ok"

    pipe = BarePipeline(tmp_path / "bare.db", 2, brain, workers=4, chain=2).start()
    ids = [pipe.send(k % 2, f"m{k}") for k in range(10)]
    assert ids == list(range(1, 11))
    pipe.send(0, "held")
    db = sqlite3.connect(tmp_path / "bare.db")

    def acked() -> int:
        return db.execute("SELECT COUNT(*) FROM inbox WHERE acked = 1").fetchone()[0]

    wait_for(lambda: acked() == 10, what="ten acked turns")
    assert db.execute("SELECT COUNT(*) FROM markers").fetchone()[0] == 10
    assert db.execute("SELECT COUNT(*) FROM transcript").fetchone()[0] == 20
    assert [b for t, b in handled if t == 0] == [f"m{k}" for k in range(0, 10, 2)]
    hold.set()
    pipe.stop()
    db.execute("UPDATE inbox SET acked = 0 WHERE id = 11")  # the held turn: as if it crashed
    db.execute("DELETE FROM markers WHERE message_id = 11")
    db.commit()
    handled.clear()
    again = BarePipeline(tmp_path / "bare.db", 2, brain, workers=2).start()
    try:
        wait_for(lambda: acked() == 11, what="the rehydrated row acked")
        assert handled == [(0, "held")]
        assert again.send(1, "next") == 12
    finally:
        again.stop()


def _schema_of(path: Path, tables: set[str]) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return sorted(sql for (sql,) in db.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND tbl_name IN "
            f"({', '.join('?' * len(tables))})", sorted(tables)))
    finally:
        db.close()


@pytest.mark.timeout(60)
def test_bare_rows_creates_the_tables_and_indexes_kinbox_creates(tmp_path: Path) -> None:
    from kinbox.actors import Runtime

    Runtime(db=f"sqlite:///{tmp_path / 'kinbox.db'}", brain=lambda turn: None).start().stop()
    tables = {"agent_inbox_messages", "transcript_entries", "delivery_markers"}
    BareRowsPipeline(tmp_path / "rows.db", 1, lambda target, body: None).start().stop()
    kinbox = _schema_of(tmp_path / "kinbox.db", tables)
    assert len(kinbox) == len(SCHEMA) == 10  # 3 tables, 7 indexes: the variant has them all
    assert _schema_of(tmp_path / "rows.db", tables) == kinbox


@pytest.mark.timeout(60)
def test_bare_rows_writes_kinbox_rows_acks_them_fenced_and_rehydrates(tmp_path: Path) -> None:
    handled: list[tuple[int, str]] = []
    lock = threading.Lock()
    hold = threading.Event()

    def brain(target: int, body: str) -> None:
        if body.startswith("held"):
            hold.wait(30)
        with lock:
            handled.append((target, body))

    path = tmp_path / "rows.db"
    pipe = BareRowsPipeline(path, 2, brain, workers=4, chain=2).start()
    ids = [pipe.send(k % 2, f"m{k}") for k in range(10)]
    assert len(set(ids)) == 10 and ids == sorted(ids)  # time-ordered text ids, as kinbox's
    held = pipe.send(0, "held")
    db = sqlite3.connect(path)

    def delivered() -> int:
        return db.execute("SELECT COUNT(*) FROM agent_inbox_messages"
                          " WHERE status = 'delivered' AND lease_owner IS NULL").fetchone()[0]

    wait_for(lambda: delivered() == 10, what="ten acked turns")
    assert db.execute("SELECT COUNT(*) FROM delivery_markers").fetchone()[0] == 10
    # one entry a turn: the brain replied nothing, as kinbox's bench brain
    assert db.execute("SELECT session_id, role, text FROM transcript_entries"
                      " WHERE message_id = ?", (ids[1],)).fetchall() == [("s000001", "user", "m1")]
    assert db.execute("SELECT status, lease_owner IS NOT NULL FROM agent_inbox_messages"
                      " WHERE message_id = ?", (held,)).fetchone() == ("processing", 1)
    assert [b for t, b in handled if t == 0] == [f"m{k}" for k in range(0, 10, 2)]
    hold.set()
    pipe.stop()
    db.execute("UPDATE agent_inbox_messages SET status = 'processing', lease_owner = 'bare-rows'"
               " WHERE message_id = ?", (held,))  # the held turn: as if it crashed
    db.execute("DELETE FROM delivery_markers WHERE message_id = ?", (held,))
    db.execute("DELETE FROM transcript_entries WHERE message_id = ?", (held,))
    # a row leased by another owner is not acknowledged by this one: the ack is fenced
    db.execute("UPDATE agent_inbox_messages SET status = 'processing', lease_owner = 'other'"
               " WHERE message_id = ?", (ids[9],))
    db.commit()
    handled.clear()
    again = BareRowsPipeline(path, 2, brain, workers=2).start()
    try:
        wait_for(lambda: delivered() == 10 and len(handled) == 2, what="the rehydrated rows")
        assert sorted(handled) == [(0, "held"), (1, "m9")]
        assert db.execute("SELECT lease_owner FROM agent_inbox_messages WHERE message_id = ?",
                          (ids[9],)).fetchone() == ("other",)
        assert again.send(1, "next") > held
    finally:
        again.stop()


@pytest.mark.timeout(120)
def test_throughput_report_has_results_for_every_system_and_the_ratios(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bench_runs, "Workload", lambda *a, **k: Workload(4, 40, producers=2))
    monkeypatch.setattr(bench_runs, "open_loop", lambda rate, seconds: {"p50_ms": 1.0,
                                                                         "p99_ms": 2.0})
    # dbos runs for real above (a child process each, seconds apiece); here a stand-in that
    # handles what it is given, and the runner must give it only its bound.
    monkeypatch.setitem(bench_systems.MESSAGE_BOUNDS, "dbos", (20, 30))
    given: list[int] = []

    def dbos(w: Workload, workdir: Path) -> Measured:
        given.append(w.messages)
        return Measured(0.1, [0.001] * w.messages, {}, order_violations=3)
    monkeypatch.setitem(bench_runs.SYSTEMS, "dbos", dbos)
    report = bench_runs.throughput(True, 3, list(SYSTEMS))
    assert given == [20, 20, 20]
    assert set(report["results"]) == {*SYSTEMS, "kinbox_open_loop"}
    for name in SYSTEMS:
        r = report["results"][name]
        assert {"msgs_per_s", "p50_ms", "p99_ms", "runs_msgs_per_s"} <= set(r)
        assert len(r["runs_msgs_per_s"]) == 3
        assert isinstance(r["order_violations"], int) or name == "sqlite_ceiling"
        assert r["messages"] == (20 if name == "dbos" else 40)
    assert report["results"]["kinbox"]["order_violations"] == 0
    assert set(report["ratios"]) == {"kinbox_vs_ceiling", "kinbox_vs_naive", "kinbox_vs_huey",
                                     "kinbox_vs_memory", "kinbox_vs_bare", "kinbox_vs_bare_rows",
                                     "bare_rows_vs_bare", "kinbox_vs_dbos"}
    # the gap to bare split in two: the runtime's code, and the storage of kinbox's rows
    ratios = report["ratios"]
    assert ratios["kinbox_vs_bare_rows"] * ratios["bare_rows_vs_bare"] == pytest.approx(
        ratios["kinbox_vs_bare"], rel=1e-3)
    assert set(report["targets"]) == {"kinbox_vs_huey", "kinbox_vs_naive", "kinbox_vs_dbos",
                                      "kinbox_vs_bare", "kinbox_order_violations"}
    assert report["targets"]["kinbox_vs_dbos"]["target"] == 10.0
    assert report["targets"]["kinbox_order_violations"]["met"] is True
    full = {"benchmark": "throughput", **report}
    full["settings"].update({"quick": True, "cpus": 2})
    text = table(full)
    assert "kinbox_vs_huey" in text and "kinbox_vs_bare" in text and "order_violations" in text
    assert "target kinbox_vs_dbos >= 10.0" in text
    assert report["results"]["dbos"]["msgs_per_s"] == 200.0
    assert report["results"]["dbos"]["order_violations"] == 3
    assert report["settings"]["bounded_by_message_count"] == {"dbos": 20}
    assert "dbos ran 20 messages per run, not 40" in text
    # Where the microseconds go: kinbox and bare (each variant) measure their stages, the
    # comparison systems do not.
    assert set(report["stages_us_per_msg"]) == {"kinbox", "kinbox_normal", "bare",
                                                "bare_py100", "bare_py200", "bare_rows"}
    for by in report["stages_us_per_msg"].values():
        assert set(by) == {*STAGES, "switches"}
        assert by["turns"] > 0 and by["writer"] > 0 and by["producers"] > 0
        # Each figure is rounded to 0.1 us on its own, and a short run's user time can be
        # all but nil (the kernel splits a process's CPU by its ticks).
        assert by["process"] >= by["system"] - 0.1 and by["system"] >= 0
    assert "CPU per message by stage" in text and "\nwriter " in text
    plot(full, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 1000


@pytest.mark.timeout(120)
def test_open_loop_reports_latency_percentiles() -> None:
    result = bench_runs.open_loop(rate=200, seconds=0.25)
    assert result["messages"] == 50
    assert result["p50_ms"] is not None and result["p99_ms"] >= result["p50_ms"]


@pytest.mark.timeout(180)
def test_the_cli_prints_one_json_object_for_recovery() -> None:
    result = subprocess.run([sys.executable, "-m", "kinbox.actors", "bench", "recovery",
                             "--quick", "--json"], capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    assert data["benchmark"] == "recovery"
    kinbox = data["results"]["kinbox"]
    assert {"first_redelivery_s", "all_delivered_s", "lost", "duplicate_turns"} <= set(kinbox)
    assert kinbox["lost"] == 0 and kinbox["duplicate_turns"] == 0
    assert "versions" in data["settings"]


def test_unknown_systems_are_a_usage_error() -> None:
    from kinbox.actors.cli import main

    assert main(["bench", "throughput", "--systems", "kinbox,redis"]) == 2


@pytest.mark.timeout(120)
def test_peers_benchmark_reports_kinbox_beside_raw_websockets() -> None:
    from kinbox.actors import bench_peers

    report = bench_peers.peers(quick=True, window=16, messages=150)
    assert set(report["results"]) == {"raw_ws_one_way", "raw_ws_windowed_ack", "bare_durable",
                                      "kinbox_peers"}
    for r in report["results"].values():
        assert r["messages"] == 150 and r["msgs_per_s"] > 0
    assert report["results"]["kinbox_peers"]["p99_ms"] is not None
    assert report["results"]["bare_durable"]["p99_ms"] is not None
    assert set(report["ratios"]) == {"kinbox_vs_raw_windowed_ack", "kinbox_vs_raw_one_way",
                                     "kinbox_vs_bare_durable",
                                     "bare_durable_vs_raw_windowed_ack",
                                     "target_vs_raw_windowed_ack"}


@pytest.mark.timeout(60)
def test_the_bare_durable_link_stores_every_message_once_on_both_sides(tmp_path: Path) -> None:
    from kinbox.actors import bench_peers
    from kinbox.actors.bench_peer_bare import bare_durable

    result = bare_durable(300, 8, tmp_path, bench_peers._free_port(), bench_peers._wait_port)
    assert result["messages"] == 300 and len(result["latencies"]) == 300
    sender = sqlite3.connect(tmp_path / "bare-sender.db")
    receiver = sqlite3.connect(tmp_path / "bare-receiver.db")
    assert sender.execute("SELECT COUNT(*), SUM(acked) FROM outbox").fetchone() == (300, 300)
    ids = [r[0] for r in receiver.execute("SELECT id FROM inbox ORDER BY rowid")]
    assert ids == [f"msg-{i:08d}" for i in range(300)]  # once each, in send order


@pytest.mark.timeout(120)
def test_bench_crash_quick_kills_the_child_and_finds_every_guarantee_held() -> None:
    result = subprocess.run([sys.executable, "-m", "kinbox.actors", "bench", "crash", "--quick",
                             "--kills", "3", "--messages", "300", "--json"],
                            capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    r = data["results"]["kinbox"]
    assert data["benchmark"] == "crash" and data["settings"]["messages"] == 300
    assert r["kills"] == 3 and r["lives"] == 4
    assert (r["lost"], r["duplicate_turns"], r["stuck"], r["ran_after_ack"]) == (0, 0, 0, 0)
    assert r["ok"] is True and r["wall_s"] > 0


def test_bench_crash_sizes_are_checked_and_only_for_crash() -> None:
    from kinbox.actors.cli import main

    assert main(["bench", "crash", "--kills", "-1"]) == 2
    assert main(["bench", "throughput", "--kills", "5"]) == 2


@pytest.mark.timeout(120)
def test_concurrency_report_counts_every_turn_and_judges_the_targets() -> None:
    """A tiny run: every system delivers each message once, and the targets are judged from
    the measured values (the closed-loop ratio only at full size)."""
    from kinbox.actors.bench_concurrency import concurrency

    report = concurrency(True, wait=0.05, sessions=40, trivial_messages=200)
    results = report["results"]
    for name in ("kinbox_async", "kinbox_async_no_wait", "kinbox_sync_default_pool",
                 "kinbox_sync_40_threads", "gather"):
        assert results[name]["turns"] == 40 and results[name]["lost"] == 0, name
        assert results[name]["duplicate_turns"] == 0, name
    targets = report["targets"]
    assert "async_vs_trivial_closed_loop" not in targets  # quick: judged at full size only
    threads = targets["async_peak_threads"]
    assert threads["measured"] == results["kinbox_async"]["peak_threads"]
    assert threads["met"] == (threads["measured"] <= 32)
    assert targets["lost"] == {"target": 0, "op": "==", "measured": 0, "met": True}
    report["settings"].update(quick=True, cpus=2)  # as ``bench.run`` adds them
    assert "target async_peak_threads <= 32" in table({"benchmark": "concurrency", **report})


@pytest.mark.parametrize(("flags", "said"), [
    (["--systems", "kinbox,hue"], "--systems: unknown hue (known: "),
    (["--repeat", "0"], "--repeat must be >= 1, got 0"),
])
def test_a_bad_systems_or_repeat_flag_is_named_precisely(
        flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One sentence named both flags ("unknown systems [] or --repeat < 1"), whichever
    was wrong."""
    assert main(["bench", "throughput", "--quick", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and ("--repeat" in said) == ("--repeat" in err)
