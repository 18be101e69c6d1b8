"""The Runtime: the composition root that wires stores, actors and threads.

``Runtime`` opens the database, upgrades the schema, starts the group-commit
writer, the dispatcher actor and a ticker, and rehydrates: every row that
was not acknowledged before the last stop (or crash) is claimed again and
replayed in order, while acknowledged rows never are (I7). It is also the
public API tests, scenarios and products use.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import peewee as pw

from ..persistence import (
    DEFAULT_LEASE_SECONDS,
    DatabaseOpenError,
    ExclusiveLock,
    GroupCommitWriter,
    JobStore,
    Journal,
    Lease,
    OwnerLiveness,
    RateBuckets,
    SessionRecord,
    SessionStore,
    StopRequests,
    TaskStore,
    bind_tables,
    default_url,
    is_postgres,
    is_sqlite,
    open_database,
    redact_url,
    sqlite_path,
    upgrade,
)
from ..transport.key_file import private_folder
from . import subagents
from .async_host import AsyncHost
from .clock import Clock, ManualClock, SystemClock
from .context import Observer, RuntimeContext
from .cron import CronService
from .data_dirs import data_dir_for, resolve_data_dir
from .dispatcher import Dispatcher, tick_interval_for
from .errors import ConfigError, RuntimeStateError
from .exit_stop import stop_at_exit
from .family import Buckets
from .focal import Focal
from .health import HealthChecks
from .ids import new_id
from .lease_renewal import LeaseRenewal
from .peers import PeerService
from .pruning import Retention, older_than_seconds
from .runtime_life import LifeCycleApi
from .runtime_options import check_options
from .runtime_records import INBOX_STATES, RecordsApi
from .runtime_tick import TickApi
from .runtime_watch import WatchApi
from .services import Services
from .shared_database import SharedDatabase
from .slots import Slots
from .social import SocialService
from .subagents import report_back
from .ticker import Ticker
from .turn import Brain, Turn, is_async_brain

SYSTEM_PROJECTS = (("default", "Default"), ("social", "Social"))
"""Projects that always exist (S4)."""

START_FAILED_WAIT = 5.0
"""Seconds a start that failed late waits for what it had started to stop (a turn the
dispatcher began meanwhile is asked to stop, as at a graceful stop)."""


log = logging.getLogger("kinbox.runtime")

__all__ = ["INBOX_STATES", "SYSTEM_PROJECTS", "Runtime", "data_dir_for", "resolve_data_dir"]


class Runtime(LifeCycleApi, RecordsApi, WatchApi, TickApi):
    """A kinbox runtime on one database. Use as a context manager, or ``start``/``stop``.

    With a ``brain`` it runs turns: it claims due rows and delivers them. Without
    one it is *send-only*: it writes, reads and serves, and never claims a row,
    so a process that holds no brain can never consume a message.
    """

    def __init__(self, db: str | None = None, brain: Brain | None = None,
                 clock: Clock | None = None, max_active_sessions: int = 64, *,
                 max_live_sessions: int = 1024,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS, idle_ttl: float = 300.0,
                 tick_interval: float = 0.2, synchronous: str = "FULL",
                 data_dir: str | os.PathLike[str] | None = None,
                 ids: Callable[[], str] | None = None,
                 turn_timeout: float | None = None,
                 max_async_turns: int = 10_000, stop_grace: float = 10.0,
                 retention: float | None = None, peers: bool = True) -> None:
        check_options(db=db, brain=brain, clock=clock, ids=ids, data_dir=data_dir,
                      counts={"max_active_sessions": max_active_sessions,
                              "max_live_sessions": max_live_sessions,
                              "max_async_turns": max_async_turns},
                      seconds={"lease_seconds": lease_seconds, "idle_ttl": idle_ttl,
                               "tick_interval": tick_interval, "stop_grace": stop_grace},
                      turn_timeout=turn_timeout)
        if retention is not None:
            older_than_seconds(retention, "retention")
        self.url = db or default_url()
        self.send_only = brain is None
        """True when the runtime holds no brain: it never claims or delivers a row."""
        self.async_brain = brain is not None and is_async_brain(brain)
        """True when the brain is ``async def``: its turns run on the runtime's event loop."""
        if not self.async_brain and max_live_sessions < max_active_sessions:
            # A running turn's actor is never passivated: the bound could not hold.
            raise ConfigError(f"max_live_sessions ({max_live_sessions}) must be >= "
                              f"max_active_sessions ({max_active_sessions}): the actors of "
                              "running turns stay live", field="max_live_sessions")
        self.max_async_turns = max_async_turns
        self.stop_grace = stop_grace
        self.brain: Brain = brain or _no_brain
        self._given_clock = clock
        self.clock: Clock = clock or SystemClock()
        self.max_active_sessions = max_active_sessions
        self.max_live_sessions = max_live_sessions
        self.lease_seconds = lease_seconds
        self.turn_timeout = turn_timeout
        self.idle_ttl = idle_ttl
        self.tick_interval = tick_interval
        self.synchronous = synchronous
        self.data_dir = Path(data_dir) if data_dir else None
        self.with_peers = peers
        """False: no device identity, no peer endpoint, no sends to paired devices (a
        command-line operator's one change to inbox rows): no key file is made for it."""
        # Ids of new messages, sessions and projects; scenarios pass a seeded source.
        self.new_id: Callable[[], str] = ids or new_id
        self._known_sessions: set[str] = set()
        """Session ids seen to exist (sessions are never deleted): a post to one of them
        needs no existence query."""
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._ctx: RuntimeContext | None = None
        self._observers: list[Observer] = []
        self._state = "new"
        self._stop_lock = threading.Lock()
        """Orders the stops that callers on several threads ask for at once: one stops."""
        self._stopper: threading.Thread | None = None
        """The thread the stop under way runs on (a call from it does not wait for it)."""
        self._stop_timeout = 0.0
        self._stop_done = threading.Event()
        """Set once the stop has ended: the database is free for the next runtime."""
        self._starting: threading.Thread | None = None
        """The thread running :meth:`start`, until it is over."""
        self._stop_asked: float | None = None
        """The timeout of a stop asked while the start ran: the start ends by stopping."""
        self._ticker = Ticker(tick_interval_for(tick_interval, lease_seconds), self._tick,
                              self._wake)
        self._unsubscribe: Callable[[], None] | None = None
        self._db: pw.Database | None = None
        self._lock: ExclusiveLock | None = None
        self._liveness: OwnerLiveness | None = None
        self._shared = SharedDatabase()
        self._last_takeover = 0.0
        self._last_report = 0.0  # see _report_ended_elsewhere
        self._writer: GroupCommitWriter | None = None
        self._health = HealthChecks()
        self._services: Services | None = None
        self._peers: PeerService | None = None
        self._renewal: LeaseRenewal | None = None
        """Renews the leases of running turns: the dispatcher's, and the ticker's during a
        graceful stop (see :mod:`.lease_renewal`)."""
        self._retention = Retention(retention) if retention is not None else None
        """Automatic pruning of finished rows older than ``retention`` seconds (off when
        None): see :mod:`.pruning`."""

    # -- life cycle ------------------------------------------------------------------------

    def _start(self) -> None:
        path = sqlite_path(self.url)
        if path is not None:  # a folder kinbox makes is its user's alone (messages are there)
            try:
                private_folder(path.parent)
            except OSError as exc:  # a file in the way, a read-only disk, no permission
                raise DatabaseOpenError(self.url, f"cannot make its folder "
                                        f"{str(path.parent)!r}: {exc.strerror or exc}") from exc
        db = self._db = open_database(self.url, synchronous=self.synchronous)  # type: ignore[arg-type]
        tables = bind_tables(db)
        # On PostgreSQL every process tells the time by the server's clock.
        self.clock = self._shared.clock_for(db, self._given_clock, self.clock)
        # Only a delivering runtime owns the file: a send-only one may run beside it.
        if is_sqlite(db) and not self.send_only:
            self._lock = ExclusiveLock(db)
            self._lock.acquire()
        try:
            if is_postgres(db) and not self.send_only:
                self._liveness = OwnerLiveness(db, self.owner)  # type: ignore[arg-type]
                self._liveness.hold()
            upgrade(tables)
            self._writer = GroupCommitWriter(db)
            self._writer.start()
            journal = Journal(tables, self._writer)
            store = SessionStore(tables, self._writer)
            ctx = RuntimeContext(journal=journal, store=store,
                                 tasks=TaskStore(tables, self._writer),
                                 stops=StopRequests(tables, self._writer),
                                 clock=self.clock, brain=self.brain,
                                 owner=self.owner, lease_seconds=self.lease_seconds,
                                 tools_for=self._tools_for_ctx,
                                 new_id=self.new_id,
                                 observers=self._observers,
                                 max_active=self._turn_limit(),
                                 turn_timeout=self.turn_timeout,
                                 stop_grace=self.stop_grace)
            self._wire_services(ctx, JobStore(tables, self._writer),
                               RateBuckets(tables, self._writer))
            self._ctx = ctx
            now = self.clock.now()
            for slug, name in SYSTEM_PROJECTS:
                store.ensure_project(slug, slug, name, now)
            if self._lock is not None:
                expired = journal.expire_leases(now)  # the lock proves their holder is gone
                if expired:
                    log.warning("took over %d rows leased by a runtime that is gone", expired)
                if store.end_direct_turn_marks(now):
                    log.warning("ended the direct-turn marks a runtime that is gone left")
                # The lock also proves this runtime alone delivers here: the fast path.
                ctx.fast_lease = Lease(self.owner, self.lease_seconds)
            self._take_over_from_the_gone()
            # Before the dispatcher: a turn it claims may run before start() is over, and
            # its tools send to and list paired devices through the service.
            if self.with_peers:
                self._peers = ctx.peers = PeerService(ctx, self._resolve_data_dir(),
                                                      delivering=not self.send_only)
            if self.async_brain:
                # The loop thread, and a few workers for tool calls and hooks' work.
                ctx.async_host = AsyncHost(ctx, workers=min(16, max(4, self.max_active_sessions)))
                ctx.async_host.start()
            if not self.send_only:
                slots = Slots(ctx, self._turn_limit(), self.max_live_sessions,
                              threads=min(2, self.max_active_sessions) if self.async_brain
                              else None)
                # An injected clock that moves by hand claims as it moves (_on_clock):
                # real-time alarms for its due times would only claim too early.
                if not isinstance(self.clock, ManualClock):
                    ctx.alarm_in = self._ticker.alarm_in
                self._renewal = LeaseRenewal(ctx, slots)
                ctx.dispatcher = Dispatcher.start(ctx, slots, self.idle_ttl, self._renewal)
                ctx.slots = slots  # once the dispatcher takes claim requests
                assert self._services is not None
                self._services.start_schedule()
                # Other processes' sends, and their changes to cron jobs.
                self._shared.listen(db, ctx.wake_dispatcher, self._services.cron.look_now)
            assert self._services is not None
            self._services.start(exclusive=self._lock is not None)
            # Receiving works everywhere; outbound links only where rows are delivered.
            if not self.send_only and self._peers is not None:
                self._peers.start()
            # Still part of the start: a database that fails these leaves nothing running.
            if subagents.report_orphans(ctx):
                log.warning("reported child tasks whose message had ended outside a turn")
            counts = journal.counts()
        except BaseException:
            if self._ctx is not None:
                try:
                    self._wind_down(self._ctx, START_FAILED_WAIT)
                except Exception:  # the start's own error is the one to raise
                    log.exception("stopping what a failed start had started failed")
            self._teardown()
            raise
        self._state = "running"
        stop_at_exit(self)
        self._last_report = ctx.now()
        log.info("runtime %s started on %s (%s); open rows: %d pending, %d processing",
                 self.owner, redact_url(self.url),
                 "send-only: no brain, claims nothing" if self.send_only else "delivering",
                 counts.get("pending", 0), counts.get("processing", 0))
        if isinstance(self.clock, ManualClock):
            self._unsubscribe = self.clock.subscribe(lambda _now: self._on_clock())
        self._ticker.start()
        ctx.emit("started", owner=self.owner)
        ctx.wake_dispatcher()

    @property
    def state(self) -> str:
        """``new``, ``running``, ``stopped`` or ``crashed``."""
        return self._state

    def _turn_limit(self) -> int:
        """Turns that may run at once: one per session thread, or the async bound."""
        return self.max_async_turns if self.async_brain else self.max_active_sessions

    def _wire_services(self, ctx: RuntimeContext, jobs: JobStore, buckets: RateBuckets) -> None:
        """Sub-agents, family limits and Focal hook into the turn and task paths; the
        schedule, cron and social services are made."""
        ctx.outbox_hooks.append(report_back)
        ctx.buckets = Buckets(buckets)
        focal = Focal(ctx, self._resolve_data_dir())
        ctx.focal = focal
        ctx.turn_hooks.append(focal.prepare_turn)
        ctx.outbox_hooks.append(focal.outbox)
        ctx.task_hooks.append(focal.task_hook)
        self._services = Services(ctx, focal, jobs, delivering=not self.send_only,
                                  real_time=not isinstance(self.clock, ManualClock),
                                  gone=self._liveness.gone if self._liveness else None)

    def _resolve_data_dir(self) -> Path:
        return resolve_data_dir(self.url, self.data_dir)

    def _require(self) -> RuntimeContext:
        if self._ctx is None or self._state not in ("running", "stopped", "crashed"):
            raise RuntimeStateError("the runtime is not started; call start() or use `with`",
                                    state=self._state)
        return self._ctx

    def _made(self) -> RuntimeContext:
        """The context once start() made it, while the rest of the start still runs too
        (a turn the dispatcher claimed by then asks for its tools)."""
        if self._ctx is None:
            raise RuntimeStateError("the runtime is not started; call start() or use `with`",
                                    state=self._state)
        return self._ctx

    def _running(self) -> RuntimeContext:
        if self._state != "running":
            raise RuntimeStateError(f"the runtime is {self._state}; it accepts no more work",
                                    state=self._state)
        return self._require()

    # -- services --------------------------------------------------------------------------

    @property
    def peers(self) -> PeerService:
        """The peer service (device identity, pairing, links to paired devices)."""
        peers = self._require().peers
        if not isinstance(peers, PeerService):
            raise ConfigError("this runtime was made with peers=False: it has no device "
                              "identity and no peer service", field="peers")
        return peers

    @property
    def focal(self) -> Focal:
        """The Focal service (``get_or_create_focal_chat``, ``status``, ``register_tool``...)."""
        return self._require().focal  # type: ignore[no-any-return]

    @property
    def cron(self) -> CronService:
        """User cron jobs (``add``, ``jobs``, ``trigger``, ``pause``, ``resume``, ``runs``...)."""
        self._require()
        assert self._services is not None
        return self._services.cron

    @property
    def social(self) -> SocialService:
        """Social ingress (``ingest``, ``register_channel``, ``allow``...)."""
        self._require()
        assert self._services is not None
        return self._services.social

    def get_or_create_focal_chat(self) -> SessionRecord:
        """The Focal chat ``focal-suzent``, created on first use (FO1)."""
        return self.focal.get_or_create_focal_chat()


def _no_brain(turn: Turn) -> None:
    """Never called: a runtime without a brain does not deliver (``send_only``)."""
    raise RuntimeStateError("this runtime has no brain; it never runs turns", state="send-only")
