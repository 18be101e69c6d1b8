"""The README's Python runs as printed.

Every ```python block runs, top to bottom, in one namespace, as a reader
pasting them into one interpreter would; the whole sequence runs twice in
the same directory (so twice on the same database files). A block followed
directly by an ```output block must print exactly that, where ``…`` stands
for any text within a line (ids, times).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kinbox.actors import Runtime

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.S | re.M)


def readme_blocks(text: str) -> list[tuple[int, str, str, str | None]]:
    """(line, language, body, expected output or None) of each fenced block."""
    found = [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), m.start(), m.end())
             for m in FENCE.finditer(text)]
    blocks: list[tuple[int, str, str, str | None]] = []
    for i, (line, lang, body, _, end) in enumerate(found):
        if lang == "output":
            continue
        expected = None
        if i + 1 < len(found) and found[i + 1][1] == "output" \
                and not text[end:found[i + 1][3]].strip():
            expected = found[i + 1][2]
        blocks.append((line, lang, body, expected))
    return blocks


def printed_as_documented(expected: str, actual: str) -> bool:
    """``actual`` equals ``expected`` line by line, ``…`` matching any text in a line."""
    want, got = expected.rstrip("\n").split("\n"), actual.rstrip("\n").split("\n")
    if len(want) != len(got):
        return False
    return all(re.fullmatch(".*?".join(re.escape(p) for p in w.split("…")), g)
               for w, g in zip(want, got, strict=True))


def test_the_output_matcher_can_fail() -> None:
    assert printed_as_documented("id msg-…, 2 rows", "id msg-1f2e, 2 rows")
    assert not printed_as_documented("id msg-…, 2 rows", "id msg-1f2e, 3 rows")
    assert not printed_as_documented("one\ntwo", "one")


PY_BLOCKS = [b for b in readme_blocks(README.read_text()) if b[1] == "python"]


def test_the_readme_has_python_blocks_with_documented_output() -> None:
    assert len(PY_BLOCKS) >= 6
    assert sum(1 for b in PY_BLOCKS if b[3] is not None) >= 5


@pytest.mark.timeout(120)
def test_every_python_block_runs_twice_on_one_database_and_prints_what_it_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KINBOX_HOME", str(tmp_path / "home"))
    # The blocks' own tempfile.mkdtemp() folders go here too, removed with tmp_path.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    for run in (1, 2):
        namespace: dict[str, object] = {"__name__": "__readme__"}
        try:
            for line, _, body, expected in PY_BLOCKS:
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(body, f"README.md:{line}", "exec"), namespace)
                if expected is not None:
                    assert printed_as_documented(expected, out.getvalue()), (
                        f"run {run}, README.md line {line} printed:\n{out.getvalue()}"
                        f"\nbut the README says:\n{expected}")
        finally:
            for value in namespace.values():
                if isinstance(value, Runtime) and value.state == "running":
                    value.stop()


@pytest.mark.timeout(120)
def test_the_crash_restart_report_and_diagram_are_what_the_command_prints(
        tmp_path: Path) -> None:
    """The README promises the same report for the same seed on a fresh database, and
    shows one: it must be the one ``kinbox scenario run crash_restart`` prints now, ids,
    participants and all, so a reader can diff their run against it."""
    blocks = readme_blocks(README.read_text())
    [report] = [b for _, lang, b, _ in blocks if lang == "text"
                and b.startswith("scenario crash_restart")]
    [diagram] = [b for _, lang, b, _ in blocks if lang == "mermaid"]
    result = subprocess.run(
        [sys.executable, "-m", "kinbox.actors", "scenario", "run", "crash_restart",
         "--diagram", str(tmp_path / "crash.md")], capture_output=True, text=True,
        timeout=100, cwd=tmp_path, env={**os.environ, "KINBOX_HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr
    assert result.stdout == report
    written = FENCE.search((tmp_path / "crash.md").read_text())
    assert written is not None and written.group(2) == diagram
