"""``--brain module:attribute``: a product's brain, imported by name, as uvicorn takes an app.

The module is imported with the current directory on ``sys.path`` (as
uvicorn does), the attribute is looked up through dots, and whatever is
found must be callable. Every way this can go wrong is a
:class:`BrainRefError` naming the spec and the reason; an error raised
while the module itself imports keeps its traceback as the cause.
"""

from __future__ import annotations

import importlib
import os
import sys

from .errors import BrainRefError
from .turn import Brain


def load_brain(spec: str) -> Brain:
    """The callable ``spec`` (``package.module:attribute``) names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BrainRefError(spec, "expected module:attribute, e.g. myapp.agents:brain")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise BrainRefError(spec, f"no module named {exc.name!r} in the current "
                                f"directory ({cwd}) nor among the installed packages; "
                                "start kinbox from the folder that holds it") from exc
        raise BrainRefError(spec, f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise BrainRefError(spec, f"importing {module_name!r} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    found: object = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise BrainRefError(spec, f"module {module_name!r} has no attribute {attr!r}") \
                from None
    if not callable(found):
        raise BrainRefError(spec, f"{attr!r} is a {type(found).__name__}, not a callable "
                            "brain(turn)")
    return found  # type: ignore[return-value]
