"""The user's Focal heartbeat setting: on or off, and how often (FO6). Pure: time comes in
as ``now``.

The first ``get_or_create_focal_chat()`` writes the default (on, every 30 minutes) into
the Focal session's config; after that the setting belongs to the user. The config is
the truth: the heartbeat job's row only says when it is next due, and every due
occurrence obeys the config as it reads then (:func:`from_config`), whoever wrote it:
``rt.focal.set_heartbeat`` in this process or another, or anything that patched the
config without it. A setting given to kinbox is checked whole (:func:`checked`) before
anything is written; a stored one is read leniently, so a hand-written value never stops
the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigError

ENABLED_KEY = "heartbeat_enabled"
INTERVAL_KEY = "heartbeat_interval_minutes"
DEFAULT_INTERVAL_MINUTES = 30
MIN_INTERVAL_MINUTES = 5
"""The shortest interval: each occurrence reads every watched session (and may be a turn)."""
MAX_INTERVAL_MINUTES = 1440
"""The longest interval: a day."""


@dataclass(frozen=True)
class HeartbeatSetting:
    """Whether the heartbeat runs, and how many minutes apart."""

    enabled: bool = True
    interval_minutes: int = DEFAULT_INTERVAL_MINUTES

    @property
    def interval_seconds(self) -> float:
        """The interval as the schedule counts it."""
        return self.interval_minutes * 60.0

    def as_config(self) -> dict[str, Any]:
        """The Focal config keys that hold this setting."""
        return {ENABLED_KEY: self.enabled, INTERVAL_KEY: self.interval_minutes}

    def changed(self, **changes: Any) -> HeartbeatSetting:
        """This setting with ``changes`` (from :func:`checked`)."""
        return replace(self, **changes)


DEFAULT = HeartbeatSetting()
"""What the first ``get_or_create_focal_chat()`` enables."""


def checked(enabled: object = None, interval_minutes: object = None) -> dict[str, Any]:
    """The fields of a change the user asks for (None: not changed), each checked, as
    :meth:`HeartbeatSetting.changed` takes them: ``enabled`` a bool, ``interval_minutes``
    a whole number of minutes from :data:`MIN_INTERVAL_MINUTES` to
    :data:`MAX_INTERVAL_MINUTES`. A ConfigError naming the field otherwise: 1 is no
    ``True`` and ``True`` no minute, and 30.0 is 30 (a JSON number) but 30.5 is refused."""
    changes: dict[str, Any] = {}
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise ConfigError(f"enabled must be True or False, not {type(enabled).__name__}",
                              field="enabled")
        changes["enabled"] = enabled
    if interval_minutes is not None:
        whole = _whole_minutes(interval_minutes)
        if whole is None or not MIN_INTERVAL_MINUTES <= whole <= MAX_INTERVAL_MINUTES:
            raise ConfigError(
                f"interval_minutes must be a whole number of minutes from "
                f"{MIN_INTERVAL_MINUTES} to {MAX_INTERVAL_MINUTES}; got {interval_minutes!r}",
                field="interval_minutes")
        changes["interval_minutes"] = whole
    return changes


def from_config(config: Mapping[str, Any]) -> HeartbeatSetting:
    """The setting a Focal config holds, as the schedule obeys it. A config that has no
    setting (written before there was one) holds the default; a value :func:`checked`
    would refuse (written by hand, or by another version) stands for the default's, and
    an interval out of range is brought into it, so no stored value stops the heartbeat
    for good or makes it fire every tick."""
    enabled = config.get(ENABLED_KEY)
    minutes = _whole_minutes(config.get(INTERVAL_KEY))
    return HeartbeatSetting(
        enabled if isinstance(enabled, bool) else DEFAULT.enabled,
        DEFAULT.interval_minutes if minutes is None
        else min(max(minutes, MIN_INTERVAL_MINUTES), MAX_INTERVAL_MINUTES))


def next_due(setting: HeartbeatSetting, scheduled_at: float | None, now: float) -> float:
    """When the heartbeat is due next after its occurrence due at ``scheduled_at`` came at
    ``now``: whole intervals of the setting on from ``scheduled_at``, the first after
    ``now`` (a late or skipped occurrence still advances a full interval). The job stays
    due while the heartbeat is off, so that one switched back on in the config alone
    runs again; an occurrence that finds it off does nothing (:func:`runs`)."""
    step = setting.interval_seconds
    due = now if scheduled_at is None else scheduled_at
    if due <= now:
        due += (math.floor((now - due) / step) + 1) * step
    return due


def after_change(setting: HeartbeatSetting, now: float) -> float:
    """When the heartbeat is due after the user changed the setting at ``now``: one
    interval of the new setting from now (a new interval, or switched back on)."""
    return now + setting.interval_seconds


def runs(setting: HeartbeatSetting) -> bool:
    """Whether a due occurrence looks for findings at all (and may wake Focal)."""
    return setting.enabled


def _whole_minutes(value: object) -> int | None:
    """``value`` as a whole number of minutes, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)
