"""The crash child on a deliberately broken journal (``broken_journals.py``).

Usage: python broken_child.py FAULT DB_URL LOG_PATH LIFE

Puts the broken journal in place of the runtime's own, then runs the package's
crash child unchanged: the crash checker must catch what the variant breaks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kinbox.actors.runtime as runtime_module
from kinbox.actors import crash_child

sys.path.insert(0, str(Path(__file__).parent))
from broken_journals import BROKEN  # a sibling file of this script


def main() -> None:
    fault = sys.argv.pop(1)
    runtime_module.Journal = BROKEN[fault]  # type: ignore[misc]
    crash_child.main()


if __name__ == "__main__":
    main()
