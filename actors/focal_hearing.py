"""How the Focal agent hears back (FO5): replies, blocked tasks, finished sessions.

Each is an inbox message to Focal, committed with the change that caused it: a reply to
a Focal request (truncated to :data:`REPLY_LIMIT`), with the replying turn; a task newly
blocked on ``user`` or ``error``, or its reason changed, and a followed session closing
its last open task, with the task change (one notice per event, each with an id of its
own). A finish is held back while a Focal request to the session is in flight (its
answer tells Focal), and sent with that answer's turn when the turn replies nothing or
fails for good, or with an operator's cancel of the request, which no turn answers. A
woken Focal's reply queues a user notification. A part of :class:`~.focal.Focal`.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Sequence
from typing import Any

from ..persistence import OPEN_TASK_STATES, NewMessage, SessionRecord, TaskChange, TaskRecord
from . import access, task_rules
from .context import HookReads, RuntimeContext, TurnEffects
from .inline_text import inline
from .subagents import next_free_id, taken_ids
from .tasks import view
from .turn import Message, Turn, TurnOutcome

FOCAL_ID = access.FOCAL_ID
REPLY_LIMIT = 4_000
NOTIFICATION_LIMIT = 100


def is_focal_chat(session: SessionRecord | None) -> bool:
    """The Focal chat, by the one rule of :func:`access.is_focal` (config flags do not count)."""
    return session is not None and access.is_focal(session)


class HearingBack:
    """Focal's task and outbox hooks, and its user notifications."""

    ctx: RuntimeContext
    notifications: collections.deque[dict[str, Any]]
    unread: int
    _lock: threading.Lock

    def exists(self) -> bool:
        """Has the Focal chat been created?"""
        return self.ctx.journal.hot.session_exists(FOCAL_ID)

    def _followed(self, session: SessionRecord) -> bool:
        return bool(session.config.get("spawned_by_focal") or session.config.get(
            "focal_watching"))

    def _request_in_flight(self, session_id: str, closed_at: float) -> bool:
        """A Focal request to the session is open that was asked by ``closed_at`` (when a
        task's change closed the session): its answer is to tell Focal (FO5). One asked
        later (while the turn that closed it still ran) is not: the held notice counts a
        closing before the request as not held back by it (:meth:`_held_notice`), and
        Focal never heard of it when the answer said nothing."""
        return self.ctx.journal.has_open_from(FOCAL_ID, session_id, created_by=closed_at)

    def task_hook(self, ctx: RuntimeContext, change: TaskChange) -> list[NewMessage]:
        """Inside a task change's transaction: notices for Focal, one per event. The task
        rules say what is an event (a task newly blocked, its reason changed, a session's
        last open task closed), so a task blocked again after it was unblocked, or a
        reopened session closing again, is a new event with a new id
        (``focal-blocked-<task>``, ``-2``, ``-3``...): an id naming the state heard the
        first and dropped the second, and Focal never learnt the session was waiting
        again. Chosen inside the transaction, so a turn's retry (which committed
        nothing) takes the same id."""
        session = ctx.store.session(change.after.chat_id)
        if session is None or is_focal_chat(session):
            return []
        before = view(change.before) if change.before else None
        after = view(change.after)
        out: list[NewMessage] = []
        task = change.after
        spawned = bool(session.config.get("spawned_by_focal"))
        if task_rules.became_blocked(before, after) and (spawned or self.exists()):
            out.append(NewMessage(
                next_free_id(ctx, f"focal-blocked-{task.id}"), FOCAL_ID,
                f"Session '{inline(session.title)}' ({session.id}) is blocked on "
                f"{task.blocked_on}: {inline(task.title)}"
                + (f" ({inline(task.reason)})" if task.reason else ""),
                kind="task_blocked_notification", sender=session.id,
                payload={"task_id": task.id, "blocked_on": task.blocked_on,
                         "reason": task.reason}))
        if (task_rules.closes_session(before, after, change.open_left) and self._followed(session)
                and self.exists() and not self._request_in_flight(session.id, task.updated_at)):
            out.append(self._finished(ctx, session, task))
        return out

    def _finished(self, ctx: RuntimeContext, session: SessionRecord,
                  task: TaskRecord) -> NewMessage:
        return NewMessage(
            next_free_id(ctx, f"focal-finished-{session.id}-{task.id}"), FOCAL_ID,
            f"Session '{inline(session.title)}' ({session.id}) finished its last open task: "
            f"{inline(task.title)}", kind="session_finished_notification", sender=session.id,
            payload={"task_id": task.id})

    def _held_finish(self, turn: Turn, asked: list[Message], ok: bool = True
                     ) -> TurnEffects | None:
        """The finished notice held back while Focal's request was in flight (FO5), for a
        turn that answers it without a reply (``ok``), or fails: the reply was to tell
        Focal, and a turn that only completed its task (a tool call, no text), or whose
        every attempt failed, told it nothing, ever. A failed turn's notice commits only
        when its row ends failed (a retry may yet answer)."""
        changed = ([t for t in turn.outbox.tasks.values() if t.chat_id == turn.session_id]
                   if ok and turn.outbox is not None else [])  # they commit with this turn
        asked_at = min((row.created_at for m in asked
                        if (row := self.ctx.journal.hot.existing(m.message_id)) is not None),
                       default=None)
        notice = self._held_notice(turn.session_id, asked_at, changed)
        return TurnEffects(messages=[notice]) if notice is not None else None

    def requests_cancelled(self, message_ids: list[str]) -> None:
        """Inside an operator's cancel of ``message_ids``: the finished notice held back for
        each that was a Focal request (FO5), as for a request whose turn fails for good. A
        cancelled request has no turn to answer it, and Focal never heard that the session
        had finished its last task."""
        ctx = self.ctx
        for message_id in message_ids:
            row = ctx.journal.hot.existing(message_id)
            if row is None or row.sender_chat_id != FOCAL_ID or row.target_chat_id == FOCAL_ID:
                continue
            notice = self._held_notice(row.target_chat_id, row.created_at)
            if notice is not None:
                ctx.journal.enqueue_now(notice, ctx.now())

    def _held_notice(self, session_id: str, asked_at: float | None,
                     changed: Sequence[TaskRecord] = ()) -> NewMessage | None:
        """The finished notice of ``session_id`` a Focal request asked at ``asked_at`` (its
        first, when known) held back, or None: not followed, a task still open (``changed``:
        the session's tasks as a turn committing with this changes them), closed before
        Focal asked, or this closing already noticed."""
        ctx = self.ctx
        session = ctx.store.session(session_id)
        if session is None or not self._followed(session) or not self.exists():
            return None
        tasks = {t.id: t for t in ctx.tasks.for_session(session.id)}
        tasks.update({t.id: t for t in changed})
        if not tasks or any(t.status in OPEN_TASK_STATES for t in tasks.values()):
            return None
        last = max(tasks.values(), key=lambda t: (t.updated_at, t.id))
        if asked_at is not None and last.updated_at < asked_at:
            return None  # closed before Focal asked: not held back by this request
        # Every task closed at that time may be the one whose change closed the session
        # (the notice names it, task_hook): tasks closed at one clock reading tie, and
        # the id that breaks the tie need not be the one noticed.
        closing = sorted(t.id for t in tasks.values() if t.updated_at == last.updated_at)
        heard = [ctx.journal.hot.existing(mid) for task_id in closing
                 for mid in taken_ids(ctx, f"focal-finished-{session.id}-{task_id}")]
        if any(row is not None and row.created_at >= last.updated_at for row in heard):
            return None  # this closing was noticed (the request was not yet in flight)
        return self._finished(ctx, session, last)

    def outbox(self, ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome
               ) -> TurnEffects | HookReads | None:
        """Outbox hook: replies to Focal, heartbeat signatures, user notifications."""
        if turn.session_id == FOCAL_ID:
            effects = TurnEffects()
            if outcome.ok:
                self._focal_turn_effects(turn, effects)
            else:  # run only once its row ends failed (a retry may yet succeed); what it
                # took as steering goes back to the inbox, to run again
                self._notify_all(effects, _reminders(turn.messages))
            return effects
        if not outcome.ok:  # likewise
            failed = [m for m in turn.messages if m.sender_id == FOCAL_ID]
            return functools.partial(self._held_finish, turn, failed, False) if failed else None
        asked = [m for m in turn.all_messages if m.sender_id == FOCAL_ID]
        if not asked:
            return None
        said = [r for r in turn.replies if r.strip()]  # a blank reply answers nothing
        if not said:
            return functools.partial(self._held_finish, turn, asked)
        return TurnEffects(messages=[NewMessage(
            f"focal-reply-{asked[-1].message_id}", FOCAL_ID,
            said[-1][:REPLY_LIMIT], kind="agent_message", sender=turn.session_id,
            payload={"in_reply_to": asked[-1].message_id})])

    def _focal_turn_effects(self, turn: Turn, effects: TurnEffects) -> None:
        ctx = self.ctx
        now = ctx.now()
        for m in turn.all_messages:
            if m.kind == "focal_heartbeat" and m.payload.get("signature"):
                sig = m.payload["signature"]
                effects.ops.append(lambda sig=sig: ctx.store.patch_config_now(
                    FOCAL_ID, {"focal_heartbeat_signature": sig}, now))
        # The user reads Focal's answers to them in the chat; a notification is for what
        # Focal says when something else woke it.
        woken = [m for m in turn.all_messages if not m.from_user]
        if not woken:
            return
        said = [r for r in turn.replies if r.strip()]  # white space says nothing
        # One answer, however many things woke Focal; a silent turn: every reminder still
        # notifies (FO7), each with its note (two due at once meet in one turn); a check
        # or a notice has nothing to say.
        self._notify_all(effects, [(said[-1], woken[0].kind)] if said else _reminders(woken))

    def _notify_all(self, effects: TurnEffects, notes: list[tuple[str, str]]) -> None:
        """Each of ``notes`` (text, source) a user notification once ``effects`` are done."""
        for text, kind in notes:
            effects.after.append(lambda text=text, kind=kind: self.notify(text, kind))

    def notify(self, text: str, source: str) -> None:
        """Queue a user notification (in memory, bounded)."""
        with self._lock:
            self.notifications.append({"text": text, "source": source, "at": self.ctx.now()})
            self.unread = min(self.unread + 1, NOTIFICATION_LIMIT)


def _reminders(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """The notes of the reminders among a Focal turn's ``messages``, as notifications (text,
    source): a reminder always notifies (FO7), whatever the turn said or whether it
    failed for good (its model down at the reminder's time)."""
    return [(str(m.payload.get("note") or m.content), m.kind) for m in messages
            if m.kind == "focal_wakeup" and m.payload.get("kind") == "reminder"]
