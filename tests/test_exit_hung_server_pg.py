"""A PostgreSQL server that stops answering (hung, paused) leaves the statements it was
sent waiting for good: the kernel acknowledges the bytes, so no TCP timeout ends them. A
program whose server hung must still exit when it ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = """
import asyncio
import faulthandler
import socket
import sys
import threading
from urllib.parse import urlsplit
from kinbox.actors import Runtime, runtime_life
from kinbox.actors.schedule_driver import ScheduleDriver
from kinbox.persistence import connections, db_clock, liveness

# The stop's waits, bounded as in any program, bounded shorter here (the same waits, some
# seconds sooner): the stop at exit gives the turns and jobs that wait on the hung server
# 1 s, not its default 10, and each hung close or release 0.5 s, not 2 or 5. Unbounded,
# a wait still hangs the exit for good.
for module, name in ((connections, "CLOSE_WAIT"), (db_clock, "CLOSE_WAIT"),
                     (liveness, "RELEASE_WAIT")):
    assert isinstance(getattr(module, name), float), (module, name)
    setattr(module, name, 0.5)
assert runtime_life.LifeCycleApi.stop.__defaults__ == (10.0,)
runtime_life.LifeCycleApi.stop.__defaults__ = (1.0,)

# A proxy to the server that, once frozen, holds every byte its connections get and
# refuses new ones: to a client, a server that hung.
frozen = threading.Event()
server = urlsplit(sys.argv[1])
listener = socket.create_server(("127.0.0.1", 0))


def pump(source, sink):
    try:
        while data := source.recv(65536):
            if frozen.is_set():
                threading.Event().wait()  # never answered, never closed
            sink.sendall(data)
    except OSError:
        pass


def serve():
    while True:
        client, _ = listener.accept()
        if frozen.is_set():
            client.close()
            continue
        upstream = socket.create_connection((server.hostname, server.port or 5432))
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


threading.Thread(target=serve, daemon=True).start()


def waiting_in(function):
    # Is some thread inside ``function`` (waiting on the hung server)?
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
    return False


def wait_until(condition, what):
    tick = threading.Event()
    for _ in range(3000):
        if condition():
            return
        tick.wait(0.01)
    faulthandler.dump_traceback()  # where each thread was: the test's report shows why
    raise SystemExit(f"timed out waiting for {what() if callable(what) else what}")


turning = threading.Event()
go_on = threading.Event()

async def brain(turn):
    turning.set()
    await asyncio.to_thread(go_on.wait, 30)
    await turn.tools.task_list()  # a tool call: it reads, on a blocking worker

# The scheduler's look waits on the hung server only on a connection its pool thread
# opened before the freeze: one opened after it is refused, and the look ends at once.
# When that thread's first look came (the listener's connect asks for one, whenever it
# connects) was the machine's business. Now the first look opens its connection, then
# waits for the freeze; every other look waits for it (one look at a time).
started, looking, frozen_now = threading.Event(), threading.Event(), threading.Event()
fire_held = ScheduleDriver._fire_held


def first_look_after_the_freeze(driver):
    started.wait()
    rt.context.journal.t.db.execute_sql("SELECT 1")  # this thread's connection, now
    looking.set()
    frozen_now.wait()
    fire_held(driver)


ScheduleDriver._fire_held = first_look_after_the_freeze

# The ticker's check of this runtime's own life lock, likewise. The ticker asks the
# server more than that check (the journal's lease owners, on its own connection), and
# the freeze caught it in whichever statement was under way: on a loaded machine, as
# often as not another one, and the check on the lock's connection never came. Now the
# ticker's next check once the program is ready waits for the freeze, then asks.
check_next, checking = threading.Event(), threading.Event()
still_held = liveness.OwnerLiveness.still_held


def check_after_the_freeze(lock):
    if check_next.is_set() and not checking.is_set():  # the ticker's thread alone
        checking.set()
        frozen_now.wait()
    still_held(lock)


liveness.OwnerLiveness.still_held = check_after_the_freeze
proxied = server._replace(netloc=f"{server.username}@127.0.0.1:{listener.getsockname()[1]}")
rt = Runtime(db=proxied.geturl(), brain=brain, stop_grace=1.0)
rt.start()
started.set()
rt.cron.look_now()  # a scheduler job: it reads the cron tables
# The scheduler's look, and the ticker's check of this runtime's own life lock (on the
# lock's connection, whose lock the stop's release of the life lock waited for).
waits = ["_fire_held", "gone"]
if sys.argv[2] == "turn":
    project = rt.create_project("p")
    rt.post(rt.create_session(project.id, "A").id, "hello")
    wait_until(turning.is_set, "the async turn")
    waits.append("task_list")
# Not while a thread opens a connection: peewee holds a lock of the whole database while
# it does, which every close then waits for (a server hanging mid-handshake: not here).
wait_until(looking.is_set, "the scheduler's look")
check_next.set()
wait_until(checking.is_set, "the ticker's check of the life lock")
wait_until(lambda: not waiting_in("connect"), "the connections to open")
frozen.set()
frozen_now.set()
go_on.set()
wait_until(lambda: all(waiting_in(f) for f in waits),
           lambda: f"{[f for f in waits if not waiting_in(f)]} (of {waits}) to wait on the server")
print("the server hangs; the program ends", flush=True)
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("running", ["turn", "idle"])
def test_a_program_whose_postgresql_server_hung_still_exits(
        tmp_path: Path, pg_url: str, running: str) -> None:
    """The program ends (no ``stop()``) while a scheduler job, the ticker's check of the
    runtime's own life lock, and an async brain's tool call (``turn``), wait on a hung
    server. The stop at exit hung closing the connections those threads use (the
    driver's close waits for their statement), and past it the interpreter's join of the
    scheduler's and the async host's pools (not daemons) waited for those threads: for
    ever, either way. The release of the life lock waited for the check under way on its
    connection: for ever too."""
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(PROGRAM))
    try:
        done = subprocess.run([sys.executable, str(script), pg_url, running],
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the program did not exit within 90 s: {exc.stdout!r} "
                             f"{exc.stderr!r}") from None
    assert "the program ends" in done.stdout, done.stderr
    assert done.returncode == 0, done.stderr
