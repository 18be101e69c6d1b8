"""The README's shell examples name commands and flags that exist, and its concrete
command lines parse.

The README's Python runs as a test (tests/test_readme.py); its shell lines are read
here without running them: every ``kinbox ...`` line of a code block (a console fence
or an indented block) must name subcommands the parser has and flags the named
subcommand takes, and a line with nothing left to fill in (no ``[``, ``|`` or ``...``)
must parse as it is printed, so a renamed flag or a changed argument breaks this test
rather than a reader's first try. The brain module the README offers for a first
``kinbox worker`` is imported and run here too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.actors.cli import build_parser

pytestmark = pytest.mark.timeout(60)

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.S | re.M)
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:\S*/)?kinbox\s+(.*)$")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line in a fenced console/shell block or an indented
    block (four spaces after a blank line, outside fences)."""
    lines = text.split("\n")
    found: list[tuple[int, str]] = []
    fenced: str | None = None
    indented = False
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = None if fenced is not None else line[3:].strip()
            continue
        if fenced is not None:
            if fenced in ("console", "sh", "shell", "bash", ""):
                found.append((n, line))
            continue
        if line.startswith("    ") and (indented or not lines[n - 2].strip()):
            indented = True
            found.append((n, line))
        elif line.strip():
            indented = False
    return found


def kinbox_lines(text: str) -> list[tuple[int, str]]:
    """(line number, arguments after ``kinbox``) of each kinbox command in a code block:
    a trailing comment, ``&`` and anything after ``&&`` left out."""
    commands = []
    for n, line in code_lines(text):
        for part in line.split("&&"):
            m = COMMAND.match(part)
            if m is None:
                continue
            args = re.sub(r"\s#\s.*$", "", m.group(1)).strip()
            commands.append((n, args.removesuffix("&").strip()))
    return commands


INLINE = re.compile(r"(?<!`)`kinbox\s+([^`]+)`(?!`)")
PRINTED = {"serving http://127.0.0.1:8765/"}
"""Spans that quote what kinbox prints, not a command."""


def inline_commands(text: str) -> list[tuple[int, str]]:
    """(line number, arguments) of each ``kinbox ...`` code span in the prose (a span may
    wrap across lines)."""
    spans = [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
             for m in INLINE.finditer(text)]
    return [(n, args) for n, args in spans if args not in PRINTED]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def leaves(root: argparse.ArgumentParser, words: list[str]
           ) -> tuple[list[argparse.ArgumentParser], list[str]]:
    """The parsers a synopsis line names (``a|b`` names each) and the subcommand words
    that name none (for the error)."""
    current = [root]
    unknown: list[str] = []
    globals_with_value = {"--cpus", "--log-level"}
    i = 0
    while i < len(words):
        word = words[i].strip("[]")
        if word in globals_with_value:
            i += 2
            continue
        if word.startswith(("-", "<")) or not subparsers(current[0]):
            break
        choices = subparsers(current[0])
        names = word.split("|")
        unknown += [name for name in names if name not in choices]
        current = [choices[name] for name in names if name in choices] or current
        i += 1
    return current, unknown


def test_the_readme_shows_kinbox_commands() -> None:
    lines = kinbox_lines(README.read_text())
    assert len(lines) >= 30, lines  # the reader below reads the README's blocks at all
    assert any(args.startswith("serve") for _, args in lines)
    assert any(args.startswith("cron add") for _, args in lines)


def test_the_line_reader_finds_a_wrong_flag() -> None:
    # The check below can fail: a README line with a flag no command takes is caught.
    text = "Run it:\n\n    kinbox inbox list --colour\n\n```console\n$ kinbox nope\n```\n"
    lines = kinbox_lines(text)
    assert lines == [(3, "inbox list --colour"), (6, "nope")]
    assert problems(lines) == [(3, "inbox list", "--colour"), (6, "nope", "no such command")]


def problems(lines: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    root = build_parser()
    found = []
    for n, args in lines:
        words = args.split()
        parsers, unknown = leaves(root, words)
        name = " ".join(w for w in words[:3] if not w.startswith(("-", "[")))
        if unknown:
            found.append((n, name, "no such command"))
            continue
        known = set.intersection(*(options(p) for p in parsers)) | options(root)
        found += [(n, " ".join(parsers[0].prog.split()[1:]), flag)
                  for flag in FLAG.findall(args) if flag not in known]
    return found


def test_every_kinbox_line_names_commands_and_flags_that_exist() -> None:
    assert problems(kinbox_lines(README.read_text())) == []


def test_every_kinbox_command_in_the_prose_names_commands_and_flags_that_exist() -> None:
    spans = inline_commands(README.read_text())
    assert len(spans) >= 30
    assert problems(spans) == []


def concrete(args: str) -> bool:
    """A line printed as one would type it: nothing to choose or fill in."""
    return not any(mark in args for mark in ("[", "|", "...", "<", "--db URL"))


def test_every_concrete_kinbox_line_parses_as_printed() -> None:
    root = build_parser()
    failed = []
    lines = [(n, args) for n, args in kinbox_lines(README.read_text()) if concrete(args)]
    assert len(lines) >= 15
    for n, args in lines:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                root.parse_args(shlex.split(args))
        except SystemExit as exc:
            if exc.code != 0:  # --version prints and exits 0
                failed.append((n, args, err.getvalue().strip().splitlines()[-1:]))
    assert failed == []


def readme_brain_module() -> str:
    """The text block the README offers as ``myapp/agents.py``."""
    text = README.read_text()
    start = text.index("`myapp/agents.py`")
    block = FENCE.search(text, start)
    assert block is not None
    return block.group(2)


def test_the_readme_brain_module_loads_by_name_and_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text(readme_brain_module())
    monkeypatch.chdir(tmp_path)  # --brain imports with the current directory on the path
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("myapp", "myapp.agents"):  # another test's myapp, or this one's after it
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    from kinbox.actors.brain_ref import load_brain

    try:
        brain = load_brain("myapp.agents:brain")
        with Runtime(db=f"sqlite:///{tmp_path / 'app.db'}", brain=brain,
                     clock=ManualClock()) as rt:
            session = rt.create_session(rt.create_project("first").id, "Alice")
            rt.post(session.id, "hello")
            rt.run_until_idle(timeout=10)
            assert [e.text for e in rt.transcript(session.id)] == ["hello", "read: hello"]
    finally:
        for name in ("myapp.agents", "myapp"):
            sys.modules.pop(name, None)
