"""The agent tools a Brain calls, bound to the calling session.

The caller's identity comes from the runtime (``rt.tools_for(session_id)``
or ``turn.tools``), never from an argument. Each tool validates its
arguments, applies the pure access rules, and only then writes; a refusal
is a :class:`ToolError` and leaves nothing behind. Sub-agents get
:class:`SubagentTools`: task and family tools, no agent tools (no recursion).
"""

from __future__ import annotations

import time
from typing import Any

from ..persistence import NewMessage, SessionRecord
from ..persistence.inbox_core import TERMINAL_STATES
from . import access, stops, tool_schemas, transcript_view
from .context import RuntimeContext
from .errors import RuntimeStateError, ToolError, tool_result
from .family import FamilyTools
from .focal import is_focal_chat
from .focal_policy import FOCAL_TOOL_NAMES, SCHEDULE_WAKEUP
from .ids import short
from .outbox import Outbox, Writes, commit_together
from .peers import is_peer_target
from .subagents import TASK_KIND, result_ids, task_message_id
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
FOREGROUND_ON_LOOP = ("A foreground agent(..., run_in_background=False) waits for the "
                      "child's turn, which runs on the event loop this call would hold "
                      "until its timeout: await turn.tools.agent(...) in an async brain "
                      "(turn.tools.sync is for code off the event loop).")
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
        self._ctx.require_running()
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


class AgentTools(FamilyTools, TaskTools):
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
        caller = self._caller()
        me = subject(caller)
        store = self._ctx.store
        # The pool holds every session the caller may reach; the access rules then decide.
        # Focal reaches every project (FO4), so its pool is not its own hidden project.
        pool = (store.sessions() if access.is_focal(me)
                else store.sessions(project_id=caller.project_id)
                if caller.project_id is not None else [caller])
        visible = [listing(s) for s in pool
                   if access.decide("agent_list", me, subject(s)) == "allow"
                   and (mode == "recent" or s.status == "active")]
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
        lines = [transcript_view.Line(e.role, e.text, e.visible, e.sender_id, e.kind)
                 for e in self._ctx.store.transcript(target.id)]
        return {"agent_id": target.id, "title": target.title, "status": target.status,
                "transcript": transcript_view.render(lines)}

    def agent_send(self, agent_id: Any, message: Any, **focal_args: Any) -> dict[str, Any]:
        """Queue ``message`` for ``agent_id``; returns once the inbox row is committed.

        The Focal agent may also send to ``agent_id="new"`` with ``project_id``,
        ``title`` and ``task_title`` to start a session (FO4).
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
        if caller_is_focal:
            focal.watch(target_id, self._writes)
        [result] = self._writes.send(
            [NewMessage(f"msg-{ctx.new_id()}", target_id, text, sender=caller.id)])
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

    def agent(self, description: Any, run_in_background: Any = True, title: Any = None,
              timeout: Any = 300) -> dict[str, Any]:
        """Create a child session for ``description`` and run it (in the background by default)."""
        host = self._ctx.async_host
        if run_in_background is False and host is not None and host.on_loop():
            # Refused before anything is written: the wait would hold every async turn
            # (the child's too) for as long as its timeout, and then fail anyway.
            raise ToolError("execution_failed", FOREGROUND_ON_LOOP)
        result, wait = self.start_child(description, run_in_background, title, timeout)
        if run_in_background:
            return result
        return self._wait_for_child(result, wait)

    def start_child(self, description: Any, run_in_background: Any = True, title: Any = None,
                    timeout: Any = 300) -> tuple[dict[str, Any], float]:
        """``agent``'s first half: validate, create the child and its task; the receipt and
        how long a foreground caller may wait (shared by the sync and the awaitable tool).
        A foreground start counts the caller's wait; the caller gives it back when its
        wait ends (:meth:`release_thread`)."""
        text = require_message(description, SEND_LIMIT, name="description")
        if not isinstance(run_in_background, bool):
            raise ToolError("invalid_argument", "run_in_background must be true or false.")
        name = require_message(title, TITLE_LIMIT, name="title") if title is not None else text[:60]
        wait = require_int("timeout", timeout, 1, 3600)
        caller = self._caller()
        ctx = self._ctx
        box = self._writes.outbox

        def start(writes: Writes) -> dict[str, Any]:
            now = ctx.now()
            writes.create_session(SessionRecord(child_id, caller.project_id, name, "subagent",
                                                None, caller.id, "idle", now, now, {}))
            task = TaskService(ctx, writes).create(child_id, caller.project_id, name,
                                                   "in_progress")
            writes.send([NewMessage(task_message_id(task.id), child_id, text, kind=TASK_KIND,
                                    sender=caller.id, payload={"task_id": task.id})])
            return {"agent_id": child_id, "task_id": task.id, "status": "running"}

        if run_in_background:
            child_id = f"subagent-sub_{short(ctx.new_id(), 8)}"
            return start(self._writes), float(wait)
        if box is not None:  # it commits at once, not with the turn: not after its end
            box.check_open()
        self._reserve_a_thread(caller.id)  # the caller's wait gives it back
        try:
            # The turn waits for this child, so it commits now, not with the turn; an id
            # repeatable across attempts lets a retried turn find the child it started.
            child_id = (box.child_id(text) if box is not None
                        else f"subagent-sub_{short(ctx.new_id(), 8)}")
            holder = ctx.store.session(child_id)
            if holder is not None:
                if _is_child_of(holder, caller):  # an earlier attempt of this turn started it
                    return self._receipt(holder), float(wait)
                child_id = f"subagent-sub_{short(ctx.new_id(), 8)}"  # another's: not it
            # Checked again with the writes: the turn may end meanwhile (a thread the
            # brain left running), and a child must not be written after that.
            check = box.check_open if box is not None else None
            return commit_together(ctx, start, check), float(wait)
        except BaseException:
            self.release_thread()
            raise

    def _receipt(self, child: SessionRecord) -> dict[str, Any]:
        """The receipt of a foreground child an earlier attempt of this turn started."""
        tasks = self._ctx.tasks.for_session(child.id)
        return {"agent_id": child.id, "task_id": tasks[0].id if tasks else "",
                "status": "running"}

    def child_finished(self, task_id: str) -> bool:
        """The child's task message has reached a terminal state."""
        return self._ctx.journal.get(task_message_id(task_id))["status"] in TERMINAL_STATES

    def child_outcome(self, result: dict[str, Any]) -> dict[str, Any]:
        """A finished foreground child's receipt: its task status and last reply.

        The waiting turn takes the child's result wake-ups into itself (leased now,
        acknowledged by its commit): the caller gets the result here, and a wake-up on top
        would run its brain once more on a result it has. A failed attempt hands them back
        unrun, and its retry (which finds the same child) takes them again; one this turn
        cannot take (it has no inbox row, or it ended) wakes the caller as any does."""
        box = self._writes.outbox
        if box is not None:
            for mid in result_ids(self._ctx, result["task_id"]):
                box.take(mid)
        replies = [e.text for e in self._ctx.store.transcript(result["agent_id"])
                   if e.role == "assistant"]
        task = self._ctx.tasks.get(result["task_id"])
        return {**result, "status": task.status if task else "unknown",
                "result": replies[-1] if replies else None}

    @staticmethod
    def still_running(result: dict[str, Any], timeout: float) -> ToolError:
        """The error of a foreground wait that ran out."""
        return ToolError("execution_failed", f"Sub-agent '{result['agent_id']}' is still "
                         f"running after {timeout:.0f}s; it reports back when done.")

    def _reserve_a_thread(self, caller_id: str) -> None:
        """Count a foreground wait, or refuse one that could never end: the child needs a
        session thread of its own, and every other one would be blocked waiting too. The
        check and the count are one step, so two parents asking at once cannot both pass
        (the wait that follows gives it back: :meth:`release_thread`)."""
        ctx = self._ctx
        mine = 1 if caller_id in ctx.turns.running() else 0
        with ctx.activity.cond:
            held = ctx.foreground_waits + mine
            if held < ctx.max_active:
                ctx.foreground_waits += 1
                return
        raise ToolError("execution_failed",
                        f"A foreground sub-agent needs a free session thread, and none can "
                        f"free up: this runtime runs at most {ctx.max_active} turn(s) at "
                        f"once and {held} would be waiting. Use run_in_background=true "
                        "(the child reports back), or run kinbox with a larger "
                        "max_active_sessions.")

    def release_thread(self) -> None:
        """A foreground wait counted by :meth:`_reserve_a_thread` is over."""
        with self._ctx.activity.cond:
            self._ctx.foreground_waits -= 1

    def stopped_waiting(self, result: dict[str, Any]) -> ToolError | None:
        """The error that ends a foreground wait whose own turn was asked to stop (by
        ``agent_stop``, its turn_timeout, the runtime stopping), or None."""
        if self._ctx.turns.stopped_by(self.caller_id) is None:
            return None
        return ToolError("execution_failed", f"Stopped while waiting for sub-agent "
                         f"'{result['agent_id']}'; it goes on and reports back when done.")

    def _wait_for_child(self, result: dict[str, Any], timeout: float) -> dict[str, Any]:
        ctx = self._ctx
        activity = ctx.activity
        deadline = time.monotonic() + timeout
        try:
            while True:
                seen = activity.changes
                # A read of the journal: never under the board's lock, which every turn's
                # start and end takes.
                if self.child_finished(result["task_id"]):
                    return self.child_outcome(result)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self.still_running(result, timeout)
                if (stopped := self.stopped_waiting(result)) is not None:
                    raise stopped
                # A stop changes no activity: look again at least each second.
                activity.wait(min(remaining, 1.0),
                              until=lambda seen=seen: activity.changes != seen)
        finally:
            self.release_thread()


def _is_child_of(session: SessionRecord, caller: SessionRecord) -> bool:
    """Is ``session`` the caller's own child? (A foreground child's id is derived from its
    turn; a session holding that id otherwise is not this turn's child, whatever its
    name.)"""
    return session.parent_id == caller.id and session.project_id == caller.project_id


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
                ctx.tool_classes.clear()  # memory stays bounded; the next turns look again
            ctx.tool_classes[session_id] = held
    return held(ctx, session_id, outbox)
