"""Every scenario in scenarios/ runs to the end with all its expectations met."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kinbox.actors.cli_scenario import run_scenario

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.py"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_meets_its_expectations(path: Path, tmp_path: Path) -> None:
    report, _ = run_scenario(str(path), f"sqlite:///{tmp_path / 'sc.db'}", stream=io.StringIO())
    failed = [e for e in report["expectations"] if not e["ok"]]
    assert report["expectations"], "a scenario must check something"
    assert not failed, failed


def test_every_scenario_tells_its_story_in_a_docstring() -> None:
    import ast

    for path in SCENARIOS:
        assert ast.get_docstring(ast.parse(path.read_text())), path.name
