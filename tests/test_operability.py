"""What an operator and a new user trip over first: send-only runtimes, idleness behind a
backoff, exit without stop(), one error tree, validation at every entry point, operator
cancel and bulk requeue, turn timeouts, logs."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import kinbox.actors
from kinbox.actors import (
    ConfigError,
    KinboxError,
    ManualClock,
    PersistenceError,
    RowNotFound,
    Runtime,
    RuntimeStateError,
    ToolError,
    Turn,
)
from kinbox.actors.runtime import data_dir_for
from kinbox.persistence import DatabaseOpenError, IllegalTransition, default_data_dir

from .helpers import quiet_brain, wait_for

MakeRuntime = Callable[..., Runtime]


def two_sessions(rt: Runtime) -> tuple[str, str]:
    project = rt.project("p") or rt.create_project("p")
    return (rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id)


# -- 1. a runtime without a brain never consumes a message ------------------------------


def test_a_runtime_without_a_brain_is_send_only_and_never_claims(
        make_runtime: MakeRuntime, db_url: str, clock: ManualClock) -> None:
    sender = make_runtime()
    assert sender.send_only and sender.context.dispatcher is None
    claims: list[str] = []
    sender.subscribe(lambda event, data: claims.append(event) if event == "claimed" else None)
    a, b = two_sessions(sender)
    sender.post(b, "for whoever holds a brain", sender=a)
    clock.advance(60)  # ticks, due times: a delivering runtime would have claimed by now
    assert [r["status"] for r in sender.inbox()] == ["pending"]
    with pytest.raises(RuntimeStateError) as refused:
        sender.run_until_idle()
    assert refused.value.state == "send-only"

    # A delivering runtime beside it on the same SQLite file runs the turn, once.
    seen: list[str] = []
    worker = make_runtime(brain=lambda turn: seen.extend(m.content for m in turn.messages))
    worker.run_until_idle()
    assert seen == ["for whoever holds a brain"]
    assert claims == []
    assert worker.marker_counts() == {sender.inbox()[0]["message_id"]: 1}


# -- 2. idle means nothing can run before the next due time ------------------------------


def test_run_until_idle_returns_while_a_head_row_waits_out_its_backoff(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        ran.append(turn.messages[0].content)
        if turn.messages[0].content == "bad" and ran.count("bad") == 1:
            raise RuntimeError("first attempt fails")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.post(b, "bad", sender=a)
    rt.post(b, "good", sender=a)
    rt.run_until_idle(timeout=30)  # "good" waits behind "bad", which is in backoff
    batches = rt.statistics()["writer"]["batches"]
    rt.run_until_idle(timeout=30)
    assert rt.statistics()["writer"]["batches"] - batches < 5  # no spinning claims
    assert ran == ["bad"]
    assert sorted(r["status"] for r in rt.inbox()) == ["pending", "pending"]
    clock.advance(2)
    rt.run_until_idle(timeout=30)
    assert ran == ["bad", "bad", "good"]


# -- 3. a program that never calls stop() still exits cleanly ----------------------------


PROGRAM = """
import sys
from kinbox.actors import Runtime

def brain(turn):
    turn.reply("seen " + turn.messages[0].content)

rt = Runtime(db=sys.argv[1], brain=brain).start()
p = rt.project("p") or rt.create_project("p")
a, b = rt.create_session(p.id, "A").id, rt.create_session(p.id, "B").id
rt.post(b, "hello", sender=a)
rt.run_until_idle()
rt.post(b, "left for the next start", sender=a)
if sys.argv[2] == "raise":
    raise SystemExit("the program ends with an error, never calling stop()")
"""


@pytest.mark.parametrize("ending", ["return", "raise"])
@pytest.mark.timeout(60)
def test_a_program_that_never_calls_stop_exits_and_leaves_nothing_half_done(
        tmp_path: Path, db_url: str, ending: str) -> None:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(PROGRAM))
    done = subprocess.run([sys.executable, str(script), db_url, ending], capture_output=True,
                          text=True, timeout=45)
    assert done.returncode == (0 if ending == "return" else 1), done.stderr
    assert "Traceback" not in done.stderr
    rt = Runtime(db=db_url, brain=quiet_brain).start()
    try:
        states = sorted(r["status"] for r in rt.inbox())
        assert "processing" not in states
        assert states.count("delivered") >= 1 and len(states) == 2
        rt.run_until_idle()
        assert sorted(r["status"] for r in rt.inbox()) == ["delivered", "delivered"]
        assert set(rt.marker_counts().values()) == {1}
    finally:
        rt.stop()


DIRECT_TURN_PROGRAM = """
import sys
import threading
from kinbox.actors import Runtime

running = threading.Event()

def brain(turn):
    running.set()
    turn.wait_stop_requested(300)  # a long model call that ends when asked to stop
    turn.reply("stopped by the runtime's stop")

rt = Runtime(db=sys.argv[1], brain=brain).start()
rt.social.allow("slack", ["U-ann"])
rt.social.ingest({"platform": "slack", "sender_id": "U-ann", "sender_name": "Ann",
                  "thread_id": "T1", "text": "hello", "event_id": "e1"})
assert running.wait(30), "the social turn never started"
print("the social turn runs; the program ends without stop()", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_program_that_ends_while_a_direct_turn_runs_exits_without_waiting_for_it(
        tmp_path: Path, db_url: str) -> None:
    """A social event's or a cron job's turn (a direct turn) runs on a pool whose
    threads the interpreter joins at exit before ``atexit`` hooks run: the hook that stops
    forgotten runtimes, and asks their turns to stop, came after that join, so the
    program hung until the brain ended on its own (never, for one that waits for its
    stop), and APScheduler printed a traceback every poll meanwhile."""
    exits_cleanly(tmp_path, DIRECT_TURN_PROGRAM, db_url, saying="the social turn runs")


def exits_cleanly(tmp_path: Path, program: str, db_url: str, saying: str,
                  args: Sequence[str] = ()) -> None:
    """Run ``program`` on ``db_url`` (then ``args``): it exits 0 within 45 s, having printed
    ``saying``, with no traceback."""
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(program))
    try:
        done = subprocess.run([sys.executable, str(script), db_url, *args],
                              capture_output=True, text=True, timeout=45)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the program did not exit within 45 s: {exc.stdout!r} "
                             f"{exc.stderr!r}") from None
    assert done.returncode == 0, done.stderr
    assert saying in done.stdout
    assert "Traceback" not in done.stderr


DEAF_DIRECT_TURN_PROGRAM = """
import sys
import threading
import time
from kinbox.actors import Runtime

running = threading.Event()

def brain(turn):
    running.set()
    time.sleep(300)  # a model call that does not hear its stop

rt = Runtime(db=sys.argv[1], brain=brain).start()
rt.social.allow("slack", ["U-ann"])
rt.social.ingest({"platform": "slack", "sender_id": "U-ann", "sender_name": "Ann",
                  "thread_id": "T1", "text": "hello", "event_id": "e1"})
assert running.wait(30), "the social turn never started"
rt.stop(timeout=1.0)
print("stopped", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_stopped_runtime_does_not_hold_the_exit_for_a_direct_turn_deaf_to_its_stop(
        tmp_path: Path, db_url: str) -> None:
    """``kinbox worker``/``serve`` stop the runtime on SIGTERM, print that they stopped,
    and return; a social or cron turn whose brain does not hear its stop (a long model
    call) is given up on by the stop, as an inbox turn is. Its pool's thread was not a
    daemon, and the interpreter waited for it at exit: the process hung until the brain
    returned, after saying it had stopped."""
    exits_cleanly(tmp_path, DEAF_DIRECT_TURN_PROGRAM, db_url, saying="stopped")


ASYNC_THREAD_PROGRAM = """
import asyncio
import sys
import threading
import time
from kinbox.actors import Runtime

running = threading.Event()

async def brain(turn):
    running.set()
    await asyncio.to_thread(time.sleep, 300)  # a blocking SDK call, off the loop

rt = Runtime(db=sys.argv[1], brain=brain).start()
project = rt.create_project("p")
rt.post(rt.create_session(project.id, "A").id, "hello")
assert running.wait(30), "the async turn never started"
"""


ASYNC_CHANNEL_THREAD_PROGRAM = """
import asyncio
import sys
import threading
import time
from kinbox.actors import Runtime

sending = threading.Event()

async def send(route, text):
    sending.set()
    await asyncio.to_thread(time.sleep, 300)  # a platform SDK's blocking post, off the loop

def brain(turn):
    turn.reply("hi Ann")

rt = Runtime(db=sys.argv[1], brain=brain).start()
rt.social.register_channel("slack", send)
rt.social.allow("slack", ["U-ann"])
rt.social.ingest({"platform": "slack", "sender_id": "U-ann", "sender_name": "Ann",
                  "thread_id": "T1", "text": "hello", "event_id": "e1"})
assert sending.wait(30), "the reply's send never started"
"""


ENDING = """
if sys.argv[2] == "stop":
    rt.stop(timeout=1.0)
print("the program ends", flush=True)
"""
"""How the programs above end: with ``stop()`` (its timeout short: it gives up on the
call), or without it."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["stop", "no stop"])
@pytest.mark.parametrize("program", [ASYNC_THREAD_PROGRAM, ASYNC_CHANNEL_THREAD_PROGRAM],
                         ids=["async brain", "async channel"])
def test_a_blocking_call_handed_to_a_thread_by_async_code_does_not_hold_the_exit(
        tmp_path: Path, db_url: str, program: str, ending: str) -> None:
    """An async brain hands its blocking calls (a model SDK, a product's tool) to a thread
    with ``asyncio.to_thread``, and so does an ``async def`` channel adapter (a platform
    SDK's post), each on its own event loop (:mod:`.async_host`, :mod:`.channel_loop`):
    that is the loop's default executor, a stock pool whose threads the interpreter joins
    at exit. The stop gave up on the call (a brain's turn cancelled past its grace, its
    row handed back; a send cancelled), and the process then hung until the call
    returned, as a sync brain's deaf turn no longer holds it."""
    exits_cleanly(tmp_path, program + ENDING, db_url, saying="the program ends",
                  args=[ending])


# -- 11. one exception tree -----------------------------------------------------------


def test_every_exported_error_is_a_kinbox_error() -> None:
    errors = [getattr(kinbox.actors, n) for n in kinbox.actors.__all__
              if isinstance(getattr(kinbox.actors, n), type)
              and issubclass(getattr(kinbox.actors, n), BaseException)]
    assert len(errors) >= 15
    assert all(issubclass(e, KinboxError) for e in errors)
    assert issubclass(PersistenceError, KinboxError)


def test_requeue_of_an_unknown_id_is_a_kinbox_error_with_attributes(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=quiet_brain)
    with pytest.raises(KinboxError) as info:
        rt.requeue("msg-nope")
    assert isinstance(info.value, RowNotFound)
    assert (info.value.kind, info.value.key) == ("inbox row", "msg-nope")
    assert info.value.by == "id"


def test_a_row_looked_up_by_another_column_names_it_in_an_attribute() -> None:
    """``kinbox sessions list --project`` looks a project up by slug: the message says
    so, and a caller deciding on the error has the column too, not only the text."""
    exc = RowNotFound("project", "nope", by="slug")
    assert (exc.kind, exc.key, exc.by) == ("project", "nope", "slug")
    assert str(exc) == "no project with slug 'nope'"


def test_a_duplicate_names_the_field_that_is_taken(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=quiet_brain)
    rt.create_project("acme")
    with pytest.raises(KinboxError) as info:
        rt.create_project("acme")
    assert (info.value.kind, info.value.field, info.value.value) == (  # type: ignore[attr-defined]
        "project", "slug", "acme")


# -- 12. every public entry point validates like the tools do ----------------------------


@pytest.mark.parametrize(("call", "field"), [
    (lambda rt, b: rt.inbox(state="bogus"), "state"),
    (lambda rt, b: rt.post(b, "x" * 20_001), "content"),
    (lambda rt, b: rt.post(b, "a\ud800b"), "content"),
    (lambda rt, b: rt.post(b, "   "), "content"),
    (lambda rt, b: rt.post(b, "ok", payload=["not", "a", "dict"]), "payload"),
    (lambda rt, b: rt.post(b, "ok", payload={"x": object()}), "payload"),
    (lambda rt, b: rt.post("no-such-session", "ok"), "target"),
    (lambda rt, b: rt.create_project("a b/c"), "slug"),
    (lambda rt, b: rt.create_project(""), "slug"),
    (lambda rt, b: rt.create_session(None, ""), "title"),
    (lambda rt, b: rt.create_session(None, "x" * 513), "title"),
])
def test_bad_arguments_are_refused_precisely_and_write_nothing(
        make_runtime: MakeRuntime, call: Callable[[Runtime, str], object], field: str) -> None:
    rt = make_runtime(brain=quiet_brain)
    _, b = two_sessions(rt)
    sessions, projects = len(rt.sessions()), len(rt.context.store.projects())
    with pytest.raises(ConfigError) as info:
        call(rt, b)
    assert info.value.field == field
    assert rt.inbox() == []
    assert (len(rt.sessions()), len(rt.context.store.projects())) == (sessions, projects)


def test_a_lone_surrogate_in_agent_send_is_an_invalid_argument(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=quiet_brain)
    a, b = two_sessions(rt)
    with pytest.raises(ToolError) as info:
        rt.tools_for(a).agent_send(b, "a\ud800b")
    assert info.value.code == "invalid_argument"
    assert "position 1" in info.value.message
    assert rt.inbox() == []


def test_a_nul_character_is_refused_alike_on_both_backends(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    """PostgreSQL's text cannot hold NUL: a message with one was a raw DataError out of
    the commit there and delivered on SQLite. Both refuse it at the boundary now."""
    rt = make_runtime(brain=quiet_brain, db=any_db_url)
    a, b = two_sessions(rt)
    with pytest.raises(ToolError) as info:
        rt.tools_for(a).agent_send(b, "a\x00b")
    assert info.value.code == "invalid_argument" and "NUL" in info.value.message
    with pytest.raises(ConfigError) as refused:
        rt.post(b, "a\x00b")
    assert refused.value.field == "content"
    assert rt.inbox() == []
    rt.post(b, "fine")
    assert [m["status"] for m in rt.inbox()] in (["pending"], ["processing"], ["delivered"])


# -- 13. a foreground sub-agent that can never run is refused at once ---------------------


@pytest.mark.timeout(30)
def test_a_foreground_subagent_without_a_free_thread_is_refused_at_once(
        make_runtime: MakeRuntime) -> None:
    answers: list[object] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            return
        try:
            answers.append(turn.tools.agent("check it", run_in_background=False))
        except ToolError as exc:
            answers.append(exc)

    rt = make_runtime(brain=brain, max_active_sessions=1)
    a, b = two_sessions(rt)
    rt.post(b, "delegate", sender=a)
    rt.run_until_idle()
    [refusal] = answers
    assert isinstance(refusal, ToolError) and refusal.code == "execution_failed"
    assert "max_active_sessions" in refusal.message
    assert not [s for s in rt.sessions() if s.kind == "subagent"]


# -- 18. smaller ------------------------------------------------------------------------


def test_each_server_database_has_its_own_data_directory(tmp_path: Path) -> None:
    one = data_dir_for("postgresql://u:secret@db.example:5432/one")
    two = data_dir_for("postgresql://u@db.example:5432/two")
    assert one != two and one.parent == two.parent == default_data_dir() / "databases"
    assert "secret" not in str(one)
    # A password given as a parameter may hold '@': the folder is still the host's.
    three = data_dir_for("postgresql://u@db.example:5432/one?password=se@cret")
    assert three == one and "cret" not in str(three)
    assert data_dir_for(f"sqlite:///{tmp_path}/x.db") == tmp_path / "kinbox-data"


def test_a_sqlite_file_reached_through_a_symlink_keeps_one_data_directory(
        tmp_path: Path) -> None:
    # The owner lock resolves the link (one database, one runtime); the files folder did
    # not: a runtime started through the link made a second device key, which opens none
    # of the tokens the first one sealed and which no paired peer knows.
    real = tmp_path / "real" / "x.db"
    real.parent.mkdir()
    real.touch()
    link = tmp_path / "elsewhere" / "link.db"
    link.parent.mkdir()
    link.symlink_to(real)
    assert data_dir_for(f"sqlite:///{link}") == real.parent / "kinbox-data"
    assert data_dir_for(f"sqlite:///{real}") == real.parent / "kinbox-data"
    (link.parent / "kinbox-data").mkdir()  # an older kinbox's, beside the link: still used
    assert data_dir_for(f"sqlite:///{link}") == link.parent / "kinbox-data"
    (real.parent / "kinbox-data").mkdir()  # unless the file has its own
    assert data_dir_for(f"sqlite:///{link}") == real.parent / "kinbox-data"


@pytest.mark.timeout(30)
def test_the_version_is_exported() -> None:
    assert kinbox.actors.__version__.count(".") >= 2


@pytest.mark.timeout(60)
def test_kinbox_version_prints_the_installed_version_and_exits() -> None:
    done = subprocess.run([sys.executable, "-m", "kinbox.actors", "--version"],
                          capture_output=True, text=True, timeout=50)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"kinbox {kinbox.actors.__version__}\n", "")


# -- 19. logs: failures with ids, never bodies above DEBUG ----------------------------


def test_a_failed_turn_is_logged_with_its_ids_and_without_its_body(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    def brain(turn: Turn) -> None:
        raise ValueError("the model returned garbage")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        mid = rt.post(b, "TOP-SECRET body", sender=a).message_id
        rt.run_until_idle()
    failures = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert any(mid in r.getMessage() and b in r.getMessage() and "ValueError" in r.getMessage()
               for r in failures)
    assert any(r.levelno == logging.DEBUG and mid in r.getMessage() and b in r.getMessage()
               for r in caplog.records)  # DEBUG tells which row went to which session
    assert any(r.levelno == logging.DEBUG and "ValueError: the model returned garbage"
               in r.getMessage() for r in caplog.records)  # the error's text: DEBUG only
    above_debug = [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG]
    assert not any("TOP-SECRET" in m or "garbage" in m for m in above_debug)


# -- 20. turn timeout, cancel, bulk requeue -----------------------------------------------


def test_a_turn_past_the_turn_timeout_is_stopped_and_counted_a_failed_attempt(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    started = threading.Event()
    commits: list[str] = []

    def brain(turn: Turn) -> None:
        started.set()
        if turn.wait_stop_requested(30):
            turn.reply("too late")
            return
        commits.append("ran to the end")

    rt = make_runtime(brain=brain, turn_timeout=10.0)
    a, b = two_sessions(rt)
    rt.post(b, "think hard", sender=a)
    assert started.wait(10)
    clock.advance(11)  # the next tick asks the turn to stop; its end is a failed attempt
    wait_for(lambda: rt.inbox()[0]["attempts"] == 1, what="the timed-out attempt")
    row = rt.inbox()[0]
    assert row["status"] == "pending"
    assert row["last_error"].startswith("TurnTimeout: the turn ran 11.0 s")
    assert rt.transcript(b) == [] and commits == []


def test_cancelling_a_row_in_backoff_lets_the_rows_behind_it_run_now(
        make_runtime: MakeRuntime) -> None:
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        ran.append(turn.messages[0].content)
        if turn.messages[0].content == "poison":
            raise RuntimeError("cannot handle this one")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    poison = rt.post(b, "poison", sender=a).message_id
    rt.post(b, "next", sender=a)
    rt.run_until_idle()
    assert ran == ["poison"]
    row = rt.cancel(poison, "it crashes the model", by="alice")
    assert row["status"] == "cancelled"
    rt.run_until_idle()
    assert ran == ["poison", "next"]
    history = rt.context.journal.history(poison)
    assert history[-1]["event"] == "cancelled"
    assert history[-1]["detail"] == "by alice: it crashes the model"
    with pytest.raises(IllegalTransition):  # terminal: it stays cancelled
        rt.requeue(poison)


def test_requeue_failed_sends_back_every_failed_row_of_a_filter(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    broken = threading.Event()
    broken.set()

    def brain(turn: Turn) -> None:
        if broken.is_set():
            raise RuntimeError("down")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    for text in ("one", "two"):
        rt.post(b, text, sender=a)
    rt.post(a, "three", sender=b)
    for _ in range(12):
        rt.run_until_idle()
        clock.advance(60)
    assert [r["status"] for r in rt.inbox()] == ["failed"] * 3
    broken.clear()
    assert len(rt.requeue_failed(target=b)) == 2
    rt.run_until_idle()
    assert [(r["target_chat_id"], r["status"]) for r in rt.inbox()] == [
        (b, "delivered"), (b, "delivered"), (a, "failed")]
    assert len(rt.requeue_failed()) == 1
    rt.run_until_idle()
    assert {r["status"] for r in rt.inbox()} == {"delivered"}


# -- 14. transcript entries say who spoke -------------------------------------------------


def test_entries_record_sender_and_kind_and_show_them_to_brain_and_reader(
        make_runtime: MakeRuntime) -> None:
    prompts: list[str] = []

    def brain(turn: Turn) -> None:
        prompts.extend(m.as_prompt() for m in turn.messages)
        turn.reply("noted")

    rt = make_runtime(brain=brain)
    alice, bob = two_sessions(rt)
    rt.tools_for(alice).agent_send(bob, "Hello Bob!")
    rt.run_until_idle()
    rt.post(bob, "and from the human")
    rt.run_until_idle()
    first = rt.transcript(bob)[0]
    assert (first.role, first.sender_id, first.kind) == ("user", alice, "agent_message")
    assert prompts == [f"agent_message from {alice}: Hello Bob!", "user: and from the human"]
    assert rt.tools_for(alice).agent_read(bob)["transcript"] == (
        f"agent_message from {alice}: Hello Bob!\n\nassistant: noted\n\n"
        "user: and from the human\n\nassistant: noted")


# -- a message whose turn kills its process ends failed (hardening) ------------------------


def test_a_takeover_counts_an_attempt_only_when_the_interrupted_turn_had_started(
        db_url: str) -> None:
    from kinbox.persistence import NewMessage

    from .conftest import Stores

    stores = Stores(db_url)
    try:
        stores.store.create_session("victim", None, "Victim", "interactive", 0)
        stores.journal.enqueue(NewMessage("poison", "victim", "kills the process"), 0)
        first = stores.journal.claim("dead-0", 0.0, lease=30).rows[0]
        assert (first.attempts, first.taken_over) == (0, False)
        # Killed between claim and brain, twice: nothing counts, but the row is suspect.
        for life in (1, 2):
            row = stores.journal.claim(f"dead-{life}", life * 100.0, lease=30).rows[0]
            assert (row.attempts, row.taken_over) == (0, True)
        # From now on each life records the turn's start, then dies inside the turn.
        for life in range(3, 8):
            row = stores.journal.claim(f"dead-{life}", life * 100.0, lease=30).rows[0]
            assert (row.attempts, row.taken_over) == (life - 3, True)
            stores.journal.mark_turn_started(f"dead-{life}", "poison", life * 100.0 + 1)
        assert stores.journal.claim("dead-8", 800.0, lease=30).rows == []
        row_dict = stores.journal.get("poison")
        assert (row_dict["status"], row_dict["attempts"]) == ("failed", 5)
        assert row_dict["last_error"].startswith("Interrupted: the turn of this message never "
                                                 "finished 5 time(s) (last held by dead-7")
        events = [h["event"] for h in stores.journal.history("poison")]
        assert events == ["interrupted"] * 4 + ["failed"]
    finally:
        stores.close()


@pytest.mark.timeout(120)
def test_a_poison_message_that_kills_its_process_ends_failed_and_the_rest_is_delivered(
        tmp_path: Path, db_url: str) -> None:
    setup = Runtime(db=db_url).start()  # send-only: it only writes
    project = setup.create_project("poison")
    victim = setup.create_session(project.id, "Victim").id
    others = [setup.create_session(project.id, f"Other {i}").id for i in range(10)]
    poison = setup.post(victim, "poison").message_id
    for i in range(100):
        setup.post(others[i % 10], f"fine {i}")
    setup.stop()
    child = str(Path(__file__).with_name("poison_child.py"))
    codes = []
    for _ in range(9):  # each life dies in the poison turn, until the row is failed
        done = subprocess.run([sys.executable, child, db_url], capture_output=True, text=True,
                              timeout=90)
        codes.append(done.returncode)
        if done.returncode == 0:
            break
    assert codes == [9] * 6 + [0]  # the first death makes it suspect, five more count
    rt = Runtime(db=db_url, brain=quiet_brain).start()
    try:
        rows = {r["message_id"]: r for r in rt.inbox()}
        assert (rows[poison]["status"], rows[poison]["attempts"]) == ("failed", 5)
        assert "Interrupted" in rows[poison]["last_error"]
        assert sorted(r["status"] for m, r in rows.items() if m != poison) == ["delivered"] * 100
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_the_folders_kinbox_makes_are_its_users_alone(tmp_path: Path) -> None:
    """The database holds every message: a folder kinbox creates for it (and for the device
    key and Focal's files) is not readable by other users of the machine."""
    url = f"sqlite:///{tmp_path / 'new' / 'app.db'}"
    with Runtime(db=url, brain=lambda turn: None) as rt:
        rt.get_or_create_focal_chat()
        assert rt.peers.identity.device_id  # the device key, made on first use
    for folder in (tmp_path / "new", tmp_path / "new" / "kinbox-data"):
        assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)


@pytest.mark.timeout(30)
def test_a_database_folder_that_cannot_be_made_is_a_database_open_error_naming_it(
        tmp_path: Path) -> None:
    """A file where the database's folder should be: the runtime's start raised a bare
    NotADirectoryError (or FileExistsError), outside kinbox's errors."""
    (tmp_path / "afile").write_text("not a folder")
    for url in (f"sqlite:///{tmp_path / 'afile' / 'sub' / 'k.db'}",
                f"sqlite:///{tmp_path / 'afile' / 'k.db'}"):
        with pytest.raises(DatabaseOpenError) as refused:
            Runtime(db=url, brain=lambda turn: None).start()
        assert str(tmp_path / "afile") in refused.value.reason
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]  # nothing made beside it
