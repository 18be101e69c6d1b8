"""Text no database can hold is refused where it enters, or escaped where kinbox records it.

A lone surrogate cannot be encoded as UTF-8 and PostgreSQL's ``text`` refuses NUL.
Accepted at a boundary, such text fails later, inside a commit, where nobody can act on
it: the row's lease runs out, the turn runs again and fails the same way. So tool
arguments and replies are refused at once with a clear error, and what kinbox records
of a brain's failure (its exception text) is escaped.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kinbox.actors import ConfigError, ManualClock, RowNotFound, Runtime, ToolError, Turn

MakeRuntime = Callable[..., Runtime]
SURROGATE = "\ud800"


def _reply_once(make_runtime: MakeRuntime, given: object
                ) -> tuple[Runtime, str, list[BaseException]]:
    """A runtime whose brain replies ``given`` to one message, run until idle: the runtime,
    the session and what the reply raised."""
    refusals: list[BaseException] = []

    def brain(turn: Turn) -> None:
        try:
            turn.reply(given)  # type: ignore[arg-type]
        except Exception as exc:
            refusals.append(exc)
            raise

    rt = make_runtime(brain=brain)
    s = rt.create_session(rt.create_project("p").id, "A")
    rt.post(s.id, "go")
    rt.run_until_idle()
    return rt, s.id, refusals


def test_a_reply_that_cannot_be_stored_fails_the_attempt_with_a_clear_error(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    rt, sid, refusals = _reply_once(make_runtime, f"half {SURROGATE} an emoji")
    assert isinstance(refusals[0], ConfigError)
    [row] = rt.inbox(target=sid)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert refusals[0].field == "text" and "lone surrogate" in str(refusals[0])
    assert row["last_error"].rstrip().endswith(str(refusals[0]))
    assert rt.transcript(sid) == []  # nothing of the attempt was written


@pytest.mark.parametrize("given", [None, 42, b"bytes", {"text": "a model's response"}],
                         ids=["none", "int", "bytes", "dict"])
def test_a_reply_that_is_no_text_is_a_kinbox_error_naming_the_text(
        make_runtime: MakeRuntime, clock: ManualClock, given: object) -> None:
    """``turn.reply`` refused a value that is no ``str`` (a model's response object handed
    over whole, a None) with a bare ``TypeError``, outside the one exception tree that
    every other refusal of a turn's call is in (a reply that cannot be stored, a
    history's limit: ``ConfigError`` with its ``.field``)."""
    rt, sid, refusals = _reply_once(make_runtime, given)
    [refusal] = refusals
    assert isinstance(refusal, ConfigError) and refusal.field == "text"
    assert type(given).__name__ in str(refusal)
    [row] = rt.inbox(target=sid)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert rt.transcript(sid) == []  # nothing of the attempt was written


def test_a_brain_exception_with_unstorable_text_is_recorded_escaped(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str) -> None:
    """On PostgreSQL the NUL alone left the row ``processing`` until its lease ran out."""
    attempts: list[int] = []

    def brain(turn: Turn) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError(f"bad bytes {SURROGATE} and \x00 from the model")
        turn.reply("recovered")

    rt = make_runtime(brain=brain, db=any_db_url)
    s = rt.create_session(rt.create_project("p").id, "A")
    rt.post(s.id, "go")
    rt.run_until_idle()
    [row] = rt.inbox(target=s.id)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert row["last_error"].rstrip().endswith(
        "RuntimeError: bad bytes \\ud800 and \\x00 from the model")
    clock.advance(2.0)
    rt.run_until_idle()
    assert len(attempts) == 2 and rt.inbox(target=s.id)[0]["status"] == "delivered"


@pytest.mark.parametrize(("reason", "fragment"), [
    (f"waiting {SURROGATE}", "reason is not valid Unicode"),
    ("waiting \x00", "reason contains a NUL character"),
    ("x" * 2_001, "reason is 2,001 characters; the limit is 2,000"),
])
def test_a_task_reason_that_cannot_be_stored_is_refused(
        make_runtime: MakeRuntime, reason: str, fragment: str) -> None:
    rt = make_runtime()
    s = rt.create_session(rt.create_project("p").id, "A")
    tools = rt.tools_for(s.id)
    task = tools.task_create("ship it")
    with pytest.raises(ToolError) as info:
        tools.task_update(task["task_id"], status="blocked", blocked_on="user", reason=reason)
    assert info.value.code == "invalid_argument" and fragment in info.value.message
    [stored] = tools.task_list()["tasks"]
    assert (stored["status"], stored["reason"]) == ("pending", None)


@pytest.mark.parametrize("field", ["title", "task_title"])
@pytest.mark.parametrize("bad", [f"fix {SURROGATE}", "x" * 513, "  "])
def test_focal_dispatch_with_a_bad_title_writes_nothing(
        make_runtime: MakeRuntime, field: str, bad: str) -> None:
    rt = make_runtime()
    rt.get_or_create_focal_chat()
    web = rt.create_project("web")
    before = {s.id for s in rt.sessions()}
    args = {"title": "Fix login", "task_title": "fix the login bug", field: bad}
    with pytest.raises(ToolError) as info:
        rt.tools_for("focal-suzent").agent_send(agent_id="new", project_id=web.id,
                                                message="please fix it", **args)
    assert info.value.code == "invalid_argument" and info.value.message.startswith(field)
    assert {s.id for s in rt.sessions()} == before
    assert rt.inbox() == []


@pytest.mark.parametrize("project_id", [f"web{SURROGATE}", "web\x00"])
def test_focal_dispatch_to_an_unstorable_project_id_is_refused(
        make_runtime: MakeRuntime, project_id: str) -> None:
    rt = make_runtime()
    rt.get_or_create_focal_chat()
    out = rt.tools_for("focal-suzent").call("agent_send", {
        "agent_id": "new", "project_id": project_id, "title": "t", "message": "m"})
    assert out["error"] == "invalid_argument" and out["message"].startswith("project_id")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"config": [1]}, "config"), ({"config": "str"}, "config"),
    ({"config": {"a": object()}}, "config"), ({"kind": []}, "kind"),
    ({"session_id": 5}, "session_id"), ({"session_id": "  "}, "session_id"),
    ({"session_id": "a\x00b"}, "session_id"), ({"platform": 7}, "platform"),
    ({"parent_id": "p\x00"}, "parent_id"),
])
def test_create_session_names_the_bad_argument_and_writes_nothing(
        make_runtime: MakeRuntime, any_db_url: str, kwargs: dict[str, object],
        field: str) -> None:
    rt = make_runtime(db=any_db_url)
    project = rt.create_project("p")
    before = len(rt.sessions())
    with pytest.raises(ConfigError) as info:
        rt.create_session(project.id, "title", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert len(rt.sessions()) == before


def test_lookups_of_an_id_no_database_can_hold_find_nothing(make_runtime: MakeRuntime,
                                                            any_db_url: str) -> None:
    """PostgreSQL fails a query with a NUL in a text parameter; SQLite finds nothing."""
    rt = make_runtime(db=any_db_url)
    bad = "a\x00b"
    assert rt.session(bad) is None and rt.transcript(bad) == []
    assert rt.inbox(target=bad) == []
    with pytest.raises(ConfigError) as info:
        rt.create_session(f"p{bad}", "title")
    assert info.value.field == "project_id"
    for operator in (lambda: rt.requeue(bad), lambda: rt.cancel(bad, "no")):
        with pytest.raises(RowNotFound):
            operator()


def test_run_until_idle_wants_a_number_of_seconds(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=lambda turn: None)
    for timeout in ("x", 0, True):
        with pytest.raises(ConfigError) as info:
            rt.run_until_idle(timeout)  # type: ignore[arg-type]
        assert info.value.field == "timeout"
