"""How a tool's writes commit: at once, or with the turn that made them (a turn's outbox).

A brain's tool calls inside a turn (``agent_send``, family ``send``, task changes, a
background ``agent(...)``, Focal's ``agent_send("new", ...)`` and ``watch``) do not commit
on their own. Each becomes an operation in the turn's :class:`Outbox`, run on the writer
thread inside the one transaction that commits the turn (its transcript entries,
delivery markers and acks). A failed attempt's outbox is dropped, so the effects of a
retried turn happen exactly once: with the attempt that commits, never with one that
fails (and what its sends took of a rate limit is given back: :meth:`Outbox.discard`).
Called outside a turn (``rt.tools_for(sid)`` from the product), the same tool
code commits at once.

The tool answers at once with the receipt the write will have: ids are chosen before
the write, and a queued message's status is ``pending`` (the row exists from the
turn's commit on). Later calls in the same turn see its own writes (a task created and
then updated, a child started and then messaged) through the outbox's overlay.

The outbox ends with the turn's brain (:meth:`Outbox.end`, when the turn closes): a
call from a thread or task the brain left running is refused from then on, as a reply
is, even before the commit takes the writes.

Two effects cannot wait for the commit, and are not in the outbox:

- a foreground ``agent(..., run_in_background=False)``: the turn waits for the child,
  so the child (its session, task and first message, in one transaction:
  :func:`commit_together`) is committed at once. Its id is derived from the turn's message, the
  description and how often the turn asked for it (not the call's place among the turn's
  calls, which concurrent calls make arbitrary), so a retried attempt that asks for the
  same child gets the one that already ran (its result, if it finished) instead of a
  second one;
- steering: rows a turn takes with ``steering()`` are leased into it at once, and a
  failed attempt hands them back unrun with its own row. A foreground child's result
  row is taken the same way (:meth:`Outbox.take`, :meth:`.turn.Turn.take`) when the
  wait returns it: the commit acknowledges it, so it never wakes the turn's session
  for a turn of its own on a result the brain already has; a failed attempt hands it
  back and the retry that finds the same child takes it again. A wait that ran out
  took nothing: the result wakes the session later, as a background child's does.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..persistence import EnqueueResult, NewMessage, SessionRecord, TaskRecord
from .context import RuntimeContext, TurnEffects
from .errors import ToolError
from .steps import wait_landed

if TYPE_CHECKING:
    from .turn import Turn

T = TypeVar("T")

TURN_ENDED = ("This turn has ended: its writes were committed (or dropped with a failed "
              "attempt) when its brain returned, so a tool call made after that (from a "
              "task or thread the brain left running) is not done. Make every tool call "
              "before the brain returns.")

QUEUED = "pending"
"""The status a queued message's receipt reports (the row's state from its commit on)."""


class Outbox:
    """The writes of one turn's tool calls, waiting for the turn's commit."""

    def __init__(self, key: str) -> None:
        self.key = key
        """The turn's first message id: what makes a foreground child's id repeatable."""
        self.ops: list[Callable[[], object]] = []
        self.after: list[Callable[[], None]] = []
        self.undo: list[Callable[[], None]] = []
        """What gives back what the writes took in memory (rate-limit tokens), should
        they never commit."""
        self.discarded = False
        """The attempt ended without its writes: a tool call still running in it (an
        async brain's, on a worker, when the brain was cancelled) gives back at once."""
        self.closed = False
        """The turn has ended: its brain returned (:meth:`end`), or its commit took its
        writes (:meth:`close`)."""
        self._undo_lock = threading.Lock()
        self.sessions: dict[str, SessionRecord] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.foreground_calls: dict[str, int] = {}
        """Foreground children asked for in this turn, per description."""
        self.turn: weakref.ref[Turn] | None = None
        """The running turn, held weakly (it holds this outbox): see :meth:`take`."""
        self.wakeups = 0
        """Focal wake-ups queued in this turn (they count toward Focal's limit)."""
        self.task_updates: dict[str, int] = {}
        """Updates of each task queued in this turn: the commit judges the task's net
        change with the last (:meth:`.tasks.TaskService.update`)."""
        self.tasks_before: dict[str, TaskRecord] = {}
        """Each updated task's row as the commit finds it before the turn's first update."""

    def take(self, message_id: str) -> bool:
        """Take a row of the session into the running turn (:meth:`.turn.Turn.take`): how a
        foreground ``agent`` call takes its child's result, which it returns, so that the
        result does not wake the session again. False when there is no turn to take it."""
        turn = self.turn() if self.turn is not None else None
        return turn is not None and turn.take(message_id)

    def count_update(self, task_id: str) -> int:
        """This update of ``task_id`` is the turn's how-many-th (from 1);
        :class:`ToolError` once the turn has ended."""
        with self._undo_lock:
            self.check_open()
            nth = self.task_updates[task_id] = self.task_updates.get(task_id, 0) + 1
            return nth

    def has_writes(self) -> bool:
        """Did the turn's tool calls write anything (for its commit to carry)?"""
        return bool(self.ops or self.after)

    def end(self) -> None:
        """The turn's brain has returned: later writes are refused (:meth:`add`,
        :meth:`check_open`), so what its commit takes is what the brain wrote, and a call
        from a thread the brain left running is not done, whether or not the commit has
        taken the writes yet."""
        with self._undo_lock:
            self.closed = True

    def close(self) -> TurnEffects | None:
        """The turn's commit takes its writes: what it runs (``ops``) and what follows once
        it is durable, None when there are none. Later writes are refused (:meth:`add`):
        a tool call the brain left running past its turn would otherwise be answered,
        and never written."""
        with self._undo_lock:
            self.closed = True
            if not (self.ops or self.after):
                return None
            return TurnEffects(ops=list(self.ops), after=list(self.after))

    def check_open(self) -> None:
        """:class:`ToolError` once the turn has ended (its writes were taken by the commit,
        or dropped with the attempt): a call made after that writes nothing."""
        if self.closed or self.discarded:
            raise ToolError("execution_failed", TURN_ENDED)

    def add(self, op: Callable[[], object], after: Callable[[], None]) -> None:
        """Queue a write for the turn's commit; :class:`ToolError` once the turn has ended."""
        with self._undo_lock:
            self.check_open()
            self.ops.append(op)
            self.after.append(after)

    def note(self, record: SessionRecord | TaskRecord) -> None:
        """Remember a session or task as this turn's writes leave it (the view its later
        calls and its commit's report read); :class:`ToolError` once the turn has ended:
        a refused call from a thread the brain left running must not change that view,
        as its write never comes."""
        with self._undo_lock:
            self.check_open()
            if isinstance(record, SessionRecord):
                self.sessions[record.id] = record
            else:
                self.tasks[record.id] = record

    def discard(self) -> None:
        """These writes will never commit (the attempt failed, or the journal refused its
        commit): give back what was taken for them. Runs each undo once."""
        with self._undo_lock:
            self.discarded = True
            undo, self.undo = self.undo, []
        for give_back in undo:
            give_back()

    def keep_undo(self, give_back: Callable[[], None]) -> None:
        """Add an undo; run it at once if the attempt ended already (its writes never
        commit: the call ran on past the brain's cancellation)."""
        with self._undo_lock:
            late = self.discarded
            if not late:
                self.undo.append(give_back)
        if late:
            give_back()

    def child_key(self, description: str) -> str:
        """The key of this turn's next foreground child: the same on every attempt that asks
        for the same child (its description, and how many times this turn asked for it).
        Not its place among the turn's calls: tool calls of an async turn run at once
        (``asyncio.gather``, a framework's parallel tool calls) and reach here in any
        order, and a retried model may ask for its children in another order; either
        would start every child again. The child's id is made of it
        (:func:`foreground_child_id`); the child keeps the whole key, which tells it
        apart from a session that happens to hold the same short id."""
        with self._undo_lock:
            nth = self.foreground_calls[description] = (
                self.foreground_calls.get(description, 0) + 1)
        return hashlib.sha256(f"{self.key}\0{nth}\0{description}".encode()).hexdigest()


def foreground_child_id(key: str) -> str:
    """A foreground child's id: of the form every child's has, ``subagent-sub_<8 hex>``
    (T5), from its key (:meth:`Outbox.child_key`)."""
    return f"subagent-sub_{key[:8]}"


class Writes:
    """Where a tool's writes go: ``outbox`` None means commit each at once."""

    def __init__(self, ctx: RuntimeContext, outbox: Outbox | None) -> None:
        self.ctx = ctx
        self.outbox = outbox

    def write(self, op: Callable[[], T], receipt: T, after: Callable[[T], None]) -> T:
        """Run ``op`` in a transaction (now, or in the turn's commit), then ``after`` with
        its result once durable. In a turn the caller gets ``receipt`` (what ``op`` will
        produce) at once. Now, it returns once the outcome is known: a batch that outran
        the wait may commit yet, so it is waited for (taken as failed, a task that was
        then written was created again by a caller who retried)."""
        box = self.outbox
        if box is None:
            result = self.ctx.journal.writer.call_landed(op)
            after(result)
            return result
        done: list[T] = []

        def run() -> None:
            # The last run's result: a commit that a deadlock aborted runs its writes again
            # (see kinbox.persistence.writer), and only the run that committed counts.
            done[:] = [op()]
        box.add(run, lambda: after(done[0]))
        return receipt

    def send(self, msgs: Sequence[NewMessage],
             after: Callable[[], None] | None = None) -> list[EnqueueResult]:
        """Queue messages in order; observers hear ``sent`` and the dispatcher wakes once
        they are durable."""
        ctx = self.ctx
        now = ctx.now()
        items = list(msgs)

        def announce(results: list[EnqueueResult]) -> None:
            for m, r in zip(items, results, strict=True):
                ctx.emit_sent(m, r)
            ctx.wake_dispatcher()
            if after is not None:
                after()

        if self.outbox is None and len(items) == 1:  # set-wise, and maybe the fast path
            results = [ctx.enqueue(items[0])]
            if after is not None:
                after()
            return results
        return self.write(lambda: [ctx.journal.enqueue_now(m, now) for m in items],
                          [EnqueueResult(m.message_id, m.target, QUEUED, True, now)
                           for m in items], announce)

    def together(self, build: Callable[[Writes], T]) -> T:
        """Run ``build``'s writes as one write: in a turn, one operation of its outbox (a
        failure part-way queues nothing: a brain that takes it as a failed tool call and
        goes on must not commit half of it); outside a turn, one transaction now
        (:func:`commit_together`). ``build`` writes through a staging outbox of its own:
        the sessions and tasks it creates join the turn's view of its writes once they
        are queued whole (a background child, then messaged or listed in the same
        turn)."""
        box = self.outbox
        if box is None:
            return commit_together(self.ctx, build)
        staging = Outbox("")
        try:
            result = build(Writes(self.ctx, staging))
            effects = staging.close()
            if effects is not None:
                ops, afters = effects.ops, effects.after
                box.add(lambda: _run(ops), lambda: _run(afters))
                for give_back in staging.undo:  # should the turn not commit
                    box.keep_undo(give_back)
                box.sessions.update(staging.sessions)
                box.tasks.update(staging.tasks)
        except BaseException:
            staging.discard()
            raise
        return result

    def children_of(self, parent_id: str) -> list[SessionRecord]:
        """The sessions this turn created as ``parent_id``'s children (not yet committed)."""
        if self.outbox is None:
            return []
        return [s for s in self.outbox.sessions.values() if s.parent_id == parent_id]

    def new_sessions(self) -> list[SessionRecord]:
        """The sessions this turn created (not yet committed), newest first."""
        if self.outbox is None:
            return []
        return list(reversed(self.outbox.sessions.values()))

    def on_discard(self, give_back: Callable[[], None]) -> None:
        """Run ``give_back`` if the writes queued so far never commit (a write outside a
        turn has committed already: nothing to give back)."""
        if self.outbox is not None:
            self.outbox.keep_undo(give_back)

    def session(self, session_id: str) -> SessionRecord | None:
        """A session as this turn sees it (its own new sessions included)."""
        if self.outbox is not None and session_id in self.outbox.sessions:
            return self.outbox.sessions[session_id]
        return self.ctx.store.session(session_id)

    def create_session(self, record: SessionRecord) -> SessionRecord:
        """Create a session (``DuplicateError`` if its id is taken)."""
        r = record
        if self.outbox is not None:
            self.outbox.note(r)
        return self.write(
            lambda: self.ctx.store.create_session_now(
                r.id, r.project_id, r.title, r.kind, r.created_at, parent_id=r.parent_id,
                platform=r.platform, config=r.config),
            r, lambda _r: None)

    def task(self, task_id: str) -> TaskRecord | None:
        """A task as this turn sees it (its own changes included)."""
        if self.outbox is not None and task_id in self.outbox.tasks:
            return self.outbox.tasks[task_id]
        return self.ctx.tasks.get(task_id)

    def tasks_of(self, chat_id: str) -> list[TaskRecord]:
        """A session's tasks as this turn sees them, oldest first."""
        stored = self.ctx.tasks.for_session(chat_id)
        if self.outbox is None:
            return stored
        mine = {t.id: t for t in self.outbox.tasks.values() if t.chat_id == chat_id}
        merged = [mine.pop(t.id, t) for t in stored]
        return merged + sorted(mine.values(), key=lambda t: (t.created_at, t.id))

    def note_task(self, record: TaskRecord) -> None:
        """Remember a task's state after a change queued in this turn (:meth:`Outbox.note`)."""
        if self.outbox is not None:
            self.outbox.note(record)


def commit_together(ctx: RuntimeContext, build: Callable[[Writes], T],
                    check: Callable[[], None] | None = None) -> T:
    """Run ``build``'s writes now, in one transaction: all of them durable, or none.

    For writes that cannot wait for a turn's commit yet must not be seen half-done
    (a foreground child without its task message would leave the retried turn
    waiting on a row that never comes), and for a tool's writes outside a turn
    (:meth:`Writes.together`). ``check`` runs first in that transaction
    and refuses by raising: a turn's :meth:`Outbox.check_open`, made on the writer
    thread with the writes, so the turn cannot end between the check and the
    writes (a turn that ends after the check commits after them, on that thread).

    It returns once the outcome is known: a batch that outran the wait (a
    :class:`WriteTimeout` not ``withdrawn``) may land yet, so the wait goes on until it
    lands or fails, as a turn's commit does (:func:`.steps.wait_landed`). An error
    means nothing of it was written and what ``build`` took in memory (rate-limit
    tokens, pending places) is given back, so calling again cannot duplicate.
    """
    staging = Outbox("")
    try:
        result = build(Writes(ctx, staging))
        effects = staging.close() or TurnEffects()

        def write() -> None:
            if check is not None:
                check()
            _run(effects.ops)
        if effects.ops or check is not None:  # nothing to write (every target refused)
            wait_landed(ctx.journal.writer.submit(write))
    except BaseException:
        staging.discard()
        raise
    _run(effects.after)
    return result


def _run(calls: Sequence[Callable[[], object]]) -> None:
    for call in calls:
        call()
