"""The agent tools a Brain calls, bound to the calling session.

The caller's identity comes from the runtime (``rt.tools_for(session_id)``
or ``turn.tools``), never from an argument. Each tool validates its
arguments, applies the pure access rules, and only then writes; a refusal
is a :class:`ToolError` and leaves nothing behind. Sub-agents get
:class:`SubagentTools`: task and family tools, no agent tools (no recursion).
The ``agent`` tool (a child session) is :mod:`.child_tools`.
"""

from __future__ import annotations

from typing import Any

from ..persistence import EnqueueResult, NewMessage, SessionRecord
from . import access, stops, tool_schemas, transcript_read, transcript_view
from .child_tools import ChildTools
from .context import RuntimeContext
from .errors import RuntimeStateError, ToolError, tool_result
from .family import FamilyTools
from .focal import is_focal_chat
from .focal_policy import FOCAL_TOOL_NAMES, SCHEDULE_WAKEUP
from .loop_rule import refuse_on_loop
from .outbox import Outbox, Writes
from .peers import is_peer_target
from .reachable import reachable
from .tasks import TaskService
from .validation import (
    ID_LIMIT,
    SEND_LIMIT,
    TITLE_LIMIT,
    quoted,
    require_choice,
    require_id,
    require_int,
    require_message,
)

FOCAL_SEND_EXTRAS = ("project_id", "title", "task_title")
"""What Focal's ``agent_send(agent_id="new", ...)`` also takes (FO4)."""

SELF_SEND = "Use a normal follow-up turn instead of sending to the current agent."
SELF_STOP = "The current agent cannot stop itself with agent_stop."
NO_AGENT_TOOLS = ("Sub-agents do not hold the agent tools; finish your task and your parent "
                  "is told the result.")


def unavailable(agent_id: str) -> ToolError:
    """The one answer for hidden, missing and other-project targets (S3)."""
    return ToolError("not_found", f"Agent '{agent_id}' is not available in the current project.")


def subject(s: SessionRecord) -> access.Subject:
    """The authorization view of a session record."""
    return access.Subject(s.id, s.project_id, s.kind, s.platform)


def listing(s: SessionRecord) -> dict[str, Any]:
    """An ``agent_list`` record."""
    return {"agent_id": s.id, "title": s.title, "kind": s.kind, "status": s.status,
            "project_id": s.project_id, "parent_agent_id": s.parent_id,
            "updated_at": s.updated_at}


class TaskTools:
    """Task tools of a session: every session may keep tasks."""

    HELD: tuple[str, ...] = ("task_create", "task_update", "task_list")
    """The tools this kind of session holds, in the order a model sees them."""

    def __init__(self, ctx: RuntimeContext, caller_id: str,
                 outbox: Outbox | None = None) -> None:
        self._ctx = ctx
        self.caller_id = caller_id
        self._writes = Writes(ctx, outbox)
        """Where this caller's writes go: with its running turn's commit, or at once."""

    def held(self) -> list[str]:
        """The names of the tools this caller holds."""
        return list(self.HELD)

    def _focal(self) -> bool:
        return False

    def schemas(self, shape: str = "openai") -> list[dict[str, Any]]:
        """JSON Schemas of exactly the tools this caller holds (``openai`` or ``mcp`` shape)."""
        return tool_schemas.schemas(self.held(), shape, focal=self._focal())

    def call(self, name: Any, arguments: Any = None) -> dict[str, Any]:
        """Run a model's tool call by name: the tool's result, or its error as a dict."""
        try:
            args = self.call_arguments(name, arguments)
            return getattr(self, name)(**args)  # type: ignore[no-any-return]
        except (ToolError, RuntimeStateError) as exc:
            return tool_result(exc)

    def call_arguments(self, name: Any, arguments: Any) -> dict[str, Any]:
        """The arguments of a call to ``name`` if its schema allows them (else ToolError)."""
        return tool_schemas.check_call(self.held(), name, arguments, focal=self._focal())

    def _caller(self) -> SessionRecord:
        """The calling session, read first by every tool (so before anything is written):
        the point where a sync tool called on the event loop of async brains is refused
        (:mod:`.loop_rule`), since its reads and writes would hold every async turn."""
        self._ctx.require_running()
        host = self._ctx.async_host
        refuse_on_loop(host.on_loop if host is not None else None,
                       "a sync tool call (turn.tools.sync)", "await turn.tools.<tool>(...)")
        caller = self._ctx.store.session(self.caller_id)
        if caller is None:
            raise ToolError("execution_failed",
                            f"The calling session '{self.caller_id}' does not exist; "
                            "tools must be bound to an existing session.")
        return caller

    def task_create(self, title: Any, status: Any = "pending") -> dict[str, Any]:
        """Create a task of the calling session (``pending`` or ``in_progress``)."""
        text = require_message(title, TITLE_LIMIT, name="title")
        caller = self._caller()
        return TaskService(self._ctx, self._writes).create(caller.id, caller.project_id, text,
                                             require_choice("status", status,
                                                            ("pending", "in_progress"))
                                             ).to_dict()

    def task_update(self, task_id: Any, status: Any = None, blocked_on: Any = None,
                    reason: Any = None) -> dict[str, Any]:
        """Change a task's status, what it is blocked on, or the reason."""
        tid = require_id("task_id", task_id, ID_LIMIT)
        caller = self._caller()
        return TaskService(self._ctx, self._writes).update(caller.id, tid, status, blocked_on,
                                                           reason).to_dict()

    def task_list(self) -> dict[str, Any]:
        """The calling session's tasks, oldest first."""
        caller = self._caller()
        return {"tasks": [t.to_dict() for t in self._writes.tasks_of(caller.id)]}


class SubagentTools(FamilyTools, TaskTools):
    """What a sub-agent holds: task tools; every agent tool is refused."""

    HELD = ("list_agents", "send", *TaskTools.HELD)

    def __getattr__(self, name: str) -> Any:
        # ``start_child`` too: the awaitable ``agent`` (:mod:`.async_tools`) starts through
        # it, and must meet the same refusal, not a missing attribute.
        if name in ("agent", "start_child") or name.startswith("agent_"):
            def refused(*_args: Any, **_kwargs: Any) -> Any:
                raise ToolError("execution_failed", NO_AGENT_TOOLS)
            return refused
        raise AttributeError(name)


class AgentTools(ChildTools, FamilyTools, TaskTools):
    """The agent tools as seen by one calling session."""

    HELD = ("agent_list", "agent_read", "agent_send", "agent_stop", "agent", "list_agents",
            "send", *TaskTools.HELD)


    def _target(self, tool: str, caller: SessionRecord, agent_id: str) -> SessionRecord:
        """The target of ``tool``, or the ToolError the access rules call for."""
        target = self._writes.session(agent_id)
        decision = access.decide(tool, subject(caller), subject(target) if target else None)
        if decision == "self_refused":
            raise ToolError("invalid_argument", SELF_SEND if tool == "agent_send" else SELF_STOP)
        if decision != "allow" or target is None:
            raise unavailable(agent_id)
        return target

    def agent_list(self, status: Any = "recent", limit: Any = 20) -> dict[str, Any]:
        """Sessions the caller may address, newest first: ``active`` ones or all ``recent``."""
        mode = require_choice("status", status, ("active", "recent"))
        n = require_int("limit", limit, 1, 50)
        local, more = reachable(self._ctx.store, self._caller(), active_only=mode == "active",
                                limit=n, new=self._writes.new_sessions())
        visible = [listing(s) for s in local]
        if more:
            return {"agents": visible, "has_more": True}
        if self._ctx.peers is not None:  # paired devices come after local sessions (T1)
            visible += self._ctx.peers.listing(active_only=mode == "active")
        return {"agents": visible[:n], "has_more": len(visible) > n}

    def agent_read(self, agent_id: Any) -> dict[str, Any]:
        """The target's visible transcript (user and assistant text), newest kept."""
        target_id = require_id("agent_id", agent_id, ID_LIMIT)
        caller = self._caller()
        if is_peer_target(target_id) and self._ctx.peers is not None:
            answer = self._ctx.peers.request(target_id, "read")
            return {"agent_id": target_id, "title": target_id, "status": answer.status,
                    "transcript": answer.text}
        target = self._target("agent_read", caller, target_id)
        lines, older = transcript_read.newest_lines(self._ctx.store, target.id)
        return {"agent_id": target.id, "title": target.title, "status": target.status,
                "transcript": transcript_view.render(lines, older=older)}

    def agent_send(self, agent_id: Any, message: Any, **focal_args: Any) -> dict[str, Any]:
        """Queue ``message`` for ``agent_id``; returns once the inbox row is committed.

        The Focal agent may also send to ``agent_id="new"`` with ``project_id``,
        ``title`` and ``task_title`` to start a session (FO4). Each call is a new message
        with an id of its own (a caller that must not send twice uses ``Runtime.post``
        with a ``message_id``, de-duplicated as long as the journal keeps its row: the
        retention period).
        """
        target_id = require_id("agent_id", agent_id, ID_LIMIT)
        text = require_message(message, SEND_LIMIT)
        caller = self._caller()
        ctx = self._ctx
        focal = ctx.focal
        caller_is_focal = focal is not None and is_focal_chat(caller)
        self._check_send_extras(focal_args, caller_is_focal, target_id)
        if target_id == "new":
            if not caller_is_focal:
                raise unavailable(target_id)
            return focal.dispatch_new(focal_args.get("project_id"), focal_args.get("title"),
                                      focal_args.get("task_title"), text, self._writes)
        if is_peer_target(target_id) and ctx.peers is not None:
            return dict(ctx.peers.send(caller.id, target_id, text, writes=self._writes))
        self._target("agent_send", caller, target_id)
        message = NewMessage(f"msg-{ctx.new_id()}", target_id, text, sender=caller.id)
        if caller_is_focal:
            # One write: the mark without the message (the turn ended between them, a
            # thread the brain left running) was a session Focal followed unasked.
            def watched_send(writes: Writes) -> list[EnqueueResult]:
                focal.watch(target_id, writes)
                return writes.send([message])
            [result] = self._writes.together(watched_send)
        else:
            [result] = self._writes.send([message])
        return {"message_id": result.message_id, "agent_id": target_id, "status": result.status}

    @staticmethod
    def _check_send_extras(extras: dict[str, Any], caller_is_focal: bool,
                           target_id: str) -> None:
        """Refuse ``agent_send`` arguments beyond agent_id and message, naming the wrong
        ones: only Focal takes more, and only to start a session (FO4)."""
        if not extras:
            return
        if not caller_is_focal:
            raise ToolError("invalid_argument", "agent_send takes exactly agent_id and "
                            f"message (unexpected: {', '.join(sorted(extras))}).")
        unknown = sorted(set(extras) - set(FOCAL_SEND_EXTRAS))
        if unknown:
            raise ToolError("invalid_argument", f"agent_send has no argument "
                            f"{', '.join(quoted(u) if len(u) > 40 else u for u in unknown)}; "
                            "it takes agent_id, message, and with agent_id='new' "
                            "project_id, title and task_title.")
        if target_id != "new":
            raise ToolError("invalid_argument", "project_id, title and task_title are only "
                            f"for agent_id='new' (got: {', '.join(sorted(extras))}).")

    def schedule_wakeup(self, kind: Any, at: Any = None, cron: Any = None,
                        note: Any = "") -> dict[str, Any]:
        """Focal only: a durable wake-up (``reminder`` always notifies, ``check`` when needed)."""
        caller = self._caller()
        focal = self._ctx.focal
        if focal is None or focal.schedule is None:
            raise ToolError("execution_failed", "wake-ups are not available in this runtime.")
        return focal.schedule.schedule_wakeup(caller.id, kind, at=at, cron=cron,  # type: ignore[no-any-return]
                                              note=note, writes=self._writes)

    def agent_stop(self, agent_id: Any) -> dict[str, Any]:
        """Ask the target's running turn to stop (cooperative)."""
        target_id = require_id("agent_id", agent_id, ID_LIMIT)
        caller = self._caller()
        if is_peer_target(target_id) and self._ctx.peers is not None:
            answer = self._ctx.peers.request(target_id, "stop")
            if answer.status != "stop_requested":
                raise ToolError("execution_failed", f"Agent '{target_id}' is not active.")
            return {"agent_id": target_id, "status": "stop_requested"}
        target = self._target("agent_stop", caller, target_id)
        if not stops.request_stop(self._ctx, target.id, caller.id):
            raise ToolError("execution_failed", f"Agent '{target.id}' is not active.")
        self._ctx.emit("stop_requested", session_id=target.id, by=caller.id)
        return {"agent_id": target.id, "status": "stop_requested"}


FOCAL_DENIED = ("The Focal agent dispatches work and never does it itself: it holds "
                "agent_list, agent_read, agent_send (agent_id='new' starts a session in a "
                "project), agent_stop and schedule_wakeup.")


class FocalTools(AgentTools):
    """What the Focal agent holds (FO2): the agent tools of its policy and
    ``schedule_wakeup``. Starting a sub-agent, family messages and task tools are denied:
    not offered, and refused when called."""

    HELD = (*(t for t in AgentTools.HELD if t in FOCAL_TOOL_NAMES), SCHEDULE_WAKEUP)

    def _focal(self) -> bool:
        return True

    def _denied(self, *_args: Any, **_kwargs: Any) -> Any:
        raise ToolError("execution_failed", FOCAL_DENIED)

    agent = start_child = list_agents = send = broadcast = _denied
    task_create = task_update = task_list = _denied


TOOL_CLASSES_KEPT = 100_000
"""Sessions whose tools' kind a runtime remembers before it starts over."""


def tools_for(ctx: RuntimeContext, session_id: str, outbox: Outbox | None = None) -> TaskTools:
    """The tools a session holds: sub-agents get task tools only, the Focal agent its
    policy's. With ``outbox`` (the session's running turn's), their writes commit with
    that turn."""
    held: type[TaskTools] | None = ctx.tool_classes.get(session_id)
    if held is None:
        session = ctx.store.session(session_id)
        held = (SubagentTools if session is not None and session.kind == "subagent"
                else FocalTools if ctx.focal is not None and is_focal_chat(session)
                else AgentTools)
        if session is not None:  # an unknown id is looked up again: it may be created
            if len(ctx.tool_classes) >= TOOL_CLASSES_KEPT:
                forget_tool_classes(ctx)
            ctx.tool_classes[session_id] = held
    return held(ctx, session_id, outbox)


def forget_tool_classes(ctx: RuntimeContext) -> None:
    """Start over (memory stays bounded; the next turns look again), keeping the sessions
    whose turns run: an async turn found its session here when it started and builds its
    tools on the event loop, where a read would hold every async turn. Swapped whole, so
    a reader sees the old map or the new one, either holding those sessions."""
    old = ctx.tool_classes
    ctx.tool_classes = {sid: old[sid] for sid in ctx.turns.running() if sid in old}
