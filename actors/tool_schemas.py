"""JSON Schemas of the agent tools, for a model's function calling. Pure.

One table: each tool's description and parameters (types, ranges, enums,
required fields). ``schemas(names)`` gives them in the OpenAI
function-calling shape (``{"type": "function", "function": {...}}``) or the
MCP shape (``{"name", "description", "inputSchema"}``); ``check_call``
refuses a call whose arguments the schema does not allow before the tool
runs. The tools still validate every value themselves, so a schema can
only narrow what a model sends, never widen it; ``tests/test_tool_schemas.py``
checks each schema against its method's real signature and behaviour.
"""

from __future__ import annotations

import copy
from typing import Any

from .cron_rules import EXPRESSION_LIMIT
from .errors import ToolError
from .focal_policy import NOTE_LIMIT
from .task_rules import REASON_LIMIT
from .validation import CHILD_LIMIT, ID_LIMIT, SEND_LIMIT, TITLE_LIMIT, quoted

Schema = dict[str, Any]

_ID = {"type": "string", "minLength": 1, "maxLength": ID_LIMIT}
_TEXT = {"type": "string", "minLength": 1, "maxLength": SEND_LIMIT}
_TITLE = {"type": "string", "minLength": 1, "maxLength": TITLE_LIMIT}
_TASK_STATUS = ["pending", "in_progress", "blocked", "completed", "cancelled"]

TOOLS: dict[str, tuple[str, Schema, tuple[str, ...]]] = {
    "agent_list": (
        "List the agent sessions of your project you can message, newest first.",
        {
            "status": {
                "type": "string",
                "enum": ["recent", "active"],
                "description": "recent: all; active: only those running a turn now",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        (),
    ),
    "agent_read": (
        "Read another session's visible transcript (newest messages kept).",
        {"agent_id": {**_ID, "description": "the session id, e.g. chat-1f2e3d4c5b6a"}},
        ("agent_id",),
    ),
    "agent_send": (
        "Send a message to another session of your project; it is queued durably.",
        {
            "agent_id": {**_ID, "description": "the target session id"},
            "message": {**_TEXT, "description": "the message text"},
        },
        ("agent_id", "message"),
    ),
    "agent_stop": ("Ask another session's running turn to stop.", {"agent_id": _ID}, ("agent_id",)),
    "agent": (
        "Start a sub-agent for a piece of work; it reports back when done. At most "
        f"{CHILD_LIMIT} of yours run at once.",
        {
            "description": {**_TEXT, "description": "what the sub-agent should do"},
            "run_in_background": {
                "type": "boolean",
                "description": "false: wait for the result (up to timeout)",
            },
            "title": _TITLE,
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "maximum": 3600,
                "description": "seconds to wait in the foreground",
            },
        },
        ("description",),
    ),
    "list_agents": ("List your family: parent, siblings and children.", {}, ()),
    "send": (
        "Message a family member by role (and name), or everyone with message='all'.",
        {
            "message": {"type": "string", "minLength": 1, "maxLength": 16_384},
            "receiver_role": {
                "type": "string",
                "maxLength": 16_384,
                "description": "parent, sibling or child; with message='all', "
                "the text to broadcast",
            },
            "receiver_name": {"type": "string", "description": "sibling's or child's name or id"},
        },
        ("message",),
    ),
    "task_create": (
        "Create a task of your own session.",
        {"title": _TITLE, "status": {"type": "string", "enum": ["pending", "in_progress"]}},
        ("title",),
    ),
    "task_update": (
        "Change one of your tasks: its status, what it is blocked on, or the reason.",
        {
            "task_id": _ID,
            "status": {"type": "string", "enum": _TASK_STATUS},
            "blocked_on": {
                "type": "string",
                "enum": ["user", "error"],
                "description": "with status=blocked",
            },
            "reason": {"type": "string", "maxLength": REASON_LIMIT},
        },
        ("task_id",),
    ),
    "task_list": ("List your own tasks, oldest first.", {}, ()),
    "schedule_wakeup": (
        "Schedule a durable wake-up of yourself: at a time, or on a cron expression.",
        {
            "kind": {"type": "string", "enum": ["reminder", "check"]},
            "at": {
                "type": ["number", "string"],
                "description": "epoch seconds or an ISO 8601 time, UTC unless it has an "
                "offset (or give cron)",
            },
            "cron": {
                "type": "string",
                "maxLength": EXPRESSION_LIMIT,
                "description": "a crontab expression, in UTC (or give at)",
            },
            "note": {"type": "string", "maxLength": NOTE_LIMIT},
        },
        ("kind",),
    ),
}
"""name -> (description, properties, required)."""

FOCAL_SEND_EXTRAS: Schema = {
    "agent_id": {**_ID, "description": "a session id, or 'new' to start a session"},
    "project_id": {**_ID, "description": "with agent_id='new': the project"},
    "title": {**_TITLE, "description": "with agent_id='new'"},
    "task_title": {**_TITLE, "description": "with agent_id='new'"},
}
"""What ``agent_send`` also takes from the Focal agent."""


def parameters(name: str, *, focal: bool = False) -> Schema:
    """The JSON Schema (draft 2020-12) of ``name``'s arguments."""
    _, props, required = TOOLS[name]
    props = copy.deepcopy(props)
    if focal and name == "agent_send":
        props.update(copy.deepcopy(FOCAL_SEND_EXTRAS))
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


def schemas(names: list[str], shape: str = "openai", *, focal: bool = False) -> list[Schema]:
    """The schemas of ``names`` in the ``openai`` or ``mcp`` shape."""
    if shape not in ("openai", "mcp"):
        raise ToolError("invalid_argument", f"shape must be 'openai' or 'mcp', got {shape!r}.")
    out = []
    for name in names:
        description = TOOLS[name][0]
        params = parameters(name, focal=focal)
        out.append(
            {
                "type": "function",
                "function": {"name": name, "description": description, "parameters": params},
            }
            if shape == "openai"
            else {"name": name, "description": description, "inputSchema": params}
        )
    return out


def object_arguments(name: str, arguments: object) -> dict[str, Any]:
    """A call's arguments as the JSON object every tool takes (None: no arguments), or the
    ToolError the model should see (a list, a string, a number; names that are no strings)."""
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise ToolError(
            "invalid_argument",
            f"{name} takes its arguments as a JSON object, not {type(arguments).__name__}.",
        )
    odd = [k for k in arguments if not isinstance(k, str)]
    if odd:
        raise ToolError(
            "invalid_argument",
            f"{name}'s argument names must be strings, not {', '.join(quoted(k) for k in odd)}.",
        )
    return arguments


def check_call(
    held: list[str], name: object, arguments: object, *, focal: bool = False
) -> dict[str, Any]:
    """The arguments of a model's call to ``name``, or the ToolError the model should see."""
    if not isinstance(name, str) or name not in held:
        raise ToolError(
            "not_found", f"No tool named {quoted(name)}; the tools you hold are: {', '.join(held)}."
        )
    arguments = object_arguments(name, arguments)
    params = parameters(name, focal=focal)
    unknown = sorted(set(arguments) - set(params["properties"]))
    if unknown:
        takes = ", ".join(params["properties"]) or "no arguments"
        raise ToolError(
            "invalid_argument",
            f"{name} has no argument {', '.join(quoted(u) for u in unknown)}; it takes {takes}.",
        )
    missing = [r for r in params["required"] if r not in arguments]
    if missing:
        raise ToolError("invalid_argument", f"{name} needs {', '.join(missing)}.")
    return dict(arguments)
