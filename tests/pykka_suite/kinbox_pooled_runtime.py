"""A pytest plugin that runs pykka's own test suite on ``PooledActor`` too.

Loaded with ``-p kinbox_pooled_runtime`` into a pytest run inside pykka's
unpacked source distribution (``tests/test_pykka_suite.py`` does that). It
changes only the harness, never a test body: pykka's ``runtime`` fixture is
parametrized over ``RUNTIMES`` (``threading`` upstream); this plugin adds a
second parameter, ``pooled``, the same ``Runtime`` record with
:class:`SuitePooledActor` as its actor class. Every test that takes the
``runtime`` fixture then runs once per runtime, with ids ``[threading]`` and
``[pooled]``.

pykka's test actors call ``super().__init__()`` without arguments, so the
suite's actor class takes its pool from this module: one shared pool whose
size is ``KINBOX_PYKKA_POOL_THREADS`` (default 4).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from kinbox.actors.pooled import ActorPool, PooledActor

POOL = ActorPool(int(os.environ.get("KINBOX_PYKKA_POOL_THREADS", "4")), name="pykka-suite")


class SuitePooledActor(PooledActor):
    """A pooled actor that can be built the way pykka's tests build their actors."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        super().__init__(POOL)


def _pooled_param(threading_param: Any) -> Any:
    runtime = dataclasses.replace(threading_param.values[0], name="pooled",
                                  actor_class=SuitePooledActor)
    return pytest.param(runtime, id="pooled")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Before pytest parametrizes ``runtime`` from its fixture, add the pooled runtime."""
    if "runtime" not in metafunc.fixturenames:
        return
    for fixturedef in metafunc._arg2fixturedefs.get("runtime", ()):
        params = list(fixturedef.params or ())
        ids = [p.id for p in params if hasattr(p, "id")]
        if "threading" in ids and "pooled" not in ids:
            threading_param = params[ids.index("threading")]
            fixturedef.params = (*params, _pooled_param(threading_param))


def pytest_report_header() -> str:
    return f"kinbox: pykka runtimes threading + pooled (pool of {len(POOL._threads)} threads)"
