"""``--brain module:attribute``: what a name that does not import tells its user."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors.brain_ref import load_brain
from kinbox.actors.errors import BrainRefError

pytestmark = pytest.mark.timeout(30)


def test_a_module_not_found_names_the_folder_it_was_looked_for_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kinbox worker --brain myapp.agents:brain`` started from another folder than the
    one holding ``myapp/`` said only "no module named 'myapp'": it now names the folder
    kinbox looked in and says to start kinbox from the one that holds the module."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BrainRefError) as refused:
        load_brain("kinbox_no_such_app.agents:brain")
    assert refused.value.field == "brain"
    assert str(tmp_path) in refused.value.reason
    assert "start kinbox from" in refused.value.reason


def test_a_module_found_loads_its_brain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kinbox_ref_app.py").write_text("def brain(turn):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    assert callable(load_brain("kinbox_ref_app:brain"))
