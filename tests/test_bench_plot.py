"""``kinbox bench --plot`` checks what it needs before it runs the benchmark (issue 11: 16)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

# matplotlib is installed here; the child hides it as an uninstalled package would be:
# an entry of None in sys.modules makes `import matplotlib` raise ModuleNotFoundError.
WITHOUT_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None
from kinbox.actors.cli import main
sys.exit(main(sys.argv[1:]))
"""


def bench(tmp_path: Path, *args: str, hide_matplotlib: bool = True
          ) -> tuple[int, str, str, float]:
    code = WITHOUT_MATPLOTLIB if hide_matplotlib else WITHOUT_MATPLOTLIB.replace(
        'sys.modules["matplotlib"] = None', "")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "bench", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - began


@pytest.mark.timeout(90)
def test_plot_without_matplotlib_fails_before_running_anything(tmp_path: Path) -> None:
    rc, out, err, took = bench(tmp_path, "throughput", "--quick", "--plot",
                               str(tmp_path / "x.png"))
    assert rc == 2
    assert "matplotlib" in err and "pip install" in err and "Traceback" not in err
    assert out == "" and took < 30  # the quick benchmark alone runs about a minute


@pytest.mark.timeout(90)
def test_plot_into_a_missing_folder_fails_before_running_anything(tmp_path: Path) -> None:
    rc, out, err, _ = bench(tmp_path, "throughput", "--quick", "--plot",
                            str(tmp_path / "nope" / "x.png"), hide_matplotlib=False)
    assert rc == 2 and "nope" in err and "Traceback" not in err and out == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["results.xyz", "results.PNG ", "a-folder"])
def test_a_plot_path_matplotlib_cannot_write_is_a_problem_before_running_anything(
        tmp_path: Path, name: str) -> None:
    """``--plot results.xyz`` (a format matplotlib has no writer for) or a folder passed
    the check, so the whole benchmark ran, minutes, and then ``savefig`` raised: a
    ValueError traceback (a folder: IsADirectoryError) and no report printed. Checked on
    :func:`plot_problem` itself: the command line would run the benchmark when it fails."""
    from kinbox.actors.bench import plot_problem

    (tmp_path / "a-folder").mkdir()
    problem = plot_problem(str(tmp_path / name))
    assert problem is not None and name.strip() in problem
    for fine in ("x.png", "x.SVG", "x.pdf", "x"):
        assert plot_problem(str(tmp_path / fine)) is None
