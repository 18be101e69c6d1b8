"""Boundaries under generated input: whatever a caller, a peer or an HTTP client sends gets
an error of kinbox's own tree (or a precise 4xx), never a bare ``ValueError`` and never a
half-written row. Each example found by fuzzing is pinned here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kinbox.actors import ConfigError, Runtime, ToolError
from kinbox.actors.cli import main
from kinbox.transport.peer_client import endpoint

from .helpers import quiet_brain

MakeRuntime = Callable[..., Runtime]
CODE = "kbp_" + "a" * 43
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
@settings(max_examples=200, deadline=None)
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
