"""Operator commands: inspect and repair a live database (inbox, sessions, schema).

Every command takes ``--db`` (falling back to ``$KINBOX_DB``, then the data
directory's file) and works while a runtime is running on that database:
reads do not block it, and a requeue is one short transaction. The options and
argument types the commands share are :mod:`.cli_args`'s, how they print
:mod:`.cli_output`'s; how a command opens the database (:func:`stores`,
:func:`operator_runtime`, :func:`operator_clock`) is this module's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

import peewee as pw

from ..persistence import (
    SCHEMA_VERSION,
    InvalidArgument,
    Journal,
    RowNotFound,
    SessionStore,
    bind_tables,
    default_url,
    open_database,
    paging,
    redact_url,
    require_current,
    schema_status,
    sqlite_path,
    upgrade,
)
from ..persistence.inbox_core import State
from ..persistence.opened import opened
from ..persistence.schema_version import VersionVerdict
from ..transport.frames import shown
from .cli_args import (
    common,
    cursor_or_offset,
    kind_arg,
    limit_arg,
    position_arg,
    project_slug_arg,
    session_id_arg,
    usage_error,
)
from .cli_output import age, emit, emit_page, last_line, when
from .clock import Clock, SystemClock
from .errors import ConfigError
from .interrupts import EXIT_INTERRUPTED, StopBetweenSteps
from .shared_database import SharedDatabase

if TYPE_CHECKING:
    from .runtime import Runtime

STATES = tuple(s.value for s in State)

EXIT_UPGRADE_PENDING = 3
"""``db status``'s exit status while the schema needs ``kinbox db upgrade``: no error (that
is 1), a state a deploy script acts on before it starts a runtime."""


@contextmanager
def stores(url: str | None, *, check_schema: bool = True,
           read_only: bool = False) -> Iterator[tuple[Journal, SessionStore]]:
    """Open the journal and session store of an existing database for one command.

    A missing SQLite file is an error (``DatabaseMissing``), never created: only
    a runtime and ``kinbox db upgrade`` create databases. A command that only reads
    opens it ``read_only``: it changes nothing in the file, and works on one it may
    not write. One that writes checks the schema first (:func:`refuse_old_schema`).
    """
    url = url or default_url()
    if check_schema and not read_only:
        refuse_old_schema(url)
    with opened(url, must_exist=True, read_only=read_only,
                schema=require_current if check_schema else lambda _tables: None,
                writer_name="kinbox-cli-writer") as (tables, writer):
        yield Journal(tables, writer), SessionStore(tables, writer)


def refuse_old_schema(url: str) -> None:
    """Refuse a SQLite file of another schema (``SchemaError``), a missing one
    (``DatabaseMissing``), before a command opens it for writing: that open switches
    the file to WAL mode, and a file refused (another program's database, a mistyped
    ``--db``) must be left as it was. Nothing to do on a server database: its opening
    changes nothing."""
    if sqlite_path(url) is None:
        return
    db = open_database(url, read_only=True)
    try:
        require_current(bind_tables(db))
    finally:
        db.close()


@contextmanager
def operator_runtime(url: str | None) -> Iterator[Runtime]:
    """A send-only runtime on an existing database of the current schema (checked and
    refused as for every command), for an operator's change to inbox rows: the same code
    as ``rt.requeue`` and ``rt.cancel``, so a child task's requeue reopens it and its
    cancel is reported to its parent at once, as the API does; stamped by the runtime's
    clock (the server's on PostgreSQL). A send-only runtime claims nothing: it runs
    beside the delivering one. It has no peer service: a change to the journal makes no
    device key (a credential) in the data folder."""
    from .runtime import Runtime  # here: a command that only reads never loads it

    with stores(url):  # a missing file or an old schema: the command's usual refusal
        pass
    with Runtime(db=url or default_url(), peers=False) as rt:
        yield rt


@contextmanager
def operator_clock(db: pw.Database) -> Iterator[Clock]:
    """The clock an operator's change is stamped with: as a runtime's (``clock_for``), the
    server's on PostgreSQL, which every runtime sharing it tells the time by, so a requeued
    row is due at once whatever this machine's clock says; else this machine's."""
    shared = SharedDatabase()
    try:
        yield shared.clock_for(db, None, SystemClock())
    finally:
        shared.close()


def inbox_list(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox inbox list``: rows with their age and last error, never their bodies."""
    if args.offset is None:
        args.offset = 0
    with stores(args.db, read_only=True) as (journal, _), operator_clock(journal.t.db) as clock:
        # One more than asked (the oldest, listed first) says whether older rows follow.
        rows = journal.rows(state=args.state, target=args.target, limit=args.limit + 1,
                            offset=args.offset, before_seq=args.before_seq)
        now = clock.now()  # the rows' own clock: ages are not off by this machine's skew
    more = len(rows) > args.limit
    rows = rows[1:] if more else rows
    # The next page is named by position, the oldest row's seq (unique, never changed):
    # an offset counts from the newest row, and each row enqueued meanwhile (or, with
    # --state, each row leaving it) shifted the page the operator was told to list.
    before = rows[0]["seq"] if more else None
    lines = [f"{'seq':>6}  {'state':<10} {'att':>3} {'age':>5}  {'target':<28} {'kind':<22} "
             f"{'message_id':<40} last error"]
    lines += [f"{r['seq']:>6}  {r['status']:<10} {r['attempts']:>3} "
              f"{age(now - r['created_at']):>5}  {r['target_chat_id']:<28} "
              f"{r['kind']:<22} {r['message_id']:<40} {last_line(r['last_error'])[:80]}"
              for r in rows]
    if not rows:
        lines = ["no rows" + (f" in state {args.state}" if args.state else "")
                 + (f" from offset {args.offset}" if args.offset else "")
                 + (f" before seq {args.before_seq}" if args.before_seq else "")]
    # Message bodies stay out of listings; `inbox show` prints one on request. The payload
    # too: a chat message's holds the sender's text whole, and its attachments.
    for r in rows:
        r.pop("content", None)
        r.pop("payload", None)
    emit_page(out, args, rows, more, lines, next_page="the {limit} rows before these",
              keyset=True, after=before, cursor="before-seq")
    return 0


def inbox_show(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox inbox show ID``."""
    with stores(args.db, read_only=True) as (journal, _):
        row = journal.get_with_history(args.message_id)
    lines = [f"{k}: {row[k]}" for k in row if k not in ("history", "payload")]
    lines.append(f"payload: {json.dumps(row['payload'], sort_keys=True)}")
    lines.append("history:" if row["history"] else "history: (none)")
    lines += [f"  {when(h['at'])}  {h['event']:<9} attempts={h['attempts']}  {h['detail'] or ''}"
              for h in row["history"]]
    emit(out, args.json, row, lines)
    return 0


def inbox_requeue(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox inbox requeue ID`` or ``--all-failed [--target T] [--kind K]``.

    Only ``failed`` rows go back to ``pending``; the bulk form requeues every
    failed row matching the filter, oldest first, in batches (each its own transaction).
    Ctrl-C (or SIGTERM) stops it after the batch under way: it lists what the batches it
    committed requeued, and exits 130.
    """
    if (args.message_id is None) == (not args.all_failed):
        usage_error(args, "give a message id, or --all-failed (with --target/--kind to "
                          "narrow it), not both")
    if args.message_id is not None and (args.target is not None or args.kind is not None):
        # One id is requeued whatever its target and kind: a filter beside it would be
        # ignored, and the operator would requeue a row they meant to leave alone.
        usage_error(args, "--target and --kind filter --all-failed; requeue one id alone")
    if args.message_id is not None:
        with operator_runtime(args.db) as rt:
            row = rt.requeue(args.message_id)
        emit(out, args.json, row, [f"requeued {row['message_id']}: pending again, "
                                    "attempts reset (history kept)"])
        return 0
    with (StopBetweenSteps("the batch under way") as stop,
          operator_runtime(args.db) as rt):
        ids = rt.requeue_failed(target=args.target, kind=args.kind,
                                stop=lambda: stop.asked)
        interrupted = stop.asked
    emit(out, args.json, {"requeued": ids, "interrupted": interrupted},
          [f"requeued {len(ids)} failed row(s)"
           + ("; interrupted: the rest stay failed until the next requeue"
              if interrupted else ""), *(f"  {i}" for i in ids)])
    return EXIT_INTERRUPTED if interrupted else 0


def inbox_cancel(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox inbox cancel ID --reason TEXT``: give up on a pending or failed row."""
    if not (args.reason or "").strip():
        usage_error(args, "say why: --reason TEXT (kept in the row's history)")
    from .runtime_records import cancel_note  # with the runtime: see operator_runtime

    try:
        reason, by = cancel_note(args.reason, args.by)
    except ConfigError as exc:  # a --by left empty, a reason past its length
        usage_error(args, f"argument --{exc.field}: {exc}")
    with operator_runtime(args.db) as rt:
        row = rt.cancel(args.message_id, reason, by=by)
    emit(out, args.json, row, [f"cancelled {row['message_id']} (by {shown(by)}: "
                                f"{shown(reason)}); the rows behind it for its session "
                                "move up"])
    return 0


def cursor_arg(text: str) -> paging.Keyset:
    """An argparse type: an ``--after``, the cursor a page printed (the stores' rule, so
    that a mistyped one is a usage error before anything is opened)."""
    try:
        position = paging.keyset(text)
    except InvalidArgument:
        raise argparse.ArgumentTypeError(
            f"expected the cursor a page printed (its '... more: --after' line or "
            f"its JSON's next_after), got {redact_url(text)[:40]!r}") from None
    assert position is not None
    return position


def sessions_list(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox sessions list``."""
    if args.offset is None:
        args.offset = 0
    with stores(args.db, read_only=True) as (_, store):
        project_id = None
        if args.project is not None:
            project = store.project_by_slug(args.project)
            if project is None:
                raise RowNotFound("project", args.project, by="slug")
            project_id = project.id
        # In creation order, from a cursor: by recency a session active between two
        # reads moved ahead of the page boundary, and a walk showed another twice.
        page = store.sessions_page(project_id=project_id, limit=args.limit,
                                   after=args.after, offset=args.offset)
        slugs = {p.id: p.slug for p in store.projects()}
    more, sessions = page.after is not None, page.sessions
    data = [{"id": s.id, "title": s.title, "kind": s.kind, "status": s.status,
             "project": slugs.get(s.project_id or ""), "parent_id": s.parent_id,
             "updated_at": s.updated_at} for s in sessions]
    lines = [f"{'id':<32} {'kind':<12} {'status':<7} {'project':<16} title"]
    lines += [f"{d['id']:<32} {d['kind']:<12} {d['status']:<7} {d['project'] or '-':<16} "
              f"{d['title']}" for d in data]
    if not data:
        lines = ["no sessions" + (f" from offset {args.offset}" if args.offset else "")
                 + (" after the cursor" if args.after else "")]
    emit_page(out, args, data, more, lines, next_page="the next {limit}", keyset=True,
              after=page.after)
    return 0


def db_status(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox db status``: schema changes pending, the schema version and rows per
    state; exits :data:`EXIT_UPGRADE_PENDING` while changes are pending."""
    with stores(args.db, check_schema=False, read_only=True) as (journal, _):
        status = schema_status(journal.t)
        changes, stamp = status.changes, status.stamp
        # Every state, 0 included: a script reads rows["failed"] whether or not any failed.
        # None while an upgrade is pending: nothing was counted, and {} would read as empty.
        found = None if changes else journal.counts()
    counts = None if found is None else {s: found.get(s, 0) for s in STATES}
    version = {"database": stamp.version, "compatible_from": stamp.compatible,
               "this_kinbox": SCHEMA_VERSION}
    data = {"url": redact_url(args.db or default_url()), "up_to_date": not changes,
            "pending": changes, "schema_version": version,
            "rows": counts}
    lines = [f"database: {data['url']}",
             f"schema: {'up to date' if not changes else 'needs upgrade'}"]
    lines += [f"  pending: {c}" for c in changes]
    if stamp.version == 0:  # an empty database, or one from before the number
        lines.append(f"schema version: none recorded (this kinbox: {SCHEMA_VERSION})")
    else:
        newer = status.verdict is VersionVerdict.NEWER_COMPATIBLE
        lines.append(f"schema version: {stamp.version} (this kinbox: {SCHEMA_VERSION}; "
                     f"{'upgraded by a newer kinbox; ' if newer else ''}kinbox of schema "
                     f"version {stamp.compatible} or later may work on it)")
    lines += [f"rows {s}: {n}" for s, n in (counts or {}).items()]
    emit(out, args.json, data, lines)
    return EXIT_UPGRADE_PENDING if changes else 0


def db_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox db upgrade``: create missing tables, columns and indexes (and, like a
    runtime's start, a new SQLite file's folder: the commands that find no database say
    to run this)."""
    # Here, not at the top: the key file's module brings the cryptography library, no part
    # of every command's start.
    from ..transport.key_file import private_folder

    url = args.db or default_url()
    path = sqlite_path(url)
    if path is not None:
        private_folder(path.parent)
    db = open_database(url)
    try:
        changes = upgrade(bind_tables(db))
    finally:
        db.close()
    emit(out, args.json, {"applied": changes},
          [f"applied: {c}" for c in changes] or ["schema already up to date"])
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``inbox``, ``sessions`` and ``db``."""

    inbox = sub.add_parser("inbox", help="inspect and repair the durable inbox")
    isub = inbox.add_subparsers(dest="action", required=True)
    p = common(isub.add_parser("list", help="list inbox rows"))
    p.add_argument("--state", choices=STATES)
    p.add_argument("--target", type=session_id_arg, help="only rows addressed to this session")
    p.add_argument("--limit", type=limit_arg, default=100,
                   help="the newest N rows (default 100), listed oldest first")
    cursor_or_offset(p, "before-seq", position_arg,
                     "only rows older than seq SEQ (the page before one: its '... more: "
                     "--before-seq' line; each row once, however many arrive meanwhile)",
                     "but the newest N (rows enqueued meanwhile shift it)", metavar="SEQ")
    p.set_defaults(handler=inbox_list)
    p = common(isub.add_parser("show", help="one row in full, with its history"))
    p.add_argument("message_id")
    p.set_defaults(handler=inbox_show)
    p = common(isub.add_parser("requeue", help="send failed rows back to pending"))
    p.add_argument("message_id", nargs="?", help="one failed row (or use --all-failed)")
    p.add_argument("--all-failed", action="store_true",
                   help="every failed row matching --target / --kind")
    p.add_argument("--target", type=session_id_arg,
                   help="with --all-failed: only rows addressed to this session")
    p.add_argument("--kind", type=kind_arg, help="with --all-failed: only rows of this kind")
    p.set_defaults(handler=inbox_requeue)
    p = common(isub.add_parser("cancel", help="give up on a pending or failed row"))
    p.add_argument("message_id")
    p.add_argument("--reason", required=True, help="why (kept in the row's history)")
    p.add_argument("--by", default="operator", help="who cancels (default: operator)")
    p.set_defaults(handler=inbox_cancel)

    sessions = sub.add_parser("sessions", help="list sessions")
    ssub = sessions.add_subparsers(dest="action", required=True)
    p = common(ssub.add_parser("list", help="list sessions, newest first"))
    p.add_argument("--project", type=project_slug_arg, help="project slug")
    p.add_argument("--limit", type=limit_arg, default=100,
                   help="at most N sessions (default 100), newest first (by creation)")
    cursor_or_offset(p, "after", cursor_arg,
                     "the page after the one that printed CURSOR (each session once, "
                     "however many turn meanwhile)",
                     "skip the first N (sessions created meanwhile shift it)")
    p.set_defaults(handler=sessions_list)

    dbp = sub.add_parser("db", help="schema status and upgrade")
    dsub = dbp.add_subparsers(dest="action", required=True)
    common(dsub.add_parser(
        "status", help="schema and row counts",
        description=f"The schema's state and rows per state. Exit status: 0 up to date, "
                    f"{EXIT_UPGRADE_PENDING} an upgrade is pending (run kinbox db upgrade), "
                    f"1 an error.")).set_defaults(handler=db_status)
    common(dsub.add_parser("upgrade", help="bring the schema up to date")).set_defaults(
        handler=db_upgrade)


def inbox_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]
                   ) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommands of ``kinbox inbox`` (registered by :func:`add_parsers`), for the
    commands other modules add there (``inbox prune``)."""
    inbox = sub.choices["inbox"]
    return next(a for a in inbox._actions if isinstance(a, argparse._SubParsersAction))


