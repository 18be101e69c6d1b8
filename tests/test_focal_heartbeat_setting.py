"""The Focal heartbeat setting belongs to the user (FO6): on or off and its interval, read
and set through ``rt.focal``, obeyed by every due occurrence, kept across restarts and
processes. On the injected clock."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime, Turn
from kinbox.actors import focal_heartbeat_setting as hs
from kinbox.actors.focal import FOCAL_ID
from kinbox.actors.focal_heartbeat_job import HEARTBEAT_JOB
from kinbox.actors.focal_heartbeat_setting import HeartbeatSetting

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
MINUTE = 60.0


class Brain:
    """Counts Focal's turns (each check-in is one)."""

    def __init__(self) -> None:
        self.focal_turns = 0

    def __call__(self, turn: Turn) -> None:
        if turn.session_id == FOCAL_ID:
            self.focal_turns += 1


@pytest.fixture
def focal(make_runtime: MakeRuntime, tmp_path: Path) -> tuple[Runtime, Brain]:
    """A runtime whose Focal has an edited checklist, so each due heartbeat runs."""
    brain = Brain()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    rt.get_or_create_focal_chat()
    (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
    return rt, brain


def beats(rt: Runtime) -> int:
    return sum(1 for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "focal_heartbeat")


def move(rt: Runtime, clock: ManualClock, minutes: float) -> None:
    clock.advance(minutes * MINUTE)
    rt.run_until_idle()


def stored(rt: Runtime) -> tuple[dict[str, Any], Any]:
    """The Focal config and the heartbeat job, as the tables hold them."""
    chat = rt.session(FOCAL_ID)
    assert chat is not None
    return chat.config, rt.focal.schedule.jobs.get(HEARTBEAT_JOB)


def test_the_first_focal_chat_has_the_heartbeat_on_every_30_minutes(
        focal: tuple[Runtime, Brain]) -> None:
    rt, _ = focal
    assert rt.focal.heartbeat() == HeartbeatSetting(enabled=True, interval_minutes=30)


def test_a_heartbeat_switched_off_looks_at_nothing_until_switched_back_on(
        focal: tuple[Runtime, Brain], clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Off: no check-in, no turn, and no findings computed (no session read); back on,
    due one interval from then."""
    rt, brain = focal
    looks: list[int] = []
    watched = rt.focal.watched_sessions
    monkeypatch.setattr(rt.focal, "watched_sessions", lambda: looks.append(1) or watched())
    assert rt.focal.set_heartbeat(enabled=False) == HeartbeatSetting(False, 30)
    for _ in range(4):
        move(rt, clock, 30)
    assert (beats(rt), brain.focal_turns, looks) == (0, 0, [])
    move(rt, clock, 7)
    assert rt.focal.set_heartbeat(enabled=True) == HeartbeatSetting(True, 30)
    assert stored(rt)[1].next_run_at == clock.now() + 30 * MINUTE
    move(rt, clock, 29)
    assert beats(rt) == 0
    move(rt, clock, 1)
    assert (beats(rt), brain.focal_turns) == (1, 1) and looks == [1]


def test_a_new_interval_is_due_one_interval_from_now_and_every_interval_after(
        focal: tuple[Runtime, Brain], clock: ManualClock) -> None:
    rt, _ = focal
    move(rt, clock, 10)
    assert rt.focal.set_heartbeat(interval_minutes=60) == HeartbeatSetting(True, 60)
    move(rt, clock, 59)  # past the 30 minutes the old interval was due at
    assert beats(rt) == 0
    move(rt, clock, 1)
    assert beats(rt) == 1
    move(rt, clock, 59)
    assert beats(rt) == 1
    move(rt, clock, 1)
    assert beats(rt) == 2
    config, job = stored(rt)
    assert (config["heartbeat_interval_minutes"], job.interval_seconds) == (60, 3600)


@pytest.mark.parametrize(("arguments", "field"), [
    ({"enabled": "no"}, "enabled"), ({"enabled": 0}, "enabled"),
    ({"enabled": None, "interval_minutes": 4}, "interval_minutes"),
    ({"interval_minutes": 1441}, "interval_minutes"),
    ({"interval_minutes": 30.5}, "interval_minutes"),
    ({"interval_minutes": True}, "interval_minutes"),
    ({"interval_minutes": "30"}, "interval_minutes"),
    ({"interval_minutes": math.nan}, "interval_minutes"),
    ({"enabled": False, "interval_minutes": -30}, "interval_minutes"),
])
def test_a_setting_kinbox_refuses_names_its_field_and_writes_nothing(
        focal: tuple[Runtime, Brain], arguments: dict[str, Any], field: str) -> None:
    rt, _ = focal
    before = stored(rt)
    with pytest.raises(ConfigError) as refused:
        rt.focal.set_heartbeat(**arguments)
    assert refused.value.field == field
    assert stored(rt) == before and rt.focal.heartbeat() == HeartbeatSetting(True, 30)


def test_a_refused_setting_does_not_make_the_focal_chat_either(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    rt = make_runtime(brain=Brain(), data_dir=tmp_path / "data")
    with pytest.raises(ConfigError):
        rt.focal.set_heartbeat(interval_minutes=0)
    assert rt.focal.exists() is False and rt.focal.schedule.jobs.get(HEARTBEAT_JOB) is None


def test_saving_the_setting_unchanged_does_not_put_the_next_heartbeat_off(
        focal: tuple[Runtime, Brain], clock: ManualClock) -> None:
    rt, _ = focal
    move(rt, clock, 20)
    assert rt.focal.set_heartbeat(enabled=True, interval_minutes=30) == HeartbeatSetting()
    move(rt, clock, 10)
    assert beats(rt) == 1


def test_the_setting_survives_a_restart_which_never_overwrites_it(
        db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    with Runtime(db=db_url, brain=Brain(), clock=clock, data_dir=tmp_path / "data") as rt:
        rt.focal.set_heartbeat(enabled=False, interval_minutes=90)
    brain = Brain()
    with Runtime(db=db_url, brain=brain, clock=clock, data_dir=tmp_path / "data") as rt:
        rt.get_or_create_focal_chat()
        assert rt.focal.heartbeat() == HeartbeatSetting(False, 90)
        rt.focal.set_heartbeat(enabled=True)
        (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
    with Runtime(db=db_url, brain=brain, clock=clock, data_dir=tmp_path / "data") as rt:
        rt.get_or_create_focal_chat()
        assert rt.focal.heartbeat() == HeartbeatSetting(True, 90)
        move(rt, clock, 89)
        assert beats(rt) == 0
        move(rt, clock, 1)
        assert beats(rt) == 1


def test_a_due_heartbeat_obeys_a_config_written_without_the_api(
        focal: tuple[Runtime, Brain], clock: ManualClock) -> None:
    """The config is the truth: one patched by another version (or by hand) is obeyed by
    the next due occurrence, off, back on, or at another interval."""
    rt, brain = focal
    store = rt.context.store
    store.patch_config(FOCAL_ID, {"heartbeat_enabled": False}, clock.now())
    move(rt, clock, 30)
    assert (beats(rt), brain.focal_turns) == (0, 0)
    store.patch_config(FOCAL_ID, {"heartbeat_enabled": True,
                                  "heartbeat_interval_minutes": 60}, clock.now())
    move(rt, clock, 30)  # the job was still due every 30 minutes: this one runs
    assert beats(rt) == 1
    move(rt, clock, 30)  # and the next is an hour after it
    assert beats(rt) == 1
    move(rt, clock, 30)
    assert beats(rt) == 2


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_change_made_in_one_runtime_is_obeyed_by_another_on_postgres(
        pg_url: str, tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    brain = Brain()
    with Runtime(db=pg_url, brain=brain, clock=clock, data_dir=tmp_path / "data") as staying:
        staying.get_or_create_focal_chat()
        (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
        with Runtime(db=pg_url, brain=Brain(), clock=clock, data_dir=tmp_path / "data") as other:
            other.focal.set_heartbeat(enabled=False)
        move(staying, clock, 30)
        assert (beats(staying), brain.focal_turns) == (0, 0)
        assert staying.focal.heartbeat() == HeartbeatSetting(False, 30)
        with Runtime(db=pg_url, brain=Brain(), clock=clock, data_dir=tmp_path / "data") as other:
            other.focal.set_heartbeat(enabled=True, interval_minutes=45)
        move(staying, clock, 44)
        assert beats(staying) == 0
        move(staying, clock, 1)
        assert (beats(staying), brain.focal_turns) == (1, 1)
        move(staying, clock, 45)
        assert beats(staying) == 2


# -- the pure rule -----------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "setting"), [
    ({}, HeartbeatSetting(True, 30)),
    ({"heartbeat_enabled": False, "heartbeat_interval_minutes": 60}, HeartbeatSetting(False, 60)),
    ({"heartbeat_enabled": "no", "heartbeat_interval_minutes": "60"}, HeartbeatSetting(True, 30)),
    ({"heartbeat_interval_minutes": 1}, HeartbeatSetting(True, 5)),
    ({"heartbeat_interval_minutes": 10**9}, HeartbeatSetting(True, 1440)),
    ({"heartbeat_interval_minutes": 45.0}, HeartbeatSetting(True, 45)),
    ({"heartbeat_interval_minutes": 45.5}, HeartbeatSetting(True, 30)),
])
def test_a_stored_setting_is_read_leniently(config: dict[str, Any],
                                            setting: HeartbeatSetting) -> None:
    assert hs.from_config(config) == setting


def test_the_next_due_heartbeat_follows_whole_intervals_of_the_setting() -> None:
    hourly = HeartbeatSetting(True, 60)
    assert hs.next_due(hourly, 1000.0, 1000.0) == 1000.0 + 3600
    assert hs.next_due(hourly, 1000.0, 1000.0 + 3 * 3600 + 5) == 1000.0 + 4 * 3600  # late
    assert hs.next_due(HeartbeatSetting(False, 5), 0.0, 0.0) == 300.0  # off: kept looking
    assert hs.after_change(hourly, 50.0) == 3650.0


class HoldingBrain:
    """Records the kinds of each Focal turn's messages; holds a turn on a user message
    ``hold`` until released, and fails the first heartbeat turn when ``fail_first``."""

    def __init__(self, fail_first: bool = False) -> None:
        self.kinds: list[list[str]] = []
        self.fail_first = fail_first
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, turn: Turn) -> None:
        if turn.session_id != FOCAL_ID:
            return
        kinds = [m.kind for m in turn.messages]
        self.kinds.append(kinds)
        if any(m.content == "hold" for m in turn.messages):
            self.holding.set()
            assert self.release.wait(20)
        if self.fail_first and "focal_heartbeat" in kinds:
            self.fail_first = False
            raise RuntimeError("model unavailable")


def heartbeat_turns(brain: HoldingBrain) -> int:
    return sum(1 for kinds in brain.kinds if "focal_heartbeat" in kinds)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("switch", ["set_heartbeat", "config"])
def test_a_heartbeat_queued_behind_a_busy_focal_is_not_delivered_once_switched_off(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path, switch: str) -> None:
    """A check-in queued while Focal was busy (a long turn on the user's message) stayed in
    the inbox: switched off meanwhile, it was still delivered when Focal's turn ended. Off
    means no heartbeat turn from then on: the queued check-in is cancelled with the
    switch, or, switched off in the config alone, by the next due occurrence."""
    brain = HoldingBrain()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data", lease_seconds=7200.0)
    chat = rt.get_or_create_focal_chat()
    (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
    rt.post(chat.id, "hold")
    assert brain.holding.wait(10)
    clock.advance(30 * MINUTE)  # the heartbeat is due: queued behind the running turn
    wait_for(lambda: beats(rt) == 1, 10, "the check-in queued")
    if switch == "set_heartbeat":
        assert rt.focal.set_heartbeat(enabled=False) == HeartbeatSetting(False, 30)
    else:
        rt.context.store.patch_config(FOCAL_ID, {"heartbeat_enabled": False}, clock.now())
        clock.advance(30 * MINUTE)  # the next occurrence finds it off
    brain.release.set()
    rt.run_until_idle()
    move(rt, clock, 120)
    assert heartbeat_turns(brain) == 0, brain.kinds
    [row] = [r for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "focal_heartbeat"]
    assert row["status"] == "cancelled"


@pytest.mark.timeout(60)
def test_a_heartbeat_waiting_for_its_retry_is_not_delivered_once_switched_off(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path, any_db_url: str) -> None:
    """A check-in whose turn failed waits out its backoff as a pending row: switched off
    meanwhile, its retry still woke Focal for a heartbeat turn (SQLite and PostgreSQL)."""
    brain = HoldingBrain(fail_first=True)
    rt = make_runtime(db=any_db_url, brain=brain, data_dir=tmp_path / "data")
    rt.get_or_create_focal_chat()
    (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
    move(rt, clock, 30)
    wait_for(lambda: [r["attempts"] for r in rt.inbox(target=FOCAL_ID)
                      if r["kind"] == "focal_heartbeat"] == [1], 10, "the failed check-in")
    assert heartbeat_turns(brain) == 1
    rt.focal.set_heartbeat(enabled=False)
    for _ in range(6):
        move(rt, clock, 1)  # past every backoff
    assert heartbeat_turns(brain) == 1, brain.kinds
    [row] = [r for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "focal_heartbeat"]
    assert row["status"] == "cancelled"
