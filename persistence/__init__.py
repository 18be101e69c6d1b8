"""kinbox.persistence: the durable journal and the records the actors address.

Public surface: :func:`open_database`, :func:`bind_tables`, the schema
functions, the :class:`GroupCommitWriter`, the :class:`Journal` (inbox) and
:class:`SessionStore` (projects, sessions, transcripts), the pure inbox rules
in :mod:`.inbox_core`, and the error tree rooted at :class:`PersistenceError`.
This package never imports ``kinbox.actors`` or ``kinbox.transport``.
"""

from . import inbox_core, paging, retention
from .connections import close_every_connection
from .cron_store import (
    CronJobRecord,
    CronRunLost,
    CronRunRecord,
    CronStore,
    Occurrence,
    Removal,
    RunEnd,
    run_cursor,
)
from .database import (
    SQLITE_PAGE_SIZE,
    default_data_dir,
    default_url,
    is_postgres,
    is_sqlite,
    open_database,
    pg_address,
    pg_default_port,
    sqlite_path,
)
from .db_clock import DatabaseClock
from .errors import (
    DatabaseFailed,
    DatabaseInUse,
    DatabaseMissing,
    DatabaseOpenError,
    DuplicateError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidArgument,
    KinboxError,
    LeaseLost,
    LifeLockLost,
    PersistenceError,
    RowNotFound,
    SchemaError,
    SchemaIncomplete,
    SchemaTooNew,
    WriterClosed,
    WriteTimeout,
    redact_text,
    redact_url,
)
from .exclusive import ExclusiveLock
from .inbox_notify import InboxListener
from .inbox_records import Lease, TakenOver, WindowClaim
from .jobs import JobRecord, JobStore
from .journal import (
    DEFAULT_LEASE_SECONDS,
    ClaimedRow,
    ClaimResult,
    EnqueueResult,
    Journal,
    NewMessage,
    PruneBatch,
    PruneCounts,
    TurnEntry,
)
from .liveness import OwnerLiveness, live_runtimes
from .models import CRON_EXPRESSION_CHARS, IDEMPOTENCY_KEY_CHARS, Tables, bind_tables
from .rate_buckets import BucketState, RateBuckets
from .schema import SchemaStatus, pending_changes, require_current, schema_status, upgrade
from .schema_version import SCHEMA_VERSION, Stamp
from .session_records import EntryRecord, ProjectRecord, SessionPage, SessionRecord
from .sessions import SessionStore
from .social_outbox import KeptReply, SocialOutbox
from .stop_requests import StopAsk, StopRequests
from .tasks import OPEN_TASK_STATES, TaskChange, TaskRecord, TaskStore
from .writer import WRITE_TIMEOUT, GroupCommitWriter, Reply, WriterStatistics

__all__ = [
    "CRON_EXPRESSION_CHARS",
    "DEFAULT_LEASE_SECONDS",
    "IDEMPOTENCY_KEY_CHARS",
    "OPEN_TASK_STATES",
    "SCHEMA_VERSION",
    "SQLITE_PAGE_SIZE",
    "WRITE_TIMEOUT",
    "BucketState",
    "ClaimResult",
    "ClaimedRow",
    "CronJobRecord",
    "CronRunLost",
    "CronRunRecord",
    "CronStore",
    "DatabaseClock",
    "DatabaseFailed",
    "DatabaseInUse",
    "DatabaseMissing",
    "DatabaseOpenError",
    "DuplicateError",
    "EnqueueResult",
    "EntryRecord",
    "ExclusiveLock",
    "GroupCommitWriter",
    "IdempotencyConflict",
    "IllegalTransition",
    "InboxListener",
    "InvalidArgument",
    "JobRecord",
    "JobStore",
    "Journal",
    "KeptReply",
    "KinboxError",
    "Lease",
    "LeaseLost",
    "LifeLockLost",
    "NewMessage",
    "Occurrence",
    "OwnerLiveness",
    "PersistenceError",
    "ProjectRecord",
    "PruneBatch",
    "PruneCounts",
    "RateBuckets",
    "Removal",
    "Reply",
    "RowNotFound",
    "RunEnd",
    "SchemaError",
    "SchemaIncomplete",
    "SchemaStatus",
    "SchemaTooNew",
    "SessionPage",
    "SessionRecord",
    "SessionStore",
    "SocialOutbox",
    "Stamp",
    "StopAsk",
    "StopRequests",
    "Tables",
    "TakenOver",
    "TaskChange",
    "TaskRecord",
    "TaskStore",
    "TurnEntry",
    "WindowClaim",
    "WriteTimeout",
    "WriterClosed",
    "WriterStatistics",
    "bind_tables",
    "close_every_connection",
    "default_data_dir",
    "default_url",
    "inbox_core",
    "is_postgres",
    "is_sqlite",
    "live_runtimes",
    "open_database",
    "paging",
    "pending_changes",
    "pg_address",
    "pg_default_port",
    "redact_text",
    "redact_url",
    "require_current",
    "retention",
    "run_cursor",
    "schema_status",
    "sqlite_path",
    "upgrade",
]
