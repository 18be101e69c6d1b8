"""The Runtime: the composition root that wires stores, actors and threads.

``Runtime`` opens the database, upgrades the schema, starts the group-commit
writer, the dispatcher actor and a ticker, and rehydrates: every row that
was not acknowledged before the last stop (or crash) is claimed again and
replayed in order, while acknowledged rows never are (I7). It is also the
public API tests, scenarios and products use.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..persistence import (
    DEFAULT_LEASE_SECONDS,
    EnqueueResult,
    EntryRecord,
    ExclusiveLock,
    GroupCommitWriter,
    JobStore,
    Journal,
    NewMessage,
    ProjectRecord,
    SessionRecord,
    SessionStore,
    TaskStore,
    bind_tables,
    default_data_dir,
    default_url,
    is_sqlite,
    open_database,
    upgrade,
)
from . import access
from .clock import Clock, ManualClock, SystemClock
from .context import FAULTS, Observer, RuntimeContext
from .dispatcher import Dispatcher
from .errors import ConfigError, IdleTimeout, RuntimeStateError
from .family import Buckets
from .focal import Focal
from .focal_schedule import FocalSchedule
from .messages import Tick
from .peers import PeerService
from .subagents import report_back
from .tools import TaskTools, tools_for
from .turn import Brain, Turn

SYSTEM_PROJECTS = (("default", "Default"), ("social", "Social"))
"""Projects that always exist (S4)."""


def resolve_data_dir(url: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The runtime's data folder (Focal files, the device key): beside a SQLite file."""
    if data_dir is not None:
        return Path(data_dir)
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):]).expanduser().parent / "kinbox-data"
    return default_data_dir()


def silent_brain(turn: Turn) -> None:
    """A brain that reads its messages and says nothing."""


class Runtime:
    """A kinbox runtime on one database. Use as a context manager, or ``start``/``stop``."""

    def __init__(self, db: str | None = None, brain: Brain | None = None,
                 clock: Clock | None = None, max_active_sessions: int = 64, *,
                 max_live_sessions: int = 1024,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS, idle_ttl: float = 300.0,
                 tick_interval: float = 0.2, synchronous: str = "FULL",
                 data_dir: str | os.PathLike[str] | None = None,
                 faults: Iterable[str] = (),
                 ids: Callable[[], str] | None = None) -> None:
        if not isinstance(max_active_sessions, int) or max_active_sessions < 1:
            raise ConfigError(f"max_active_sessions must be an integer >= 1, "
                              f"got {max_active_sessions!r}")
        if not isinstance(max_live_sessions, int) or max_live_sessions < 1:
            raise ConfigError(f"max_live_sessions must be an integer >= 1, "
                              f"got {max_live_sessions!r}")
        if lease_seconds <= 0 or tick_interval <= 0 or idle_ttl <= 0:
            raise ConfigError("lease_seconds, tick_interval and idle_ttl must be > 0")
        unknown = set(faults) - FAULTS
        if unknown:
            raise ConfigError(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
        if brain is not None and not callable(brain):
            raise ConfigError("brain must be callable: brain(turn)")
        self.url = db or default_url()
        self.brain: Brain = brain or silent_brain
        self.clock: Clock = clock or SystemClock()
        self.max_active_sessions = max_active_sessions
        self.max_live_sessions = max_live_sessions
        self.lease_seconds = lease_seconds
        self.idle_ttl = idle_ttl
        self.tick_interval = tick_interval
        self.synchronous = synchronous
        self.faults = frozenset(faults)
        self.data_dir = Path(data_dir) if data_dir else None
        # Ids of new messages, sessions and projects; scenarios pass a seeded source.
        self.new_id: Callable[[], str] = ids or (lambda: uuid.uuid4().hex)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._ctx: RuntimeContext | None = None
        self._observers: list[Observer] = []
        self._state = "new"
        self._ticker_stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._lock: ExclusiveLock | None = None
        self._writer: GroupCommitWriter | None = None
        self._schedule: FocalSchedule | None = None
        self._peers: PeerService | None = None

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> Runtime:
        """Open the database, start the actors and replay what was not acknowledged."""
        if self._state != "new":
            raise RuntimeStateError(f"a runtime starts once; this one is {self._state}")
        if self.url.startswith("sqlite:///"):
            Path(self.url[len("sqlite:///"):]).expanduser().parent.mkdir(parents=True,
                                                                         exist_ok=True)
        db = open_database(self.url, synchronous=self.synchronous)  # type: ignore[arg-type]
        tables = bind_tables(db)
        if is_sqlite(db):
            self._lock = ExclusiveLock(db)
            self._lock.acquire()
        try:
            upgrade(tables)
            self._writer = GroupCommitWriter(db)
            self._writer.start()
            journal = Journal(tables, self._writer)
            store = SessionStore(tables, self._writer)
            ctx = RuntimeContext(journal=journal, store=store,
                                 tasks=TaskStore(tables, self._writer),
                                 clock=self.clock, brain=self.brain,
                                 owner=self.owner, lease_seconds=self.lease_seconds,
                                 faults=self.faults, tools_for=self._tools_for_ctx,
                                 new_id=self.new_id,
                                 observers=self._observers)
            self._wire_services(ctx, JobStore(tables, self._writer))
            self._ctx = ctx
            now = self.clock.now()
            for slug, name in SYSTEM_PROJECTS:
                store.ensure_project(slug, slug, name, now)
            if self._lock is not None:
                journal.expire_leases(now)  # the lock proves their holder is gone
            ctx.dispatcher = Dispatcher.start(ctx, self.max_active_sessions, self.idle_ttl,
                                              self.max_live_sessions)
            if self._schedule is not None:
                self._schedule.start()
            self._peers = ctx.peers = PeerService(ctx, self._resolve_data_dir())
            self._peers.start()
        except BaseException:
            self._teardown()
            raise
        self._state = "running"
        if isinstance(self.clock, ManualClock):
            self._unsubscribe = self.clock.subscribe(lambda _now: self._on_clock())
        self._ticker = threading.Thread(target=self._tick_loop, name="kinbox-ticker",
                                        daemon=True)
        self._ticker.start()
        ctx.emit("started", owner=self.owner)
        ctx.wake_dispatcher()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop: ask running turns to stop, let them commit, close the database."""
        if self._state != "running":
            return
        ctx = self._require()
        self._state = "stopped"
        ctx.closed.set()
        if self._schedule is not None:
            self._schedule.stop()
        self._stop_ticker()
        if self._peers is not None:
            self._peers.stop()
        for session_id in ctx.turns.running():
            ctx.turns.request_stop(session_id, "runtime")
        if ctx.dispatcher is not None:
            ctx.dispatcher.stop(timeout=timeout)  # stops its session actors first
        ctx.emit("stopped", owner=self.owner)
        self._teardown()

    def crash(self) -> None:
        """Stop abruptly, as a kill would: nothing queued is committed, no goodbyes."""
        if self._state != "running":
            raise RuntimeStateError(f"cannot crash a runtime that is {self._state}")
        ctx = self._require()
        self._state = "crashed"
        ctx.crashed.set()
        ctx.closed.set()
        if self._schedule is not None:
            self._schedule.stop()
        self._stop_ticker()
        if self._writer is not None:
            self._writer.abort()
        if self._peers is not None:
            self._peers.stop()
        if ctx.dispatcher is not None:
            ctx.dispatcher.stop(block=False)
        ctx.emit("crashed", owner=self.owner)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _wire_services(self, ctx: RuntimeContext, jobs: JobStore) -> None:
        """Sub-agents, family limits and Focal hook into the turn and task paths."""
        ctx.outbox_hooks.append(report_back)
        ctx.buckets = Buckets()
        focal = Focal(ctx, self._resolve_data_dir())
        ctx.focal = focal
        ctx.turn_hooks.append(focal.prepare_turn)
        ctx.outbox_hooks.append(focal.outbox)
        ctx.task_hooks.append(focal.task_hook)
        self._schedule = FocalSchedule(ctx, focal, jobs,
                                       use_apscheduler=not isinstance(self.clock, ManualClock))
        focal.schedule = self._schedule

    def _resolve_data_dir(self) -> Path:
        return resolve_data_dir(self.url, self.data_dir)

    def _teardown(self) -> None:
        if self._writer is not None:
            self._writer.stop()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _stop_ticker(self) -> None:
        self._ticker_stop.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(5)

    def _on_clock(self) -> None:
        # An injected clock moved: due schedules fire, due rows get claimed.
        if self._schedule is not None and self._state == "running":
            self._schedule.fire_due()
        self._tick()

    def _tick_loop(self) -> None:
        while not self._ticker_stop.wait(self.tick_interval):
            self._tick()

    def _tick(self) -> None:
        ctx = self._ctx
        if ctx is not None and ctx.dispatcher is not None and self._state == "running":
            try:
                ctx.dispatcher.tell(Tick())
            except Exception:
                pass  # the dispatcher is stopping

    def __enter__(self) -> Runtime:
        return self.start() if self._state == "new" else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _require(self) -> RuntimeContext:
        if self._ctx is None or self._state not in ("running", "stopped", "crashed"):
            raise RuntimeStateError("the runtime is not started; call start() or use `with`")
        return self._ctx

    def _running(self) -> RuntimeContext:
        if self._state != "running":
            raise RuntimeStateError(f"the runtime is {self._state}; it accepts no more work")
        return self._require()

    # -- observing -------------------------------------------------------------------------

    def subscribe(self, observer: Observer) -> None:
        """Call ``observer(event, data)`` for sends, claims, turns, retries, crashes."""
        self._observers.append(observer)

    @property
    def context(self) -> RuntimeContext:
        """The wiring shared by this runtime's actors (for extensions)."""
        return self._require()

    def statistics(self) -> dict[str, Any]:
        """A snapshot: dispatcher state, row counts per state, writer counters."""
        ctx = self._require()
        stats = ctx.activity.snapshot()
        stats["rows"] = ctx.journal.counts()
        stats["running"] = ctx.turns.running()
        if self._writer is not None:
            w = self._writer.statistics()
            stats["writer"] = {"batches": w.batches, "operations": w.operations,
                               "largest_batch": w.largest_batch}
        return stats

    def is_idle(self) -> bool:
        """True when no turn runs, no claim is scheduled and no row is due."""
        ctx = self._require()
        snap = ctx.activity.snapshot()
        if snap["busy"] or snap["claim_pending"]:
            return False
        return not ctx.journal.has_due(ctx.now())

    def run_until_idle(self, timeout: float = 10.0) -> None:
        """Wait until no row is due and no turn runs; :class:`IdleTimeout` after ``timeout``."""
        ctx = self._running()
        deadline = time.monotonic() + timeout
        while not self.is_idle():
            snap = ctx.activity.snapshot()
            if not snap["busy"] and not snap["claim_pending"]:
                # Due rows and nothing on the way (a backoff ran out, say): nudge. Only
                # then: a nudge while a claim is pending would keep the dispatcher busy.
                ctx.wake_dispatcher()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise IdleTimeout(timeout, self.statistics())
            with ctx.activity.cond:
                ctx.activity.cond.wait(min(remaining, 0.05))

    # -- projects and sessions -------------------------------------------------------------

    def create_project(self, slug: str, name: str | None = None, *,
                       hidden: bool = False) -> ProjectRecord:
        """Create a project with a unique ``slug``."""
        ctx = self._running()
        if not isinstance(slug, str) or not slug.strip():
            raise ConfigError("a project needs a non-empty slug")
        slug = slug.strip()
        return ctx.store.create_project(f"p_{self.new_id()[:10]}", slug, name or slug,
                                        ctx.now(), hidden=hidden)

    def project(self, slug: str) -> ProjectRecord | None:
        """The project with ``slug``, or None."""
        return self._require().store.project_by_slug(slug)

    def create_session(self, project_id: str | None, title: str, kind: str = "interactive",
                       parent_id: str | None = None, *, session_id: str | None = None,
                       platform: str | None = None,
                       config: dict[str, Any] | None = None) -> SessionRecord:
        """Create a session in a project (or none); returns its record (``.id``)."""
        ctx = self._running()
        if kind not in access.SESSION_KINDS | access.HIDDEN_KINDS:
            raise ConfigError(f"unknown session kind {kind!r}; one of "
                              f"{sorted(access.SESSION_KINDS | access.HIDDEN_KINDS)}")
        if project_id is not None and ctx.store.project(project_id) is None:
            raise ConfigError(f"no project with id {project_id!r}")
        if parent_id is not None and ctx.store.session(parent_id) is None:
            raise ConfigError(f"no parent session with id {parent_id!r}")
        sid = session_id or f"chat-{self.new_id()[:12]}"
        return ctx.store.create_session(sid, project_id, title, kind, ctx.now(),
                                        parent_id=parent_id, platform=platform, config=config)

    def session(self, session_id: str) -> SessionRecord | None:
        """The session with this id, or None."""
        return self._require().store.session(session_id)

    def sessions(self, project_id: str | None = None) -> list[SessionRecord]:
        """Sessions, most recently updated first."""
        return self._require().store.sessions(project_id=project_id)

    def tools_for(self, session_id: str) -> TaskTools:
        """The tools bound to ``session_id`` as the caller (agent tools unless a sub-agent)."""
        return self._tools_for_ctx(session_id)

    def _tools_for_ctx(self, session_id: str) -> TaskTools:
        return tools_for(self._running(), session_id)

    # -- messages --------------------------------------------------------------------------

    def post(self, target: str, content: str, *, sender: str | None = None,
             message_id: str | None = None, kind: str = "agent_message",
             payload: dict[str, Any] | None = None) -> EnqueueResult:
        """Enqueue a message from outside any session (a user, a test, an operator)."""
        ctx = self._running()
        if not ctx.journal.hot.session_exists(target):
            raise ConfigError(f"no session with id {target!r}")
        if not isinstance(content, str) or not content.strip():
            raise ConfigError("a message needs non-empty text")
        result = ctx.journal.enqueue(
            NewMessage(message_id or f"msg-{self.new_id()}", target, content, kind=kind,
                       sender=sender, payload=payload or {}), ctx.now())
        ctx.emit("sent", message_id=result.message_id, sender=sender, target=target, kind=kind,
                 created=result.created)
        ctx.wake_dispatcher()
        return result

    def inbox(self, state: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
        """Inbox rows as dicts, in journal order."""
        return self._require().journal.rows(state=state, target=target)

    def requeue(self, message_id: str) -> dict[str, Any]:
        """Operator: send a ``failed`` row back to ``pending`` (history kept)."""
        ctx = self._running()
        row = ctx.journal.requeue(message_id, ctx.now())
        ctx.emit("requeued", message_id=message_id)
        ctx.wake_dispatcher()
        return row

    def transcript(self, session_id: str) -> list[EntryRecord]:
        """Every transcript entry of a session (``role``, ``text``, ``visible``...)."""
        return self._require().store.transcript(session_id)

    @property
    def peers(self) -> PeerService:
        """The peer service (device identity, pairing, links to paired devices)."""
        peers = self._require().peers
        assert isinstance(peers, PeerService)
        return peers

    @property
    def focal(self) -> Focal:
        """The Focal service (``get_or_create_focal_chat``, ``status``, ``register_tool``...)."""
        return self._require().focal  # type: ignore[no-any-return]

    def get_or_create_focal_chat(self) -> SessionRecord:
        """The Focal chat ``focal-suzent``, created on first use (FO1)."""
        return self.focal.get_or_create_focal_chat()

    def marker_counts(self) -> dict[str, int]:
        """Committed delivery markers per message id (exactly-once evidence)."""
        return self._require().store.marker_counts()
