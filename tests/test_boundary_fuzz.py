"""Boundaries under generated input: whatever a caller, a peer or an HTTP client sends gets
an error of kinbox's own tree (or a precise 4xx), never a bare ``ValueError`` and never a
half-written row. Each example found by fuzzing is pinned here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kinbox.actors import (
    ConfigError,
    Runtime,
    ToolError,
    cron_rules,
    social_rules,
    tool_schemas,
    triggers,
)
from kinbox.actors.cli import main
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import new_code
from kinbox.transport.peer_client import endpoint

from .helpers import quiet_brain

MakeRuntime = Callable[..., Runtime]
CODE = new_code(DeviceIdentity.generate().public_key, b"a" * 32)
"""A well-formed pairing code (no device issued it; every address below is refused first)."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", ["http://[::1", "http://h:99999", "http://h:abc",
                                 "http://[zz]:1", "ftp://h", "http://", "http://:80", "h"])
def test_a_malformed_pairing_address_is_a_config_error_naming_the_url(
        make_runtime: MakeRuntime, tmp_path: Path, url: str) -> None:
    """``urlsplit`` refuses a broken IPv6 literal, and a port past 65535 or not a number,
    with a bare ``ValueError``: that reached ``rt.peers.pair``'s caller as it was."""
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    with pytest.raises(ConfigError) as info:
        rt.peers.pair(url, CODE)
    assert info.value.field == "url"
    assert rt.peers.peers.devices() == []


@pytest.mark.timeout(30)
@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=40))
@example("http://[::1")
@example("ws://[v1.x]:1")
def test_endpoint_gives_a_websocket_url_or_a_value_error(url: str) -> None:
    try:
        got = endpoint(url, "/peers/pair")
    except ValueError:
        return
    assert got.startswith(("ws://", "wss://")) and got.endswith("/peers/pair")


UNUSABLE = ["\ud800", "a\x00", 7, None, ["x"]]
"""Values no row can hold as a key: a lone surrogate (no UTF-8), a NUL (PostgreSQL refuses
it), and what is not a string at all."""


@pytest.mark.timeout(60)
def test_lookups_with_a_key_no_row_can_have_find_nothing(make_runtime: MakeRuntime,
                                                         tmp_path: Path) -> None:
    """``rt.project``, ``rt.sessions`` and ``rt.requeue_failed`` sent a lone surrogate to the
    driver, which raised ``UnicodeEncodeError`` (PostgreSQL: a NUL, ``ValueError``);
    ``rt.session`` and ``rt.transcript`` already answered None and []."""
    rt = make_runtime(data_dir=tmp_path / "data")
    for key in UNUSABLE:
        assert rt.project(key) is None  # type: ignore[arg-type]
        if key is not None:  # None: every project's sessions
            assert rt.sessions(key) == []  # type: ignore[arg-type]
        assert rt.requeue_failed(target=key) == []  # type: ignore[arg-type]
        assert rt.requeue_failed(kind=key) == []  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", UNUSABLE)
def test_entry_points_refuse_an_unusable_argument_as_a_config_error_naming_it(
        make_runtime: MakeRuntime, tmp_path: Path, value: object) -> None:
    """``rt.cancel(by=...)`` and ``rt.create_project(hidden=...)`` took anything: a lone
    surrogate failed deep in the commit, an int or a list was stored as the canceller, a
    string as the hidden flag; ``rt.tools_for`` passed its id to the driver."""
    rt = make_runtime(data_dir=tmp_path / "data")
    project = rt.create_project("team")
    sid = rt.create_session(project.id, "A").id
    row = rt.post(sid, "hello")
    with pytest.raises(ConfigError) as info:
        rt.cancel(row.message_id, "no longer needed", by=value)  # type: ignore[arg-type]
    assert info.value.field == "by"
    assert [r["status"] for r in rt.inbox()] == ["pending"]  # nothing half-written
    with pytest.raises(ConfigError) as info:
        rt.create_project("other", hidden=value)  # type: ignore[arg-type]
    assert info.value.field == "hidden"
    assert rt.project("other") is None
    with pytest.raises(ConfigError) as info:
        rt.tools_for(value)  # type: ignore[arg-type]
    assert info.value.field == "session_id"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["peers", "whoami"], ["peers", "invite"], ["serve"],
                                     ["worker"]])
def test_an_empty_data_dir_flag_is_a_usage_error_and_writes_no_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str]) -> None:
    """``--data-dir ""`` (an unset variable) put ``kinbox peers``' device key in the current
    directory, while ``serve`` and ``worker`` took it as no flag: two device keys for one
    database, and a private key wherever the command happened to run."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*command, "--db", f"sqlite:///{tmp_path / 'k.db'}", "--data-dir", ""])
    assert info.value.code == 2
    assert "--data-dir" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("args", "kwargs"), [((7,), {}), (({"x": 1},), {}), (("",), {}),
                                              (("b\x00",), {}), (("bash",), {"group": 3}),
                                              (("bash",), {"discoverable": "no"})])
def test_a_tool_registered_with_a_bad_argument_is_refused_and_search_still_works(
        make_runtime: MakeRuntime, tmp_path: Path, args: tuple[object, ...],
        kwargs: dict[str, object]) -> None:
    """``rt.focal.register_tool(7)`` was kept, and every later ``search_tools`` raised
    ``TypeError`` sorting an int among the names; a dict name was a bare ``TypeError``."""
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    rt.focal.register_tool("bash", group="shell")
    with pytest.raises(ToolError) as info:
        rt.focal.register_tool(*args, **kwargs)  # type: ignore[arg-type]
    assert info.value.code == "invalid_argument"
    sid = rt.create_session(rt.create_project("web").id, "A").id
    assert rt.focal.search_tools(sid, "bas") == ["bash"]


@pytest.mark.timeout(60)
def test_tool_search_refuses_a_query_that_is_not_text_and_finds_no_session_for_a_bad_id(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    rt.focal.register_tool("bash", group="shell")
    with pytest.raises(ToolError):
        rt.focal.search_tools("chat-x", None)  # type: ignore[arg-type]  # AttributeError
    assert rt.focal.search_tools("\ud800", "ba") == ["bash"]  # was UnicodeEncodeError


# -- properties over the pure boundary rules (derandomized: the same examples every run) --

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
NEAR_EVENT = st.fixed_dictionaries(
    {"sender_id": st.one_of(st.just("U1"), JSON), "thread_id": st.one_of(st.just("t"), JSON),
     "text": st.one_of(st.just("hi"), JSON)},
    optional={"sender_name": JSON, "attachments": JSON, "reply_route": JSON, "event_id": JSON,
              "platform": st.one_of(st.just("slack"), JSON)})


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(NEAR_EVENT, JSON), st.sampled_from([None, "slack"]))
def test_a_social_event_is_normalized_or_refused_as_invalid(raw: object,
                                                            platform: str | None) -> None:
    try:
        event = social_rules.normalize(raw, "social-x", platform)
    except social_rules.InvalidSocialEvent:
        return
    assert social_rules.session_id_for(event.platform, event.thread_id).startswith("social-")
    social_rules.envelope(event)


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=12), st.sampled_from(["agent_send", "send", "agent_list"])),
       st.one_of(JSON, st.dictionaries(st.sampled_from(["agent_id", "message", "limit", 1]),
                                       JSON, max_size=3)))
def test_a_model_tool_call_is_checked_or_refused_as_a_tool_error(name: str,
                                                                 arguments: object) -> None:
    try:
        tool_schemas.check_call(list(tool_schemas.TOOLS), name, arguments)
    except ToolError as exc:
        assert exc.code in ("not_found", "invalid_argument")


CRON_FIELD = st.sampled_from(["*", "0", "7", "59", "60", "*/0", "*/5", "1-5", "5-1", "mon",
                              "sun-sat", "L", "?", "1,2", "9" * 30, "-1", "\u0663", "\u00b2"])


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.lists(CRON_FIELD, max_size=6).map(" ".join), st.text(max_size=20)),
       st.sampled_from(["UTC", "Europe/Paris", "Europe", "", "x" * 300, "UTC\x00"]))
def test_a_crontab_gives_a_next_time_or_a_cron_error(expr: str, timezone: str) -> None:
    try:
        upcoming = triggers.next_fire(expr, 1_700_000_000.0, timezone)
    except cron_rules.CronError:
        return
    assert upcoming is None or upcoming > 1_700_000_000.0
