"""The checks of a :class:`~.runtime.Runtime`'s options, before anything opens.

Each option that is wrong is a :class:`ConfigError` naming it (``.field``), so
a typo in a product's configuration fails at construction with its name,
never later inside a thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from .clock import Clock
from .errors import ConfigError
from .turn import Brain
from .validation import finite_number


def check_options(*, db: object, brain: Brain | None, clock: Clock | None,
                  ids: Callable[[], str] | None, data_dir: object,
                  counts: Mapping[str, object], seconds: Mapping[str, object],
                  turn_timeout: object) -> None:
    """Refuse the first option of a runtime that cannot be used, naming it."""
    for field, value in counts.items():
        _count(field, value)
    for field, value in seconds.items():
        check_seconds(field, value)
    if db is not None and not isinstance(db, str):
        raise ConfigError(f"db must be a database URL string, got {type(db).__name__}",
                          field="db")
    if data_dir is not None and not isinstance(data_dir, str | os.PathLike):
        raise ConfigError(f"data_dir must be a path, got {type(data_dir).__name__}",
                          field="data_dir")
    if clock is not None and not callable(getattr(clock, "now", None)):
        raise ConfigError("clock must have a now() giving epoch seconds", field="clock")
    if ids is not None and not callable(ids):
        raise ConfigError("ids must be callable: ids() -> a new id", field="ids")
    if turn_timeout is not None:
        check_seconds("turn_timeout", turn_timeout, " or None")
    if brain is not None and not callable(brain):
        raise ConfigError("brain must be callable: brain(turn)", field="brain")


def _count(field: str, value: object) -> None:
    """A runtime option that counts something: an integer >= 1 (booleans are not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field} must be an integer >= 1, got {value!r}", field=field)


def check_seconds(field: str, value: object, alternative: str = "") -> None:
    """An option that is a duration: a finite number of seconds > 0 (the runtime's, and
    ``rt.social.send_timeout``)."""
    if not finite_number(value) or value <= 0:
        raise ConfigError(f"{field} must be a number of seconds > 0{alternative}, "
                          f"got {value!r}", field=field)


MAX_RETRY_DELAY = 3600.0
"""The longest pause a retry schedule may ask for between two tries: a social reply's
retries hold its chat's next turn, and a longer wait than threading's own limit raised
``OverflowError`` inside the send."""


def check_delays(field: str, value: object) -> tuple[float, ...]:
    """A retry schedule (``rt.social.retry_delays``): a sequence of finite seconds, each
    from 0 to :data:`MAX_RETRY_DELAY`, as a tuple of floats; else :class:`ConfigError`
    naming ``field``, before any send uses it (a string among them failed a send half-way
    through its retries)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(f"{field} must be a sequence of seconds (a tuple or list), "
                          f"got {type(value).__name__}", field=field)
    for delay in value:
        if not finite_number(delay) or not 0 <= delay <= MAX_RETRY_DELAY:
            raise ConfigError(f"{field} must hold numbers of seconds from 0 to "
                              f"{MAX_RETRY_DELAY:g}, got {delay!r}", field=field)
    return tuple(float(delay) for delay in value)
