"""What the tests of the framework brains (pydantic-ai, the OpenAI Agents SDK,
autogen-core) share: the family whose Alice asks Bob to review a PR through a
model-issued ``agent_send``, and the refused tool calls every framework must hand back to
its model as the same readable errors."""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.actors import Runtime

REFUSED_TOOL_CALLS: list[Any] = [  # pytest.param each
    pytest.param(
        {"agent_id": "chat-nope"},
        {
            "error": "not_found",
            "message": "Agent 'chat-nope' is not available in the current project.",
        },
        id="no_such_agent",
    ),
    pytest.param(
        '{"agent_id": ',
        {
            "error": "invalid_argument",
            "message": "agent_read's arguments are not valid JSON "
            "(Expecting value at position 13).",
        },
        id="not_json",
    ),
    pytest.param(
        {"agent": "chat-nope"},
        {
            "error": "invalid_argument",
            "message": "agent_read has no argument 'agent'; it takes agent_id.",
        },
        id="unknown_argument",
    ),
]
"""(arguments of an ``agent_read`` call, the error its model must read back), each named."""

NESTED_TOO_DEEPLY = pytest.param(
    "[" * 100_000 + "]" * 100_000,
    {
        "error": "invalid_argument",
        "message": "agent_read's arguments are nested too deeply to read.",
    },
    id="nested_too_deeply",
)
"""Valid JSON nested deeper than Python's parser recurses: it raised ``RecursionError``, no
``ValueError``, and the attempt failed where the model should read a refusal. Where kinbox
parses the arguments (autogen's loop is kinbox's); the OpenAI Agents SDK parses them itself
first, in its tool planning, and fails the run the same way before kinbox's tool runs."""

TOO_MANY_DIGITS = pytest.param(
    '{"agent_id": ' + "7" * 5_000 + "}",
    {
        "error": "invalid_argument",
        "message": "agent_read's arguments hold a number too long to read.",
    },
    id="too_many_digits",
)
"""Valid JSON with an integer longer than Python converts (4,300 digits): the parser raised
a ``ValueError`` that is no ``JSONDecodeError``, reading it as one raised
``AttributeError``, and the attempt failed where the model should read a refusal. Where
kinbox parses the arguments (autogen's loop is kinbox's)."""


def pr_review_family(rt: Runtime, ids: dict[str, str]) -> None:
    """Alice and Bob in project ``prs``; their ids into ``ids`` (which the brains read)."""
    project = rt.create_project("prs")
    ids["alice"] = rt.create_session(project.id, "Alice").id
    ids["bob"] = rt.create_session(project.id, "Bob").id


def ask_for_review(rt: Runtime, ids: dict[str, str]) -> None:
    """Alice is asked to get PR 12 reviewed; the family runs until nothing is left."""
    rt.post(ids["alice"], "get PR 12 reviewed")
    rt.run_until_idle(timeout=30)


def assert_reviewed(rt: Runtime, ids: dict[str, str], alice_last: str) -> None:
    """Alice's ``agent_send`` landed once, delivered, and woke one turn of Bob's, which
    answered; Alice's last words are ``alice_last``; every message committed one turn."""
    sent = [r for r in rt.inbox() if r["target_chat_id"] == ids["bob"]]
    assert [(r["content"], r["sender_chat_id"], r["status"]) for r in sent] == [
        ("Please review PR 12", ids["alice"], "delivered")
    ]
    assert [e.text for e in rt.transcript(ids["bob"])] == [
        "Please review PR 12",
        "PR 12 looks good",
    ]
    assert rt.transcript(ids["alice"])[-1].text == alice_last
    assert set(rt.marker_counts().values()) == {1}
