"""Finding and loading scenario files: a path, or a bundled scenario by name.

The bundled scenarios are the ``scenarios/`` folder of kinbox's source tree
(beside ``actors/``). An editable install (``pip install -e .``, as the
README's quick start does) and a clone have it; a wheel does not ship it,
since scenarios are examples to read and copy rather than library code. There
``kinbox scenario list`` and ``run NAME`` say so and ask for a file path.

A scenario of what a database holds once (the Focal agent, a device pairing) says so
with ``ONCE_PER_DATABASE = "focal"`` (or ``"pairing"``): a database where an earlier run
made that is refused before the script runs (:func:`once_per_database`).

A script that cannot be loaded (a syntax error, a failed import, no
``run(sc)``, an ``async`` or generator ``run``, a ``sys.exit()``) is a
:class:`ScenarioError` naming its file and line; so is an exception the script
raises while it runs (:func:`script_error`).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType

from ..persistence.models import Tables
from .access import FOCAL_ID
from .errors import ConfigError, ScenarioError

BUNDLED = Path(__file__).resolve().parent.parent / "scenarios"
"""Where the bundled scenarios are in a source tree."""


ONCE_PER_DATABASE: dict[str, tuple[str, Callable[[Tables], bool]]] = {
    "focal": ("the Focal agent's session",
              lambda t: t.session.select().where(t.session.id == FOCAL_ID).exists()),
    "pairing": ("a device pairing", lambda t: t.device.select().exists()),
}
"""What a once-per-database scenario may declare: what it is, and whether a database
(its tables) holds it already."""


def once_per_database(module: ModuleType, path: Path) -> str | None:
    """The scenario's ``ONCE_PER_DATABASE`` (None when it may share a database); an
    unknown value is a :class:`ScenarioError` naming the file."""
    once = getattr(module, "ONCE_PER_DATABASE", None)
    # isinstance first: a list or a dict (both kinds named) is unhashable, a TypeError.
    if once is not None and (not isinstance(once, str) or once not in ONCE_PER_DATABASE):
        raise ScenarioError(f"{path}: ONCE_PER_DATABASE must be one of "
                            f"{', '.join(map(repr, ONCE_PER_DATABASE))}, not {once!r}",
                            str(path))
    return once


def bundled() -> dict[str, Path]:
    """The bundled scenarios by name, or :class:`ConfigError` when there are none here."""
    if not BUNDLED.is_dir():
        raise ConfigError("this kinbox has no bundled scenarios: they live in the scenarios/ "
                          "folder of its source tree, which an installed package does not "
                          "include; clone the repository or give a scenario file's path",
                          field="scenario")
    return {p.stem: p for p in sorted(BUNDLED.glob("*.py")) if not p.stem.startswith("_")}


def summary(path: Path) -> str:
    """The first line of a scenario's docstring, read without running the file."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    except SyntaxError:
        return "(cannot be parsed)"
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return first.partition(": ")[2] or first  # docstrings start "name: what happens"


def resolve(spec: str) -> Path:
    """The scenario file ``spec`` names: an existing file, else a bundled scenario's name."""
    path = Path(spec)
    if path.is_file():
        return path
    if path.suffix == ".py" or len(path.parts) > 1:
        if path.is_dir():
            raise ConfigError(f"scenario file {spec!r} is a folder; give a scenario's .py "
                              "file", field="scenario")
        raise ConfigError(f"scenario file {spec!r} does not exist", field="scenario")
    known = bundled()
    if spec not in known:
        raise ConfigError(f"no scenario named {spec!r}; bundled: {', '.join(known)} "
                          "(or give a file's path)", field="scenario")
    return known[spec]


def load(path: Path) -> ModuleType:
    """Import a scenario file; it must define ``run(sc)``."""
    spec = importlib.util.spec_from_file_location(f"kinbox_scenario_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ScenarioError(f"{path}: cannot be loaded as a Python file", str(path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ScenarioError(f"{path}:{exc.lineno}: {type(exc).__name__}: {exc.msg}",
                            str(path), exc.lineno) from None
    except (Exception, SystemExit) as exc:  # sys.exit() at the top of the file too
        raise script_error(exc, path) from None
    run = getattr(module, "run", None)
    if not callable(run):
        raise ScenarioError(f"{path}: defines no run(sc) function", str(path))
    if inspect.iscoroutinefunction(run) or inspect.isgeneratorfunction(run) or \
            inspect.isasyncgenfunction(run):
        # Calling it only makes a coroutine or generator: its body would never run.
        raise ScenarioError(f"{path}: run(sc) must be a plain function (def run(sc): ...), "
                            "not async and without yield: the harness calls it once and "
                            "its body would never run", str(path))
    return module


def _in_script(tb: TracebackType | None, path: Path) -> TracebackType | None:
    """The first traceback entry inside the script (what the script's author wrote)."""
    target = path.resolve()
    while tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve() != target:
        tb = tb.tb_next
    return tb


def script_error(exc: BaseException, path: Path) -> ScenarioError:
    """The script's own error, at the innermost line of the script it passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    target = path.resolve()
    lines = [f.lineno for f in frames if Path(f.filename).resolve() == target]
    lineno = lines[-1] if lines else None
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    error = ScenarioError(f"{where}: {type(exc).__name__}: {exc}", str(path), lineno)
    error.__cause__ = exc
    return error


def script_frames(exc: BaseException, path: Path) -> list[dict[str, object]]:
    """The script's own frames of the traceback, outermost first (where, in what, which line)."""
    target = path.resolve()
    return [{"where": f"{path}:{f.lineno}", "function": f.name, "line": f.line or ""}
            for f in traceback.extract_tb(exc.__traceback__)
            if Path(f.filename).resolve() == target]


def script_traceback(exc: BaseException, path: Path) -> str:
    """The traceback from the script's first frame on (the harness's frames left out)."""
    tb = _in_script(exc.__traceback__, path) or exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb))
