"""Boundaries under generated input: whatever a caller, a peer or an HTTP client sends gets
an error of kinbox's own tree (or a precise 4xx), never a bare ``ValueError`` and never a
half-written row. Each example found by fuzzing is pinned here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kinbox.actors import ConfigError, Runtime
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
