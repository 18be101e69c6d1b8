"""``kinbox bench NAME``: measure kinbox beside the systems users would compare it with.

Prints a human table, or with ``--json`` one object::

    {"benchmark": NAME, "settings": {...}, "results": {SYSTEM: {...}}, "ratios": {...}}

Absolute numbers drift on shared machines; ratios measured in the same run
hold, which is why every system runs interleaved in one process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from ..persistence import SQLITE_PAGE_SIZE
from . import bench_stages, cpu_pinning
from .bench_systems import SYSTEMS
from .errors import ConfigError

OPTIONAL = ("kinbox_normal", "bare_py100", "bare_py200")
"""Run only when ``--systems`` names them: kinbox at ``synchronous=NORMAL`` is a variant of
kinbox, not a comparison system, and without it the quick run stays within 90 s and the
full one within 15 minutes; ``bare_py100``/``bare_py200`` are the bare pipeline with a brain
that runs 100/200 us of pure Python per turn (what a microsecond of Python per message
costs the rate)."""

BENCHMARKS = ("throughput", "recovery", "scale", "concurrency", "peers", "crash", "scaleout")


def versions() -> dict[str, str]:
    """Versions of everything that shapes the numbers."""
    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("kinbox", "pykka", "peewee", "huey", "persist-queue", "dbos"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def run(name: str, quick: bool, repeat: int, systems: list[str],
        options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one benchmark and return its JSON object (``options``: crash's sizes, or
    scaleout's ``db``)."""
    # Loaded here, not with the command line: they bring the runtime and the comparison
    # systems, which every other ``kinbox`` command would pay for at its start.
    from . import bench_concurrency, bench_crash, bench_peers, bench_runs, bench_scaleout

    if name == "scaleout":
        body = bench_scaleout.scaleout(quick, bench_scaleout.base_url((options or {}).get("db")),
                                       pin=bool((options or {}).get("pin")))
    elif name == "crash":
        body = bench_crash.crash(quick, **(options or {}))
    elif name == "throughput":
        body = bench_runs.throughput(quick, repeat, systems)
    elif name == "recovery":
        body = bench_runs.recovery(quick)
    elif name == "concurrency":
        body = bench_concurrency.concurrency(quick)
    elif name == "peers":
        body = bench_peers.peers(quick)
    else:
        body = bench_runs.scale(quick)
    body["settings"].update({
        "quick": quick, "versions": versions(), "cpus": os.cpu_count(),
        "machine": platform.machine(), "date": dt.datetime.now(dt.UTC).isoformat(),
        "sqlite_pragmas": {"journal_mode": "wal",
                           "page_size": f"{SQLITE_PAGE_SIZE} (kinbox; the others 4096)",
                           "synchronous": "FULL (kinbox_normal: NORMAL)",
                           "busy_timeout_ms": 10_000},
    })
    return {"benchmark": name, **body}


def table(report: dict[str, Any]) -> str:
    """The report as a human table."""
    rows = report["results"]
    columns = sorted({k for r in rows.values() for k in r if not k.startswith("_")
                      and not isinstance(r[k], list)})
    width = max(len(s) for s in rows) + 2
    out = [f"{report['benchmark']} ({'quick' if report['settings']['quick'] else 'full'}, "
           f"{report['settings']['cpus']} cpus)", ""]
    out.append("system".ljust(width) + "".join(c.rjust(22) for c in columns))
    for system, r in rows.items():
        out.append(system.ljust(width) + "".join(
            ("-" if r.get(c) is None else f"{r[c]:,}" if isinstance(r[c], int | float)
             else str(r[c])).rjust(22) for c in columns))
    if report["ratios"]:
        out.append("")
        out += [f"{k}: {v}" for k, v in report["ratios"].items()]
    if report.get("targets"):
        out.append("")
        out += [f"target {k} {t.get('op', '>=' if k.startswith('kinbox_vs') else '==')} "
                f"{t['target']}: "
                f"{t['measured']} ({'met' if t['met'] else 'NOT met'})"
                for k, t in report["targets"].items()]
    stages = report.get("stages_us_per_msg")
    if stages:
        out += ["", "CPU per message by stage (us; switches: voluntary context switches per "
                "message), the median run:",
                "stage".ljust(12) + "".join(name.rjust(14) for name in stages)]
        out += [stage.ljust(12) + "".join(f"{by[stage]:,}".rjust(14) for by in stages.values())
                for stage in (*bench_stages.STAGES, "switches")]
    bounded = report["settings"].get("bounded_by_message_count")
    if bounded:
        out.append("")
        out += [f"{name} ran {n:,} messages per run, not {report['settings']['messages']:,} "
                "(too slow for the full count; its rate is still a rate)"
                for name, n in bounded.items()]
    return "\n".join(out)


def plot(report: dict[str, Any], path: str) -> None:
    """Bars per system and the latency distribution, with matplotlib (bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {k: v for k, v in report["results"].items() if "msgs_per_s" in v}
    fig, (bars, dist) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars.bar(list(rows), [r["msgs_per_s"] for r in rows.values()], color="#4c72b0")
    bars.set_yscale("log")
    bars.set_ylabel("messages per second (log)")
    bars.set_title("throughput by system")
    bars.tick_params(axis="x", rotation=30)
    for name, r in rows.items():
        lat = sorted(r.get("_latencies") or [])
        if lat:
            dist.plot([x * 1000 for x in lat], [i / len(lat) for i in range(len(lat))],
                      label=name)
    dist.set_xscale("log")
    dist.set_xlabel("send -> turn latency (ms, log)")
    dist.set_ylabel("fraction of messages")
    dist.set_title("latency distribution")
    if dist.lines:
        dist.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_problem(path: str) -> str | None:
    """Why ``--plot path`` cannot work (matplotlib missing, no such folder, a folder, a
    format matplotlib has no writer for), or None: checked before the benchmark runs, as
    ``savefig`` raises only after it."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return "matplotlib is not installed; install the bench extra: pip install -e '.[bench]'"
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        return f"no folder {folder} to write the plot into"
    if Path(path).is_dir():
        return f"{path} is a folder; name the file to write the plot to (e.g. plot.png)"
    # savefig's rule: the format is the extension, lower-cased (none: PNG).
    suffix = Path(path).suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        return (f"matplotlib cannot write {Path(path).name!r} (format {suffix!r}); end the "
                f"name in one of: {', '.join(sorted(formats))}")
    return None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bench``."""
    p = sub.add_parser("bench", help="benchmarks against the comparison systems")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the results (needs matplotlib)")
    p.add_argument("--repeat", type=int, default=3, help="runs per system (median reported)")
    p.add_argument("--systems", default=None,
                   help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all;"
                        f" but {', '.join(OPTIONAL)})")
    p.add_argument("--kills", type=int, help="crash: SIGKILLs (default 200; quick 10)")
    p.add_argument("--messages", type=int, help="crash: messages (default 10000; quick 500)")
    p.add_argument("--db", help="scaleout: a PostgreSQL URL whose server gets one database "
                   "per system (default: $KINBOX_DB)")
    p.add_argument("--pin-workers", action="store_true",
                   help="scaleout: run each worker process of every system on a CPU of its "
                        "own, as kinbox --cpus N worker does")
    p.set_defaults(handler=handle)


def _missing_extra(exc: ImportError) -> int:
    print(f"kinbox: {exc.name} is missing; install the bench extra: "
          "pip install -e '.[bench]'", file=sys.stderr)
    return 1


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Run the benchmark and print it."""
    if args.systems is None:
        systems = [s for s in SYSTEMS if s not in OPTIONAL]
    else:
        systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"kinbox: --systems: unknown {', '.join(unknown)} (known: "
              f"{', '.join(SYSTEMS)})", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"kinbox: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    if args.plot:
        problem = plot_problem(args.plot)
        if problem:  # before the run, which can take minutes, not after it
            print(f"kinbox: --plot {args.plot}: {problem}", file=sys.stderr)
            return 2
    if (args.kills is not None or args.messages is not None) and args.name != "crash":
        print("kinbox: --kills and --messages apply to bench crash only", file=sys.stderr)
        return 2
    if (args.kills is not None and args.kills < 0) or (args.messages is not None
                                                       and args.messages < 1):
        print("kinbox: --kills must be >= 0 and --messages >= 1", file=sys.stderr)
        return 2
    if args.pin_workers:
        if args.name != "scaleout":
            print("kinbox: --pin-workers applies to bench scaleout only", file=sys.stderr)
            return 2
        try:
            cpu_pinning.allowed_cpus()
        except ConfigError as exc:
            print(f"kinbox: --pin-workers: {exc}", file=sys.stderr)
            return 2
    if args.name == "scaleout":
        from . import bench_scaleout
        from .bench_scaleout_systems import server_problem

        problem = bench_scaleout.url_problem(args.db)
        if problem is None:
            try:
                problem = server_problem(bench_scaleout.base_url(args.db))
            except ImportError as exc:
                return _missing_extra(exc)
        if problem:
            print(f"kinbox: bench scaleout: {problem}", file=sys.stderr)
            return 2
    if args.name == "throughput" and "kinbox" not in systems:
        systems.insert(0, "kinbox")
    try:
        report = run(args.name, args.quick, args.repeat, systems,
                     {"db": args.db, "pin": args.pin_workers} if args.name == "scaleout"
                     else {"kills": args.kills, "messages": args.messages})
    except ImportError as exc:
        return _missing_extra(exc)
    if args.plot:
        plot(report, args.plot)
    for r in report["results"].values():
        r.pop("_latencies", None)
    out.write((json.dumps(report, indent=2) if args.json else table(report)) + "\n")
    failed = [r for r in report["results"].values() if r.get("ok") is False]
    return 1 if failed else 0
