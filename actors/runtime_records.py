"""The records half of the Runtime's API: projects, sessions, messages, operator actions.

A mixin of :class:`~.runtime.Runtime`, which supplies the running context
(``_running`` / ``_require``) and the id source. Every entry point validates
its arguments with the tools' own rules (``validation``) and answers a
:class:`ConfigError` naming the field; nothing is written before they pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import peewee as pw

from ..persistence import (
    EnqueueResult,
    EntryRecord,
    InvalidArgument,
    NewMessage,
    ProjectRecord,
    RowNotFound,
    SessionPage,
    SessionRecord,
    paging,
    retention,
)
from ..persistence.inbox_core import State
from ..persistence.inbox_records import DEFAULT_KIND
from ..persistence.models import InboxMessage, Project, Session
from . import access, pruning, subagents, validation
from .errors import ConfigError, ToolError
from .focal import FOCAL_PROJECT
from .ids import short
from .outbox import Outbox
from .tools import TaskTools, tools_for

if TYPE_CHECKING:
    from .context import RuntimeContext

log = logging.getLogger("kinbox.runtime")

INBOX_STATES = tuple(state.value for state in State)
"""The states an inbox row can be in."""

KNOWN_SESSIONS_LIMIT = 100_000
"""Session ids a runtime remembers as existing before it starts over (memory bound)."""


class RecordsApi:
    """Projects, sessions, messages and operator actions of a started runtime."""

    new_id: Callable[[], str]
    _known_sessions: set[str]

    def _running(self) -> RuntimeContext:
        raise NotImplementedError  # Runtime's

    def _require(self) -> RuntimeContext:
        raise NotImplementedError  # Runtime's

    def _made(self) -> RuntimeContext:
        raise NotImplementedError  # Runtime's

    # -- projects and sessions -------------------------------------------------------------

    def create_project(self, slug: str, name: str | None = None, *,
                       hidden: bool = False) -> ProjectRecord:
        """Create a project with a unique ``slug`` (``DuplicateError`` if it is taken).

        To reuse an existing one: ``rt.project(slug) or rt.create_project(slug)``.
        """
        ctx = self._running()
        slug = _checked("slug", validation.require_slug, slug)
        if slug == FOCAL_PROJECT:
            # Focal's hidden project is made on first use by this slug (FO1): a visible
            # project of it made first became Focal's, open to every session in it.
            raise ConfigError(f"the slug {FOCAL_PROJECT!r} is the runtime's (the Focal "
                              "agent's hidden project)", field="slug")
        if not isinstance(hidden, bool):  # the column would keep whatever it was given
            raise ConfigError(f"hidden must be True or False, not {type(hidden).__name__}",
                              field="hidden")
        # The column's length, not a title's (512): PostgreSQL failed a longer name with a
        # database error where SQLite stored it.
        name = slug if name is None else _checked("name", validation.require_message, name,
                                                   _column("name", Project), "name")
        return ctx.store.create_project(f"p_{short(self.new_id(), 10)}", slug, name,
                                        ctx.now(), hidden=hidden)

    def project(self, slug: str) -> ProjectRecord | None:
        """The project with ``slug``, or None."""
        store = self._require().store
        key = validation.lookup_key(slug)
        return store.project_by_slug(key) if key is not None else None

    def create_session(self, project_id: str | None, title: str, kind: str = "interactive",
                       parent_id: str | None = None, *, session_id: str | None = None,
                       platform: str | None = None,
                       config: dict[str, Any] | None = None) -> SessionRecord:
        """Create a session in a project (or none); returns its record (``.id``)."""
        ctx = self._running()
        title = _checked("title", validation.require_message, title, validation.TITLE_LIMIT,
                         "title")
        session_id = _optional_id("session_id", session_id, _column("id", Session))
        platform = _optional_id("platform", platform, _column("platform", Session))
        if config is not None:
            _check_json_object("config", config)
        if not isinstance(kind, str) or kind not in access.SESSION_KINDS | access.HIDDEN_KINDS:
            raise ConfigError(field="kind", message=f"unknown session kind {kind!r}; one of "
                              f"{sorted(access.SESSION_KINDS | access.HIDDEN_KINDS)}")
        claim = access.focal_claim(session_id, kind, platform, config)
        if claim is not None:  # only get_or_create_focal_chat makes the Focal session (FO1)
            raise ConfigError(f"{claim}: only the runtime creates the Focal session "
                              f"({access.FOCAL_ID}); use rt.get_or_create_focal_chat()",
                              field=claim)
        if project_id is not None and (validation.lookup_key(project_id) is None
                                       or ctx.store.project(project_id) is None):
            raise ConfigError(f"no project with id {project_id!r}", field="project_id")
        if parent_id is not None and self.session(parent_id) is None:
            raise ConfigError(f"no parent session with id {parent_id!r}", field="parent_id")
        sid = session_id or f"chat-{short(self.new_id(), 12)}"
        return ctx.store.create_session(sid, project_id, title, kind, ctx.now(),
                                        parent_id=parent_id, platform=platform, config=config)

    def session(self, session_id: str) -> SessionRecord | None:
        """The session with this id, or None."""
        store = self._require().store
        key = validation.lookup_key(session_id)
        return store.session(key) if key is not None else None

    def sessions(self, project_id: str | None = None, *, limit: int | None = None,
                 offset: int = 0) -> list[SessionRecord]:
        """Sessions, most recently updated first, ties by id (of one project, or all).

        ``limit`` and ``offset`` give a page: at most ``limit`` sessions from the
        ``offset``-th on. Without ``limit`` every session is read into memory, which on
        a database of years is an outage waiting to happen: list with a limit. Pages
        neither repeat nor skip while no session changes; one that is active between
        two reads moves to the front (the order is recency), so a walk over the pages
        shows one session twice and skips another: walk with :meth:`sessions_page`."""
        store = self._require().store
        limit = _paged(paging.limit, limit)
        offset = _paged(paging.offset, offset)
        if project_id is not None and validation.lookup_key(project_id) is None:
            return []  # no project has that id (PostgreSQL would fail the query)
        return store.sessions(project_id=project_id, limit=limit, offset=offset)

    def sessions_page(self, project_id: str | None = None, *, limit: int | None = 100,
                      after: str | None = None) -> SessionPage:
        """A page of a walk over the sessions (of one project, or all), newest first by
        creation (ties by id): at most ``limit`` past the cursor ``after`` (None: the
        first page); ``.sessions``, and ``.after``, the cursor of the next page (None on
        the last). Each session that existed when the walk began is on exactly one page,
        however many turn meanwhile (:meth:`sessions`' recency order moves them between
        pages). A bad ``limit`` or ``after`` is a ConfigError naming it."""
        store = self._require().store
        limit = _paged(paging.limit, limit)
        position = _paged(lambda value: paging.keyset(value, "after"), after)
        if project_id is not None and validation.lookup_key(project_id) is None:
            return SessionPage([], None)  # no project has that id
        return store.sessions_page(project_id=project_id, limit=limit, after=position)

    def tools_for(self, session_id: str) -> TaskTools:
        """The tools bound to ``session_id`` as the caller (agent tools unless a sub-agent)."""
        ctx = self._running()
        return tools_for(ctx, _checked("session_id", validation.require_str, "session_id",
                                       session_id))

    def _tools_for_ctx(self, session_id: str, outbox: Outbox) -> TaskTools:
        """A running turn's tools: built when the brain first asks, a stop may have begun
        by then; each call says so (the turn still commits what it did). A turn may also
        run before start() is over (the dispatcher claims as soon as it runs), so the
        context is taken as it is, not only from a runtime that says it is running."""
        return tools_for(self._made(), session_id, outbox)

    # -- messages --------------------------------------------------------------------------

    def post(self, target: str, content: str, *, sender: str | None = None,
             message_id: str | None = None, kind: str = DEFAULT_KIND,
             payload: dict[str, Any] | None = None) -> EnqueueResult:
        """Enqueue a message from outside any session (a user, a test, an operator).

        ``content`` follows the ``agent_send`` rules (stripped, 1..20,000
        characters of valid Unicode); ``payload`` must be a JSON object.
        A ``message_id`` already in the journal is no new message (the same message:
        target, content, kind, sender and payload, the payload as stored, keys sorted:
        the first receipt, ``created`` False; any of them other: ``IdempotencyConflict``).
        The journal remembers ids only as long as it keeps their rows: once a finished
        row is pruned (``prune``, ``retention``), its id is new again, so the
        de-duplication window is the retention period.
        """
        ctx = self._running()
        target = _checked("target", validation.require_id, "target", target)
        if target not in self._known_sessions:
            if not ctx.journal.hot.session_exists(target):
                raise ConfigError(f"no session with id {target!r}", field="target")
            if len(self._known_sessions) >= KNOWN_SESSIONS_LIMIT:
                self._known_sessions.clear()
            self._known_sessions.add(target)
        content = _checked("content", validation.require_message, content,
                           validation.SEND_LIMIT, "content")
        if kind != DEFAULT_KIND:  # the default is valid: most posts skip its check
            kind = _checked("kind", validation.require_id, "kind", kind, _column("kind"))
        sender = _optional_id("sender", sender, _column("sender_chat_id"))
        message_id = _optional_id("message_id", message_id, _column("message_id"))
        if payload is not None:
            _check_json_object("payload", payload)
        return ctx.enqueue(
            NewMessage(message_id or f"msg-{self.new_id()}", target, content, kind=kind,
                       sender=sender, payload=payload or {}))

    def inbox(self, state: str | None = None, target: str | None = None, *,
              limit: int | None = None, before_seq: int | None = None
              ) -> list[dict[str, Any]]:
        """Inbox rows as dicts, in journal order; ``state`` one of :data:`INBOX_STATES`.

        ``limit`` keeps the newest ``limit`` rows (still in journal order), and
        ``before_seq`` only rows older than that ``seq``: the page before is
        ``rt.inbox(..., limit=n, before_seq=page[0]["seq"])``, an index walk from there
        (``seq`` is unique, so pages neither repeat nor skip), empty past the oldest row.
        Without ``limit`` every matching row is read into memory: fine for a test or a
        scenario, an outage on a journal of millions of rows."""
        if state is not None and state not in INBOX_STATES:
            raise ConfigError(f"state must be one of {', '.join(INBOX_STATES)}; got {state!r}",
                              field="state")
        limit = _paged(paging.limit, limit)
        before_seq = _paged(paging.position, before_seq)
        journal = self._require().journal
        if target is not None and validation.lookup_key(target) is None:
            return []  # no row can have it (PostgreSQL would fail the query)
        return journal.rows(state=state, target=target, limit=limit, before_seq=before_seq)

    def requeue(self, message_id: str) -> dict[str, Any]:
        """Operator: send a ``failed`` row back to ``pending`` (history kept)."""
        ctx = self._running()
        reopened = subagents.Reopened(ctx)
        row = ctx.journal.requeue(_row_key(message_id), ctx.now(), also=reopened.in_txn)
        reopened.announce()
        ctx.emit("requeued", message_id=message_id)
        log.info("requeued %s", message_id)
        ctx.wake_dispatcher()
        return row

    def requeue_failed(self, *, target: str | None = None, kind: str | None = None,
                       stop: Callable[[], bool] | None = None) -> list[str]:
        """Operator: requeue every ``failed`` row (of ``target``, of ``kind``); their ids.

        In batches, each its own transaction: ``stop`` is asked after each, and true ends
        the requeue there (the ids are then those of the batches committed)."""
        ctx = self._running()
        if any(v is not None and validation.lookup_key(v) is None for v in (target, kind)):
            return []  # no row can have it (PostgreSQL would fail the query)
        reopened = subagents.Reopened(ctx)

        ids: list[str] = []
        for batch in ctx.journal.requeue_steps(ctx.now(), target=target, kind=kind,
                                               also=reopened.in_txn):
            if batch:  # durable now: its rows are due
                ids += batch
                reopened.announce()
                for message_id in batch:
                    ctx.emit("requeued", message_id=message_id)
                ctx.wake_dispatcher()
            if stop is not None and stop():
                break
        log.info("requeued %d failed rows", len(ids))
        return ids

    def cancel(self, message_id: str, reason: str, *, by: str = "operator") -> dict[str, Any]:
        """Operator: give up on a ``pending`` or ``failed`` row (terminal ``cancelled``).

        Who and why stay in its history; the rows behind it for the same
        session move up at once instead of waiting out its backoff.
        """
        ctx = self._running()
        reason, by = cancel_note(reason, by)
        row = ctx.journal.cancel(_row_key(message_id), ctx.now(), by=by, reason=reason,
                                 also=ctx.focal.requests_cancelled)
        subagents.report_ended(ctx, [message_id])  # no turn reports a cancelled task
        ctx.emit("cancelled", message_id=message_id, by=by)
        log.info("cancelled %s (by %s)", message_id, by)
        ctx.wake_dispatcher()
        return row

    def prune(self, older_than: float, *, dry_run: bool = False,
              batch: int = retention.DEFAULT_BATCH) -> dict[str, int]:
        """Operator: delete finished inbox rows (``delivered``, ``cancelled``) last changed
        more than ``older_than`` seconds ago, with their delivery markers and history, in
        transactions of ``batch`` rows, then the cron runs that finished before it (each
        job's newest kept: what its next run's reminder reads); the counts (``rows``,
        ``markers``, ``events``, ``cron_runs``).

        Never an open or ``failed`` row, nor one a live path still reads (an open task's
        messages; see :mod:`kinbox.persistence.retention`); transcripts stay whole. With
        ``dry_run`` nothing is deleted and the counts say what would be. A re-sent
        ``message_id`` of a pruned row is a new message."""
        ctx = self._running()
        return pruning.prune(ctx, older_than, dry_run=dry_run, batch=batch).as_dict()

    def transcript(self, session_id: str, *, limit: int | None = None,
                   before_id: int | None = None) -> list[EntryRecord]:
        """A session's transcript entries (``id``, ``role``, ``text``, ``visible``...),
        oldest first.

        ``limit`` keeps the newest ``limit`` entries (still oldest first), and
        ``before_id`` only entries older than that entry's ``id``: the page before is
        ``rt.transcript(sid, limit=n, before_id=page[0].id)``, an index walk from there
        (ids are unique, so pages neither repeat nor skip), empty past the oldest entry.
        Without ``limit`` every entry is read into memory: fine for a test or a
        scenario, an outage on a session of years. A bad ``limit`` or ``before_id`` is a
        ConfigError naming it."""
        limit = _paged(paging.limit, limit)
        before_id = _paged(lambda value: paging.position(value, "before_id"), before_id)
        store = self._require().store
        key = validation.lookup_key(session_id)
        return (store.transcript(key, last=limit, before_id=before_id) if key is not None
                else [])

    def marker_counts(self) -> dict[str, int]:
        """Committed delivery markers per message id (exactly-once evidence)."""
        return self._require().store.marker_counts()


CANCEL_REASON_LIMIT = 2000
"""Longest reason an operator's cancel keeps in the row's history, in characters."""


def cancel_note(reason: object, by: object) -> tuple[str, str]:
    """Why and by whom a row is cancelled, as every entry point (``rt.cancel``,
    ``kinbox inbox cancel``) checks them: stripped, not empty, bounded; a ConfigError
    naming the field."""
    return (_checked("reason", validation.require_message, reason, CANCEL_REASON_LIMIT,
                     "reason"),
            _checked("by", validation.require_message, by, validation.TITLE_LIMIT, "by"))


def _checked(field: str, check: Callable[..., Any], *args: Any) -> Any:
    """Run one of the tools' argument rules on a public entry point: a ConfigError here."""
    try:
        return check(*args)
    except ToolError as exc:
        raise ConfigError(exc.message, field=field) from None


def _paged(check: Callable[[object], Any], value: object) -> Any:
    """A paging argument, by the stores' own rule (:mod:`kinbox.persistence.paging`),
    checked before anything is read: a ConfigError naming the field here."""
    try:
        return check(value)
    except InvalidArgument as exc:
        raise ConfigError(str(exc), field=exc.field) from None


def _optional_id(field: str, value: object, limit: int | None = None) -> str | None:
    """An optional id argument: None, or a non-empty storable string (stripped), at most
    ``limit`` characters when given."""
    if value is None:
        return None
    return str(_checked(field, validation.require_id, field, value, limit))


def _column(name: str, model: type[pw.Model] = InboxMessage) -> int:
    """The length of a column (an inbox row's, by default): what PostgreSQL stores (SQLite
    would take more, so the two backends would disagree on what a call may carry)."""
    return int(model._meta.fields[name].max_length)  # type: ignore[attr-defined]


def _row_key(message_id: object) -> str:
    """``message_id`` for an operator's lookup; :class:`RowNotFound` when no row can have
    it (PostgreSQL would fail the query instead)."""
    key = validation.lookup_key(message_id)
    if key is None:
        raise RowNotFound("inbox row", str(message_id))
    return key


def _check_json_object(field: str, value: object) -> None:
    """``value`` must be a dict that JSON can hold (a payload, a session's config), of at
    most :data:`~.validation.JSON_OBJECT_LIMIT` characters as stored."""
    if not isinstance(value, dict):
        raise ConfigError(f"{field} must be a dict (a JSON object), not "
                          f"{type(value).__name__}", field=field)
    try:
        stored = json.dumps(value, sort_keys=True)  # as it is stored (inbox_records, sessions)
    # RecursionError: nested deeper than the interpreter's limit (no ValueError).
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{field} must be JSON-serialisable: {exc}", field=field) from None
    if len(stored) > validation.JSON_OBJECT_LIMIT:
        raise ConfigError(f"{field} is {len(stored):,} characters as JSON; at most "
                          f"{validation.JSON_OBJECT_LIMIT:,}", field=field)
