"""The tool registry and the Focal tool policy (FO2). Pure.

Products register their tools (name, group, discoverable). A session's tool
request is resolved per turn; before every Focal turn the policy overrides
whatever was asked: the tools become the Focal list, every other registered
tool is denied, MCP is off, cwd and sandbox volumes are removed and the
permission is ``full_access``. ``schedule_wakeup`` has no group and is not
discoverable, so no other session can equip or find it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

SCHEDULE_WAKEUP = "schedule_wakeup"
NOTE_LIMIT = 2_000
"""Longest wake-up note (``schedule_wakeup``'s ``note``), in characters."""

FOCAL_TOOL_NAMES: tuple[str, ...] = (
    "agent_list", "agent_read", "agent_send", "agent_stop",
    "web_search", "web_fetch", "memory_search", "session_search", "ask_question", "skills",
    "read_file", "list_files", "glob", "grep",
    SCHEDULE_WAKEUP,
)
"""What the Focal agent holds, whatever a request asks for."""


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool. ``group`` empty means it cannot be equipped by group."""

    name: str
    group: str = ""
    discoverable: bool = True


BUILTIN_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("agent_list", "agents"), ToolSpec("agent_read", "agents"),
    ToolSpec("agent_send", "agents"), ToolSpec("agent_stop", "agents"),
    ToolSpec("agent", "agents"), ToolSpec(SCHEDULE_WAKEUP, "", discoverable=False),
)


@dataclass(frozen=True)
class ToolRequest:
    """What a turn runs with: its tools and their surroundings."""

    tools: tuple[str, ...] = ()
    denied_tools: tuple[str, ...] = ()
    mcp_enabled: bool = True
    cwd: str | None = None
    sandbox_volumes: tuple[str, ...] = ()
    permission_mode: str = "ask"
    extra: Mapping[str, object] = field(default_factory=dict)


def apply_focal_tool_policy(request: ToolRequest, registry: Iterable[ToolSpec]) -> ToolRequest:
    """The Focal turn's request: the Focal list, everything else denied, no MCP/cwd/volumes."""
    denied = tuple(sorted({t.name for t in registry} - set(FOCAL_TOOL_NAMES)))
    return replace(request, tools=FOCAL_TOOL_NAMES, denied_tools=denied, mcp_enabled=False,
                   cwd=None, sandbox_volumes=(), permission_mode="full_access")


def ordinary_request(request: ToolRequest) -> ToolRequest:
    """A non-Focal session never holds ``schedule_wakeup``, whatever it asked for."""
    if SCHEDULE_WAKEUP not in request.tools:
        return request
    return replace(request, tools=tuple(t for t in request.tools if t != SCHEDULE_WAKEUP))


def search_tools(registry: Iterable[ToolSpec], query: str,
                 denied: Iterable[str] = ()) -> list[str]:
    """Tool search: discoverable tools whose name contains ``query``, minus denied ones."""
    blocked = set(denied)
    q = query.strip().lower()
    return sorted(t.name for t in registry
                  if t.discoverable and t.group and t.name not in blocked and q in t.name.lower())


def can_equip(spec: ToolSpec, is_focal: bool) -> bool:
    """Only Focal holds a tool without a group (``schedule_wakeup``)."""
    return bool(spec.group) or is_focal
