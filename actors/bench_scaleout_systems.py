"""The producer side of each system ``kinbox bench scaleout`` runs on PostgreSQL.

Each system gets a database of its own, made fresh for every measurement and
dropped after it (``scratch_producer``), and three operations: enqueue a
backlog, send one message durably (the closed-loop workload: the call
returns once the send is committed), and count what is not yet done. The
consumers are worker processes (``bench_scaleout_child``); message ``k``
goes to session ``k % sessions`` everywhere, so kinbox's per-session order
has the same shape of work as the others' unordered queues.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from ..persistence import redact_text, redact_url
from . import bench_scaleout_bare, bench_scaleout_bare_rows
from .bench_systems import stamp
from .runtime import Runtime

SYSTEM_NAMES = ("kinbox", "bare_pg", "bare_pg_rows", "raw", "pgqueuer", "procrastinate", "dbos")
CHUNK = 2000

log = logging.getLogger("kinbox.bench")

MAINTENANCE_DATABASE = "postgres"
"""The database a server-wide statement connects to where ``base``'s own does not exist."""

CONNECT_TIMEOUT = 10
"""Seconds a connection to the server may take before the bench gives up on it."""

REMAINING = {
    # The open rows, which the partial indexes hold (see ``Producer._conn``); failed rows
    # are caught by the run.
    "kinbox": "SELECT COUNT(*) FROM agent_inbox_messages WHERE status IN ('pending', 'processing')",
    "raw": "SELECT COUNT(*) FROM raw_jobs WHERE status <> 'done'",
    "bare_pg": "SELECT COUNT(*) FROM bare_inbox WHERE status <> 'done'",
    "bare_pg_rows": bench_scaleout_bare_rows.REMAINING,
    "procrastinate": "SELECT COUNT(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    "dbos": "SELECT COUNT(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')",
    "pgqueuer": "SELECT COUNT(*) FROM pgqueuer",
}
"""Each system's count of what is not yet done: the progress poll of every workload."""


def database_url(base: str, system: str) -> str:
    """``base`` with its database name suffixed by ``_bench_system``."""
    return _with_database(base, f"{database_name(base) or MAINTENANCE_DATABASE}_bench_{system}")


def _with_database(url: str, name: str) -> str:
    """``url`` naming database ``name``: its authority kept as written, an empty one too
    (``postgresql:///db?host=/run/postgresql``, a Unix socket, which ``urlunsplit``
    would shorten to ``postgresql:/db``)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/{name}" + (f"?{parts.query}" if parts.query
                                                        else "")


def fresh_database(base: str, system: str) -> str:
    """Drop and create the system's database; return its URL."""
    drop_database(base, system)
    url = database_url(base, system)
    _on_server(base, f'CREATE DATABASE "{database_name(url)}"')
    return url


def drop_database(base: str, system: str) -> None:
    """Drop the system's database (ending any connection still open to it)."""
    name = database_name(database_url(base, system))
    _on_server(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_producer(system: str, base: str, sessions: int, payload: int
                     ) -> Iterator[Producer]:
    """A producer on a fresh database of the system's own, closed and its database dropped
    when the block ends, however it ends: a run leaves nothing behind on the server (a full
    drain's database holds 50,000 messages and their transcript)."""
    ended = False
    try:
        producer = Producer(system, fresh_database(base, system), sessions, payload)
        try:
            yield producer
        finally:
            producer.close()
        ended = True
    finally:
        try:
            drop_database(base, system)
        except Exception:
            if ended:
                raise
            # The block's own error is the one to see: this one only follows from it.
            log.warning("could not drop the %s bench database", system, exc_info=True)


def database_name(url: str) -> str:
    """The database name in a PostgreSQL URL."""
    return urlsplit(url).path.lstrip("/")


def server_problem(base: str) -> str | None:
    """Why the systems' databases cannot be made on ``base``'s server (no connection, or
    the role may not create databases), or None: asked before a run starts."""
    import psycopg2

    try:
        conn = server_connection(base)
    except psycopg2.Error as exc:
        reason = "; ".join(line.strip() for line in redact_text(str(exc), base).splitlines()
                           if line.strip())
        return f"cannot connect to the PostgreSQL server of {redact_url(base)}: {reason}"
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_user, rolcreatedb OR rolsuper FROM pg_roles "
                        "WHERE rolname = current_user")
            user, may_create = cur.fetchone()
    finally:
        conn.close()
    if not may_create:
        return (f"the role {user!r} may not create databases, and each system runs on one "
                f'of its own: ALTER ROLE "{user}" CREATEDB, or --db with a role that may')
    return None


def server_connection(base: str) -> Any:
    """A connection to ``base``'s server for server-wide statements (database DDL, the
    report's settings): to ``base``'s database, or, where that cannot be had (the name
    only prefixes the systems' databases, and a new server lacks it), to the server's
    maintenance database, where ``createdb`` always goes. When neither connects, the
    error is the one about ``base`` itself, the database the user named."""
    import psycopg2

    try:
        return psycopg2.connect(base, connect_timeout=CONNECT_TIMEOUT)
    except psycopg2.OperationalError as first:
        try:
            return psycopg2.connect(_with_database(base, MAINTENANCE_DATABASE),
                                    connect_timeout=CONNECT_TIMEOUT)
        except psycopg2.OperationalError:
            raise first from None


def _on_server(base: str, sql: str) -> None:
    """Run ``sql`` outside a transaction on ``base``'s server (database DDL)."""
    conn = server_connection(base)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


class Producer:
    """One system's producer side on its database."""

    def __init__(self, system: str, url: str, sessions: int, payload: int) -> None:
        self.system = system
        self.url = url
        self.sessions = sessions
        self.payload = payload
        self.local = threading.local()
        self.rt: Runtime | None = None
        self.ids = [f"s{i:06d}" for i in range(sessions)]
        self.app: Any = None
        self.client: Any = None
        self.home: str | None = None
        try:
            getattr(self, f"_setup_{system}")()
        except BaseException:
            self.close()  # what the set-up started before it failed
            raise

    # -- set-up ----------------------------------------------------------------------------

    def _setup_kinbox(self) -> None:
        # Its files (the device key) go in a folder of the run's, removed by ``close``.
        self.home = tempfile.mkdtemp(prefix="kinbox-scaleout-producer-")
        self.rt = Runtime(db=self.url, data_dir=self.home).start()  # send-only: never claims
        project = self.rt.create_project("bench")
        self.rt.context.store.create_many(
            [(sid, project.id, sid, "interactive") for sid in self.ids], self.rt.clock.now())

    def _setup_raw(self) -> None:
        self.query("CREATE TABLE raw_jobs (id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL, "
                  "body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending')")
        self.query("CREATE INDEX raw_jobs_pending ON raw_jobs (id) WHERE status = 'pending'")

    def _setup_bare_pg(self) -> None:
        bench_scaleout_bare.install(self._conn().cursor())

    def _setup_bare_pg_rows(self) -> None:
        bench_scaleout_bare_rows.install(self._conn().cursor())

    def _setup_pgqueuer(self) -> None:
        self._pgq(lambda q: q.install())

    def _setup_procrastinate(self) -> None:
        import procrastinate
        self.app = procrastinate.App(
            connector=procrastinate.SyncPsycopgConnector(conninfo=self.url))
        self.app.open()
        self.app.schema_manager.apply_schema()

    def _setup_dbos(self) -> None:
        from dbos import DBOS, DBOSClient
        DBOS.migrate(self.url)  # the system tables, before the first enqueue
        self.client = DBOSClient(system_database_url=self.url)

    def _dbos_send(self, k: int, body: str) -> None:
        self.client.enqueue({"workflow_name": "turn", "queue_name": "turns",
                             "queue_partition_key": self.ids[k % self.sessions]}, body)

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run ``sql`` on this thread's own connection (autocommit); the rows, if any."""
        conn = self._conn()
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def _conn(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            import psycopg2
            conn = self.local.conn = psycopg2.connect(self.url)
            conn.autocommit = True
            if self.system == "kinbox":
                # Its reads (the progress poll, the failed and held rows) are for open rows,
                # which the partial indexes hold. Planned from the statistics taken after
                # the backlog (every row pending), the poll scanned the table's every row
                # version instead: 10 ms a poll at 20,000 messages, polled every 20 ms, a
                # third of a core taken from the workers it was watching.
                with conn.cursor() as cur:
                    cur.execute("SET enable_seqscan = off")
        return conn

    def _pgq(self, op: Callable[[Any], Any]) -> Any:
        """Run ``op(queries)`` on this thread's own asyncpg connection and event loop."""
        state = getattr(self.local, "pgq", None)
        if state is None:
            import asyncpg
            from pgqueuer import AsyncpgDriver, Queries
            loop = asyncio.new_event_loop()
            conn = loop.run_until_complete(asyncpg.connect(self.url))
            state = self.local.pgq = (loop, Queries(AsyncpgDriver(conn)))
        loop, queries = state
        return loop.run_until_complete(op(queries))

    # -- the operations --------------------------------------------------------------------

    def backlog(self, messages: int) -> None:
        """Enqueue ``messages`` messages (in transactions of up to 2,000), then ANALYZE.

        The ANALYZE is there for every system alike: with autovacuum off (as on
        the benchmark machine) or not yet run, the planner still believes the
        tables empty, and kinbox's claim query then checks every pending row
        instead of walking the index (measured: 20 instead of 700 msgs/s with
        40,000 pending).
        """
        for first in range(0, messages, CHUNK):
            ks = range(first, min(messages, first + CHUNK))
            if self.system == "kinbox":
                from ..persistence import NewMessage
                assert self.rt is not None
                self.rt.context.journal.enqueue_many(
                    [NewMessage(f"m{k:07d}", self.ids[k % self.sessions], stamp(self.payload))
                     for k in ks], self.rt.clock.now())
            elif self.system in ("raw", "bare_pg"):
                table = "raw_jobs" if self.system == "raw" else "bare_inbox"
                rows = [(self.ids[k % self.sessions], stamp(self.payload)) for k in ks]
                values = ", ".join(["(%s, %s)"] * len(rows))
                self.query(f"INSERT INTO {table} (session, body) VALUES {values}",
                          [v for r in rows for v in r])
            elif self.system == "bare_pg_rows":
                self.query(bench_scaleout_bare_rows.INSERT,
                           ([self.ids[k % self.sessions] for k in ks],
                            [stamp(self.payload) for _ in ks]))
            elif self.system == "procrastinate":
                deferrer = self.app.configure_task("turn", queue="turns")
                deferrer.batch_defer(*[{"body": stamp(self.payload)} for _ in ks])
            elif self.system == "dbos":
                for k in ks:
                    self._dbos_send(k, stamp(self.payload))
            else:
                n = len(ks)
                self._pgq(lambda q, n=n: q.enqueue(
                    ["turn"] * n, [stamp(self.payload).encode() for _ in range(n)], [0] * n))
        self.query("ANALYZE")

    def send(self, k: int) -> None:
        """Send message ``k``, durably (returns once committed); safe from any thread."""
        body = stamp(self.payload)
        if self.system == "kinbox":
            assert self.rt is not None
            self.rt.post(self.ids[k % self.sessions], body)
        elif self.system == "raw":
            self.query("INSERT INTO raw_jobs (session, body) VALUES (%s, %s); "
                      "NOTIFY raw_jobs", (self.ids[k % self.sessions], body))
        elif self.system == "bare_pg":
            self.query(bench_scaleout_bare.SEND, (self.ids[k % self.sessions], body))
        elif self.system == "bare_pg_rows":
            self.query(bench_scaleout_bare_rows.SEND, ([self.ids[k % self.sessions]], [body]))
        elif self.system == "procrastinate":
            self.app.configure_task("turn", queue="turns").defer(body=body)
        elif self.system == "dbos":
            self._dbos_send(k, body)
        else:
            self._pgq(lambda q: q.enqueue("turn", body.encode()))

    def remaining(self) -> int:
        """Messages not yet done."""
        return int(self.query(REMAINING[self.system])[0][0])

    def failed(self) -> int:
        """kinbox: rows that ended ``failed`` (a run with any is broken, not slow); others 0."""
        if self.system != "kinbox":
            return 0
        return int(self.query("SELECT COUNT(*) FROM agent_inbox_messages "
                              "WHERE status = 'failed'")[0][0])

    def audit(self) -> dict[str, int]:
        """bare_pg and bare_pg_rows: their lost and duplicate counts from the committed
        rows; others none."""
        if self.system == "bare_pg":
            return bench_scaleout_bare.audit(self._conn().cursor())
        if self.system == "bare_pg_rows":
            return bench_scaleout_bare_rows.audit(self._conn().cursor())
        return {}

    def close(self) -> None:
        """Stop the send-only runtime and clients and remove the runtime's files; connections
        close with the process."""
        if self.rt is not None:
            self.rt.stop()
        if self.app is not None:  # procrastinate's
            self.app.close()
        if self.client is not None:  # DBOS's
            self.client.destroy()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
