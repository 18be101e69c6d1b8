"""The runtime end to end on each backend, and two runtimes sharing one PostgreSQL database."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kinbox.actors import ConfigError, KinboxError, Runtime, Turn

from .conftest import PG_URL, reset_postgres


def test_delivery_works_the_same_on_every_backend(any_db_url: str, tmp_path: object) -> None:
    seen: list[str] = []
    with Runtime(db=any_db_url, brain=lambda turn: seen.append(turn.messages[0].content),
                 data_dir=str(tmp_path)) as rt:
        p = rt.create_project("p")
        a, b = rt.create_session(p.id, "A").id, rt.create_session(p.id, "B").id
        for i in range(20):
            rt.tools_for(a).agent_send(b, f"m{i}")
        rt.run_until_idle(30)
        assert seen == [f"m{i}" for i in range(20)]
        assert set(rt.marker_counts().values()) == {1}


@pytest.mark.timeout(120)
def test_two_runtimes_on_one_postgres_run_nothing_twice(
        tmp_path: object) -> None:
    if not PG_URL:
        pytest.skip("needs KINBOX_TEST_PG_URL (set by .ci/run)")
    reset_postgres(PG_URL)
    runs: Counter[str] = Counter()
    by_runtime: Counter[str] = Counter()
    lock = threading.Lock()

    def brain_for(name: str) -> Callable[[Turn], None]:
        def brain(turn: Turn) -> None:
            with lock:
                runs[turn.messages[0].message_id] += 1
                by_runtime[name] += 1
        return brain

    # The sender's runtime may run one turn at a time, so the other one, which only
    # finds work on its ticks, usually gets a share; what must hold either way is
    # that no message runs twice.
    first = Runtime(db=PG_URL, brain=brain_for("first"), data_dir=str(tmp_path),
                    max_active_sessions=1).start()
    second = Runtime(db=PG_URL, brain=brain_for("second"), data_dir=str(tmp_path),
                     max_active_sessions=8).start()
    try:
        p = first.create_project("shared")
        targets = [first.create_session(p.id, f"S{i}").id for i in range(20)]
        ids = [first.post(targets[k % 20], f"work {k}").message_id for k in range(300)]
        first.run_until_idle(60)
        second.run_until_idle(60)
        assert sorted(runs) == sorted(ids)
        assert set(runs.values()) == {1}
        assert set(first.marker_counts().values()) == {1}
        assert sum(by_runtime.values()) == 300
    finally:
        first.stop()
        second.stop()


def _sync_brain(turn: Turn) -> None:
    turn.reply("ok")


async def _async_brain(turn: Turn) -> None:
    turn.reply("ok")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("brain", [_sync_brain, _async_brain], ids=["sync", "async"])
def test_a_stopped_runtime_holds_no_connection_and_no_event_loop(
        any_db_url: str, tmp_path: object, brain: Callable[[Turn], object]) -> None:
    # A product may stop its runtime and go on (start another, on another database):
    # the stopped one must not keep the caller's database connection (a server
    # connection on PostgreSQL, file handles on SQLite) or its event loop's sockets
    # open until the garbage collector happens to find them.
    rt = Runtime(db=any_db_url, brain=brain, data_dir=str(tmp_path)).start()
    p = rt.create_project("p")
    a = rt.create_session(p.id, "A").id
    rt.post(a, "hello")
    rt.run_until_idle(30)
    db = rt.context.journal.t.db
    host = rt.context.async_host
    rt.stop()
    assert db.is_closed()  # the connection of the thread that started and stopped it
    if host is not None:
        assert host.loop.is_closed()


@pytest.mark.timeout(60)
def test_a_runtime_that_fails_to_start_leaves_its_database_closed(tmp_path: Path) -> None:
    # A start that fails late (here on the device key, after the schema and the writer)
    # raises its own error and closes what it opened: no handle of the file stays behind.
    data = tmp_path / "data"
    data.mkdir()
    (data / "device_key.pem").write_text("junk")
    (data / "device_key.pem").chmod(0o600)
    path = tmp_path / "k.db"
    rt = Runtime(db=f"sqlite:///{path}", brain=_sync_brain, data_dir=str(data))
    with pytest.raises(KinboxError) as failed:  # not the transport's own IdentityError
        rt.start()
    assert isinstance(failed.value, ConfigError) and failed.value.field == "data_dir"
    held = [fd for fd in os.listdir("/proc/self/fd")
            if os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(path))]
    assert held == []
