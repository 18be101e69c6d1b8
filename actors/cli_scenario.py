"""``kinbox scenario run``: load a scenario file, run it, report what happened."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from .progress import Progress
from .scenario import Scenario
from .scenario_report import build_report, render_mermaid, render_text


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


def load_scenario(path: str) -> ModuleType:
    """Import a scenario file; it must define ``run(sc)``."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"scenario file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"kinbox_scenario_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load {path!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise UsageError(f"{path!r} defines no run(sc) function")
    return module


def run_scenario(path: str, db_url: str | None = None, seed: int = 0,
                 stream: TextIO | None = None) -> tuple[dict[str, Any], Scenario]:
    """Run one scenario file; return its report and the scenario object."""
    module = load_scenario(path)
    stream = stream or sys.stderr
    tmp = None
    if db_url is None:
        tmp = tempfile.mkdtemp(prefix="kinbox-scenario-")
        db_url = f"sqlite:///{tmp}/scenario.db"
    progress = Progress(stream)
    sc = Scenario(db_url, seed=seed, name=Path(path).stem, on_event=progress.event)
    try:
        module.run(sc)
    except Exception:
        sc.expect(False, "the scenario script ran to the end", traceback.format_exc(limit=3))
    finally:
        progress.close()
    report = build_report(sc)
    sc.stop()
    report["db"] = db_url if tmp is None else "(a temporary SQLite file, removed)"
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return report, sc


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``scenario run``."""
    p = sub.add_parser("scenario", help="run scenario scripts")
    ssub = p.add_subparsers(dest="action", required=True)
    r = ssub.add_parser("run", help="run a scenario file and print its report")
    r.add_argument("path", help="the scenario file (scenarios/hello.py)")
    r.add_argument("--db", help="database URL (default: a fresh SQLite file in a temp dir)")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument("--diagram", metavar="FILE.md", help="write a Mermaid sequence diagram")
    r.add_argument("--seed", type=int, default=0, help="seed for ids (same seed, same report)")
    r.set_defaults(handler=handle)


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Run the scenario; exit 0 when every expectation held, 1 otherwise."""
    try:
        report, _ = run_scenario(args.path, args.db, args.seed)
    except UsageError as exc:
        print(f"kinbox: {exc}", file=sys.stderr)
        return 2
    if args.diagram:
        Path(args.diagram).write_text(f"# {report['scenario']}\n\n{render_mermaid(report)}\n")
    if args.json:
        out.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    else:
        out.write(render_text(report) + "\n")
    return 0 if report["ok"] else 1
