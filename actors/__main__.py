"""``python -m kinbox.actors``: the same as the ``kinbox`` command."""

import sys

from .cli import main

sys.exit(main())
