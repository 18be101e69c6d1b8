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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_same_seed_gives_the_same_report(path: Path, tmp_path: Path) -> None:
    reports = []
    for run in range(2):
        report, _ = run_scenario(str(path), f"sqlite:///{tmp_path / f'sc{run}.db'}", seed=5,
                                 stream=io.StringIO())
        reports.append(report)
    assert reports[0]["timeline"] == reports[1]["timeline"]
    assert reports[0]["messages"] == reports[1]["messages"]
