"""The benchmark harness on tiny workloads: every system runs and the JSON has its keys.

No test here asserts a speed: speed is what ``kinbox bench`` reports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kinbox.actors import bench_runs
from kinbox.actors.bench import plot, table
from kinbox.actors.bench_systems import SYSTEMS, Workload, fresh_dir


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


@pytest.mark.timeout(120)
def test_throughput_report_has_results_for_every_system_and_the_ratios(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bench_runs, "Workload", lambda *a, **k: Workload(4, 40, producers=2))
    monkeypatch.setattr(bench_runs, "open_loop", lambda rate, seconds: {"p50_ms": 1.0,
                                                                         "p99_ms": 2.0})
    report = bench_runs.throughput(True, 3, list(SYSTEMS))
    assert set(report["results"]) == {*SYSTEMS, "kinbox_open_loop"}
    for name in SYSTEMS:
        r = report["results"][name]
        assert {"msgs_per_s", "p50_ms", "p99_ms", "runs_msgs_per_s"} <= set(r)
        assert len(r["runs_msgs_per_s"]) == 3
    assert set(report["ratios"]) == {"kinbox_vs_ceiling", "kinbox_vs_naive", "kinbox_vs_huey",
                                     "kinbox_vs_memory"}
    full = {"benchmark": "throughput", **report}
    full["settings"].update({"quick": True, "cpus": 2})
    assert "kinbox_vs_huey" in table(full)
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
    assert set(report["results"]) == {"raw_ws_one_way", "raw_ws_windowed_ack", "kinbox_peers"}
    for r in report["results"].values():
        assert r["messages"] == 150 and r["msgs_per_s"] > 0
    assert report["results"]["kinbox_peers"]["p99_ms"] is not None
    assert set(report["ratios"]) == {"kinbox_vs_raw_windowed_ack", "kinbox_vs_raw_one_way",
                                     "target_vs_raw_windowed_ack"}


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
