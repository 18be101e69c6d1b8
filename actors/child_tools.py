"""The ``agent`` tool: a session starts a child session (a sub-agent) for a task.

In the background (the default) the child runs on its own and its result wakes the
caller through the inbox. In the foreground the caller's turn waits for it: the child,
its task and first message commit at once (not with the turn), under an id a retried
attempt finds again, and the caller gets the child's result as the tool's answer and
takes its result wake-ups into its own turn. A foreground wait holds a session thread,
so one that could never end (every thread waiting) is refused. A part of
:class:`~.tools.AgentTools`; the awaitable tool (:mod:`.async_tools`) shares its halves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..persistence import NewMessage, RowNotFound, SessionRecord
from ..persistence.inbox_core import TERMINAL_STATES
from .context import RuntimeContext
from .errors import ToolError
from .ids import short
from .outbox import Writes, commit_together, foreground_child_id
from .subagents import (
    TASK_KIND,
    TASK_MESSAGE_PREFIX,
    report_task,
    result_ids,
    task_message_chain,
    task_message_id,
)
from .tasks import TaskService
from .validation import CHILD_LIMIT, SEND_LIMIT, TITLE_LIMIT, require_int, require_message

FOREGROUND_KEY = "foreground_key"
"""The config entry of a foreground child holding its key (:meth:`.outbox.Outbox.child_key`):
what a retried attempt checks before it takes a session of the derived id as its child."""

DEFAULT_TITLE_CHARS = 60
"""Characters of its description that name a child started without a title."""


class ChildPlace:
    """A parent's place for one more running child, counted from its check until the child
    is durable (the tasks count it from then on) or never will be; given back once."""

    def __init__(self, ctx: RuntimeContext, parent_id: str) -> None:
        self._ctx, self._parent = ctx, parent_id
        self._held = False
        self._lock = threading.Lock()

    def take(self) -> None:
        """Count the place, or refuse with ``execution_failed`` (nothing counted)."""
        ctx, parent = self._ctx, self._parent
        if not ctx.starting_children.reserve(
                parent, CHILD_LIMIT,
                lambda: ctx.tasks.running_children(parent, TASK_MESSAGE_PREFIX)):
            raise ToolError("execution_failed",
                            f"Sub-agent limit: {CHILD_LIMIT} of this agent's sub-agents are "
                            "still running; wait for one to report back before starting "
                            "another.")
        self._held = True

    def release(self) -> None:
        """The child is durable or never will be: no longer counted here (once)."""
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._ctx.starting_children.release(self._parent)


class ChildTools:
    """``agent`` and the halves the sync and the awaitable tool share."""

    _ctx: RuntimeContext
    _writes: Writes
    caller_id: str
    _caller: Callable[[], SessionRecord]
    """The tools' own: the calling session, checked to exist."""
    _holds = False
    """Whether this caller's foreground waits hold a session thread (set by the first
    :meth:`_reserve_a_thread`; what :meth:`release_thread` gives back)."""

    def agent(self, description: Any, run_in_background: Any = True, title: Any = None,
              timeout: Any = 300) -> dict[str, Any]:
        """Create a child session for ``description`` and run it (in the background by
        default). On the event loop of async brains it is refused before anything is
        written, as every sync tool is (:meth:`.tools.TaskTools._caller`): a foreground
        wait there held every async turn (the child's too) for its whole timeout."""
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
        # A default name is cut from the description, and stripped as every title is: a
        # name ending in a space could not be given to ``send``, which strips its names.
        name = (require_message(title, TITLE_LIMIT, name="title") if title is not None
                else text[:DEFAULT_TITLE_CHARS].rstrip())
        wait = require_int("timeout", timeout, 1, 3600)
        caller = self._caller()
        ctx = self._ctx
        box = self._writes.outbox

        key: str | None = None  # a foreground child's (:meth:`.outbox.Outbox.child_key`)
        place = ChildPlace(ctx, caller.id)

        def start(writes: Writes) -> dict[str, Any]:
            now = ctx.now()
            config = {} if key is None else {FOREGROUND_KEY: key}
            writes.create_session(SessionRecord(child_id, caller.project_id, name, "subagent",
                                                None, caller.id, "idle", now, now, config))
            task = TaskService(ctx, writes).create(child_id, caller.project_id, name,
                                                   "in_progress")
            writes.send([NewMessage(task_message_id(task.id), child_id, text, kind=TASK_KIND,
                                    sender=caller.id, payload={"task_id": task.id})],
                        after=place.release)
            writes.on_discard(place.release)
            return {"agent_id": child_id, "task_id": task.id, "status": "running"}

        if run_in_background:
            child_id = f"subagent-sub_{short(ctx.new_id(), 8)}"
            # One write: a child's session without its task and message (the turn ended
            # between them, a thread the brain left running) is a sub-agent that never runs.
            place.take()
            try:
                return self._writes.together(start), float(wait)
            except BaseException:
                place.release()
                raise
        if box is not None:  # it commits at once, not with the turn: not after its end
            box.check_open()
        self._reserve_a_thread()  # the caller's wait gives it back
        try:
            # The turn waits for this child, so it commits now, not with the turn; an id
            # repeatable across attempts lets a retried turn find the child it started.
            if box is not None:
                key = box.child_key(text)
                child_id = foreground_child_id(key)
            else:
                child_id = f"subagent-sub_{short(ctx.new_id(), 8)}"
            holder = ctx.store.session(child_id)
            if holder is not None:
                if _is_child_of(holder, caller, key):  # an earlier attempt started it
                    return self._receipt(holder), float(wait)
                child_id = f"subagent-sub_{short(ctx.new_id(), 8)}"  # another's: not it
            # Checked again with the writes: the turn may end meanwhile (a thread the
            # brain left running), and a child must not be written after that.
            check = box.check_open if box is not None else None
            place.take()
            return commit_together(ctx, start, check), float(wait)
        except BaseException:
            place.release()
            self.release_thread()
            raise

    def _receipt(self, child: SessionRecord) -> dict[str, Any]:
        """The receipt of a foreground child an earlier attempt of this turn started."""
        tasks = self._ctx.tasks.for_session(child.id)
        return {"agent_id": child.id, "task_id": tasks[0].id if tasks else "",
                "status": "running"}

    def child_finished(self, task_id: str) -> bool:
        """The child's task messages have all reached a terminal state: the first (or it
        was pruned, which only a finished row can be) and each hand-back of it. A deploy
        that stops the child acknowledges its message and hands the task back (a
        ``-resumed`` row the next start runs): the child goes on, and its parent must
        wait on, not take the half-done task for its result.

        Read in chain order: a hand-back commits with the end of the row before it, so
        a row seen ended has its hand-back (if any) written already."""
        for n, mid in enumerate(task_message_chain(task_id)):
            try:
                status = self._ctx.journal.get(mid)["status"]
            except RowNotFound:
                if n == 0:
                    continue  # pruned: it ended; a hand-back of it may still run
                return True  # the chain ends here
            if status not in TERMINAL_STATES:
                return False
        raise AssertionError("unreachable: the chain of ids is endless")

    def child_outcome(self, result: dict[str, Any]) -> dict[str, Any]:
        """A finished foreground child's receipt: its task status and last reply.

        The waiting turn takes the child's result wake-ups into itself (leased now,
        acknowledged by its commit): the caller gets the result here, and a wake-up on top
        would run its brain once more on a result it has. A failed attempt hands them back
        unrun, and its retry (which finds the same child) takes them again; one this turn
        cannot take (it has no inbox row, or it ended) wakes the caller as any does.

        A child whose task failed answers ``failed`` with the failure as ``error`` (its
        wake-up's text): taken into this turn, that wake-up is never shown to the brain,
        and the task's own status (blocked on ``error``) read as a child waiting on the
        user, with no word of what went wrong. Any other end answers its wake-up's text as
        ``result`` (its last reply of the task, as a background parent hears it): not the
        child's newest reply, which a retried attempt, finding the same child long done,
        read from whatever the child had said since (to a sibling, to a user).

        A task message that ended outside a turn (an operator's cancel, a claim that
        failed it) is reported here if its report has not landed yet: it comes in a
        transaction after the row's end, from a process that may die in between (then
        a runtime's look reports it up to :data:`.subagents.REPORT_INTERVAL` later), and
        the task read before it is still ``in_progress``, with no result."""
        report_task(self._ctx, result["task_id"])
        box = self._writes.outbox
        ids = result_ids(self._ctx, result["task_id"])
        if box is not None:
            for mid in ids:
                box.take(mid)
        last = self._result_row(ids[-1]) if ids else None
        if last is not None and last["payload"].get("outcome") == "failed":
            return {**result, "status": "failed", "result": None, "error": last["content"]}
        task = self._ctx.tasks.get(result["task_id"])
        status = task.status if task else "unknown"
        if last is not None:  # the task's end, as its wake-up says it
            return {**result, "status": status, "result": last["content"]}
        # No wake-up to read (its parent stopped it; pruned): the child's newest reply.
        replies = [e.text for e in self._ctx.store.transcript(result["agent_id"], last=1,
                                                               roles=("assistant",))]
        return {**result, "status": status, "result": replies[-1] if replies else None}

    def _result_row(self, message_id: str) -> dict[str, Any] | None:
        """A result wake-up's row (None once pruned)."""
        try:
            return self._ctx.journal.get(message_id)
        except RowNotFound:
            return None

    @staticmethod
    def still_running(result: dict[str, Any], timeout: float) -> ToolError:
        """The error of a foreground wait that ran out."""
        return ToolError("execution_failed", f"Sub-agent '{result['agent_id']}' is still "
                         f"running after {timeout:.0f}s; it reports back when done.")

    def _reserve_a_thread(self) -> None:
        """Count a foreground wait, or refuse one that could never end: the child needs a
        session thread of its own, and every other one would be blocked waiting too. The
        check and the count are one step, so two parents asking at once cannot both pass
        (the wait that follows gives it back: :meth:`release_thread`). Only an inbox
        turn's wait holds a session thread (:meth:`_wait_holds_a_thread`): one that holds
        none is never refused for want of one, and is not counted."""
        ctx = self._ctx
        holds = self._holds = self._wait_holds_a_thread()
        with ctx.activity.cond:
            held = ctx.foreground_waits + int(holds)
            if held < ctx.max_active:
                ctx.foreground_waits += int(holds)
                return
        raise ToolError("execution_failed",
                        f"A foreground sub-agent needs a free session thread, and none can "
                        f"free up: this runtime runs at most {ctx.max_active} turn(s) at "
                        f"once and {held} would be waiting. Use run_in_background=true "
                        "(the child reports back), or run kinbox with a larger "
                        "max_active_sessions.")

    def _wait_holds_a_thread(self) -> bool:
        """Does this caller's foreground wait hold one of the turns the runtime runs at once
        (``max_active``: its session threads, or its async turns)? An inbox turn's does,
        for as long as it waits. A direct turn's (a cron run, a social event: they run on
        a pool of their own) holds none, nor does a call outside any turn (the product's
        own thread); counted, a cron run's child was refused with ``max_active_sessions=1``
        as if no thread could ever free up, and an inbox parent waiting beside it too.
        Constant for these tools, which serve one turn (or none)."""
        box = self._writes.outbox
        turn = box.turn() if box is not None and box.turn is not None else None
        return turn is not None and turn.row is not None

    def release_thread(self) -> None:
        """A foreground wait counted by :meth:`_reserve_a_thread` is over."""
        with self._ctx.activity.cond:
            self._ctx.foreground_waits -= int(self._holds)

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


def _is_child_of(session: SessionRecord, caller: SessionRecord, key: str | None) -> bool:
    """Is ``session`` the foreground child ``key`` names, of this caller? (Its id is made
    of a few digits of the key: a session holding that id otherwise, another's or
    another child of the caller's, is not this turn's child, whatever its name.)"""
    return (key is not None and session.parent_id == caller.id
            and session.project_id == caller.project_id
            and session.config.get(FOREGROUND_KEY) == key)
