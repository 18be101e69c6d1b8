"""The three benchmarks: throughput (with an open-loop run), recovery and scale."""

from __future__ import annotations

import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from .bench_systems import SYSTEMS, Recorder, Workload, bounded, fresh_dir, stamp
from .runtime import Runtime
from .turn import Turn


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of ``values``, or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


TARGETS = {"kinbox_vs_huey": 3.0, "kinbox_vs_naive": 4.0, "kinbox_vs_dbos": 10.0,
           "kinbox_vs_bare": 0.75}
"""The throughput targets of issue #12 (kinbox's rate over each system's, same run)."""


def throughput(quick: bool, repeat: int, systems: list[str]) -> dict[str, Any]:
    """Every system on the same workload, interleaved, ``repeat`` times; medians."""
    w = Workload(sessions=100, messages=10_000) if quick else Workload(1_000, 100_000)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    wall = dict.fromkeys(systems, 0.0)
    for _ in range(repeat):
        for name in systems:
            workdir = fresh_dir()
            began = time.perf_counter()
            run = bounded(name, w, quick)
            try:
                m = SYSTEMS[name](run, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                wall[name] += time.perf_counter() - began
            runs[name].append({"msgs_per_s": run.messages / m.elapsed,
                               "elapsed_s": m.elapsed, "messages": run.messages,
                               "order_violations": m.order_violations,
                               "p50_ms": _ms(percentile(m.latencies, 0.5)),
                               "p99_ms": _ms(percentile(m.latencies, 0.99)),
                               "latencies": m.latencies, "stages": m.extra.get("stages")})
    results: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    for name, rs in runs.items():
        median = sorted(rs, key=lambda r: r["msgs_per_s"])[len(rs) // 2]
        violations = [r["order_violations"] for r in rs]
        results[name] = {"msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in rs), 1),
                         "messages": median["messages"],
                         "order_violations": None if None in violations else max(violations),
                         "p50_ms": median["p50_ms"], "p99_ms": median["p99_ms"],
                         "runs_msgs_per_s": [round(r["msgs_per_s"], 1) for r in rs],
                         "runs_order_violations": violations,
                         "_latencies": median["latencies"]}
        if median["stages"] is not None:
            stages[name] = median["stages"]
    results["kinbox_open_loop"] = open_loop(rate=1000, seconds=3 if quick else 10)
    ratios = {f"kinbox_vs_{other.removeprefix('sqlite_')}":
              round(results["kinbox"]["msgs_per_s"] / results[other]["msgs_per_s"], 4)
              for other in ("sqlite_ceiling", "naive", "huey", "memory", "bare", "bare_rows",
                            "dbos")
              if other in results and "kinbox" in results}
    if "bare_rows" in results and "bare" in results:
        # kinbox_vs_bare = kinbox_vs_bare_rows x bare_rows_vs_bare: the runtime's code, and
        # the storage of kinbox's rows (:mod:`.bench_bare_rows`)
        ratios["bare_rows_vs_bare"] = round(
            results["bare_rows"]["msgs_per_s"] / results["bare"]["msgs_per_s"], 4)
    targets = {k: {"target": t, "measured": ratios[k], "met": ratios[k] >= t}
               for k, t in TARGETS.items() if k in ratios}
    if "kinbox" in results:
        violations = results["kinbox"]["order_violations"]
        targets["kinbox_order_violations"] = {"target": 0, "measured": violations,
                                              "met": violations == 0}
    cut = {name: results[name]["messages"] for name in runs
           if results[name]["messages"] != w.messages}
    return {"settings": {"sessions": w.sessions, "messages": w.messages,
                         "payload_bytes": w.payload, "producers": w.producers,
                         "repeat": repeat, "systems": systems,
                         "wall_s_per_system": {k: round(v, 1) for k, v in wall.items()},
                         "bounded_by_message_count": cut},
            "results": results, "ratios": ratios, "targets": targets,
            "stages_us_per_msg": stages}


def open_loop(rate: int, seconds: float) -> dict[str, Any]:
    """kinbox at a fixed offered rate: enqueue -> turn start latency."""
    starts: list[float] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        latency = time.perf_counter() - float(turn.messages[0].content.split("|", 1)[0])
        with lock:
            starts.append(latency)

    workdir = fresh_dir()
    rt = Runtime(db=f"sqlite:///{workdir / 'open.db'}", brain=brain).start()
    try:
        project = rt.create_project("open")
        ids = [f"o{i:04d}" for i in range(100)]
        rt.context.store.create_many([(s, project.id, s, "interactive") for s in ids],
                                     rt.clock.now())
        total = int(rate * seconds)
        pace = threading.Event()
        begin = time.perf_counter()
        for k in range(total):
            due = begin + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                pace.wait(delay)  # pacing the offered load, not waiting for a result
            rt.post(ids[k % len(ids)], stamp(100))
        rt.run_until_idle(120)
        return {"offered_msgs_per_s": rate, "messages": total,
                "p50_ms": _ms(percentile(starts, 0.5)), "p99_ms": _ms(percentile(starts, 0.99))}
    finally:
        rt.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def recovery(quick: bool) -> dict[str, Any]:
    """K unacknowledged messages, a SIGKILL, and a fresh runtime: how fast, how correct."""
    k, sessions = (10_000, 1_000) if quick else (100_000, 1_000)
    workdir = fresh_dir()
    url = f"sqlite:///{workdir / 'recovery.db'}"
    child = subprocess.Popen([sys.executable, "-m", "kinbox.actors.bench_child", url, str(k),
                              str(sessions)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "enqueued":
        child.kill()
        raise RuntimeError("the recovery child did not enqueue its messages")
    child.kill()
    child.wait()
    rec = Recorder(k)
    first: list[float] = []

    def brain(turn: Turn) -> None:
        if not first:
            first.append(time.perf_counter())
        rec.handled(f"{time.perf_counter()}|")

    begin = time.perf_counter()
    rt = Runtime(db=url, brain=brain).start()
    try:
        rec.done.wait(3600)
        all_done = time.perf_counter() - begin
        rt.run_until_idle(60)
        markers = rt.marker_counts()
        counts = rt.context.journal.counts()
    finally:
        rt.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"settings": {"messages": k, "sessions": sessions},
            "results": {"kinbox": {
                "first_redelivery_s": round(first[0] - begin, 3) if first else None,
                "all_delivered_s": round(all_done, 3),
                "msgs_per_s": round(k / all_done, 1),
                "lost": k - counts.get("delivered", 0),
                "duplicate_turns": sum(n - 1 for n in markers.values() if n > 1)}},
            "ratios": {}}


def scale(quick: bool) -> dict[str, Any]:
    """Many sessions, one message each, then 1,000 random wake-ups of passivated ones."""
    n = 10_000 if quick else 100_000
    peak = [threading.active_count()]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.005):
            peak[0] = max(peak[0], threading.active_count())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started: dict[str, threading.Event] = {}

    def brain(turn: Turn) -> None:
        flag = started.get(turn.messages[0].message_id)
        if flag is not None:
            flag.set()

    workdir = fresh_dir()
    rt = Runtime(db=f"sqlite:///{workdir / 'scale.db'}", brain=brain).start()
    try:
        project = rt.create_project("scale")
        ids = [f"c{i:06d}" for i in range(n)]
        rt.context.store.create_many([(s, project.id, s, "interactive") for s in ids],
                                     rt.clock.now())
        from ..persistence import NewMessage

        batch = [NewMessage(f"first-{s}", s, "hello") for s in ids]
        for first in range(0, n, 2000):
            rt.context.journal.enqueue_many(batch[first:first + 2000], rt.clock.now())
        t0 = time.perf_counter()
        rt.run_until_idle(3600)
        first_pass = time.perf_counter() - t0
        latencies = []
        for sid in random.Random(1).sample(ids, 1000):
            mid = f"wake-{sid}"
            started[mid] = threading.Event()
            t = time.perf_counter()
            rt.post(sid, "wake up", message_id=mid)
            started[mid].wait(30)
            latencies.append(time.perf_counter() - t)
        stats = rt.statistics()
    finally:
        rt.stop()
        sampling.set()
        shutil.rmtree(workdir, ignore_errors=True)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"settings": {"sessions": n, "wakeups": 1000},
            "results": {"kinbox": {
                "first_pass_msgs_per_s": round(n / first_pass, 1),
                "peak_threads": peak[0], "peak_live_actors": stats["peak_live"],
                "rss_mib": round(rss_mib, 1),
                "reactivation_p50_ms": _ms(percentile(latencies, 0.5)),
                "reactivation_p99_ms": _ms(percentile(latencies, 0.99))}},
            "ratios": {}}
