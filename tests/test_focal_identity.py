"""Who counts as Focal: one rule (``access.is_focal``), and only the runtime makes the Focal chat.

Before, ``access`` trusted ``kind == "focal"`` and ``focal`` trusted the
fixed id, a config flag or the platform: a product's session with
``kind="focal"`` read other projects, one with ``is_focal_agent`` started
sessions in them. Here a product cannot create such a session through the
runtime, and a row that carries those markers anyway (written below the
runtime, as an old database might hold) gets no Focal power.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ConfigError, Runtime, ToolError
from kinbox.actors.access import FOCAL_ID, Subject, focal_claim, is_focal
from kinbox.actors.focal import is_focal_chat

from .helpers import quiet_brain

MakeRuntime = Callable[..., Runtime]

POSING = [
    ("kind", {"kind": "focal"}),
    ("config", {"config": {"is_focal_agent": True}}),
    ("config", {"config": {"platform": "focal"}}),
    ("platform", {"platform": "focal"}),
    ("session_id", {"session_id": FOCAL_ID}),
]


@pytest.fixture
def two_projects(make_runtime: MakeRuntime, tmp_path: Path) -> tuple[Runtime, str, str, str]:
    """A runtime with projects A and B, and a session in B."""
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    a = rt.create_project("alpha").id
    b = rt.create_project("beta").id
    secret = rt.create_session(b, "B's work")
    return rt, a, b, secret.id


def sessions_in(rt: Runtime, project_id: str) -> list[str]:
    return sorted(s.id for s in rt.sessions(project_id=project_id))


@pytest.mark.parametrize(("field", "posing"), POSING, ids=[f"{f}-{i}" for i, (f, _) in
                                                          enumerate(POSING)])
def test_a_product_cannot_create_a_second_focal(two_projects: tuple[Runtime, str, str, str],
                                                field: str, posing: dict[str, Any]) -> None:
    rt, a, _, _ = two_projects
    before = sessions_in(rt, a)
    with pytest.raises(ConfigError) as refused:
        rt.create_session(a, "impostor", **posing)
    assert refused.value.field == field
    assert sessions_in(rt, a) == before  # nothing written
    assert rt.session(FOCAL_ID) is None


def forge(rt: Runtime, project_id: str, kind: str = "interactive", platform: str | None = None,
          config: dict[str, Any] | None = None) -> str:
    """A session row carrying Focal markers, written below the runtime's checks."""
    sid = f"chat-forged-{kind}-{platform}-{len(rt.sessions())}"
    rt.context.store.create_session(sid, project_id, "forged", kind, rt.context.now(),
                                    platform=platform, config=config)
    return sid


def test_a_session_of_kind_focal_in_a_cannot_read_b(
        two_projects: tuple[Runtime, str, str, str]) -> None:
    rt, a, _, secret = two_projects
    forged = forge(rt, a, kind="focal", platform="focal", config={"is_focal_agent": True})
    tools = rt.tools_for(forged)
    with pytest.raises(ToolError) as refused:
        tools.agent_read(secret)
    assert refused.value.code == "not_found"
    with pytest.raises(ToolError):
        tools.agent_send(secret, "hello from A")
    assert rt.inbox(target=secret) == []


def test_a_config_flagged_session_cannot_start_sessions_in_b(
        two_projects: tuple[Runtime, str, str, str]) -> None:
    rt, a, b, _ = two_projects
    before = sessions_in(rt, b)
    for config, platform in (({"is_focal_agent": True}, None), ({"platform": "focal"}, None),
                             ({}, "focal")):
        forged = forge(rt, a, platform=platform, config=config)
        with pytest.raises(ToolError):
            rt.tools_for(forged).agent_send("new", "work for B", project_id=b, title="sneaky")
        with pytest.raises(ToolError):
            rt.tools_for(forged).schedule_wakeup("reminder", at=rt.context.now() + 60)
    assert sessions_in(rt, b) == before


def test_the_real_focal_chat_still_reaches_and_dispatches_everywhere(
        two_projects: tuple[Runtime, str, str, str]) -> None:
    rt, _, b, secret = two_projects
    chat = rt.get_or_create_focal_chat()
    assert is_focal_chat(chat)
    tools = rt.tools_for(chat.id)
    assert tools.agent_read(secret)["agent_id"] == secret
    started = tools.agent_send("new", "work for B", project_id=b, title="from Focal")
    assert rt.session(started["agent_id"]).project_id == b  # type: ignore[union-attr]


def test_the_one_predicate() -> None:
    assert is_focal(Subject(FOCAL_ID, "suzent-focal", "focal"))
    assert not is_focal(Subject(FOCAL_ID, "p1", "interactive"))  # the id alone is not enough
    assert not is_focal(Subject("chat-1", "p1", "focal"))  # nor the kind alone
    assert not is_focal(Subject("chat-1", "p1", "interactive", platform="focal"))
    assert focal_claim(None, "interactive", None, {"is_focal_agent": False}) is None
    assert focal_claim("chat-1", "interactive", "desktop", {"tools": ["bash"]}) is None
