"""The peewee models: projects, sessions, transcripts, markers, tasks, the inbox, schedules.

Models are declared once, unbound, and bound to a database by
:func:`bind_tables`, which returns a :class:`Tables` of subclasses bound to
that database. That lets several runtimes (say a SQLite one and a PostgreSQL
one in the same test process) live side by side without a global proxy.

Times are stored as epoch seconds (floats) taken from the runtime's injected
clock, so tests can move time without touching the database clock.
References between tables are plain indexed columns: rows are always written
through the journal and store code, which keep them consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

import peewee as pw

CRON_EXPRESSION_CHARS = 512
"""The width of the cron expression columns (a Focal wake-up's, a cron job's): the
longest expression the actors' rules take (their ``EXPRESSION_LIMIT``, which a test holds
equal), so none they take fails to insert where the width is enforced (PostgreSQL)."""

IDEMPOTENCY_KEY_CHARS = 128
"""The width of a cron job's ``idempotency_key`` column: the longest key the actors' rules
take (their ``IDEMPOTENCY_KEY_LIMIT``, held equal by a test)."""


class _Base(pw.Model):
    class Meta:
        database = None
        legacy_table_names = False


class Project(_Base):
    """A project: the authorization boundary between sessions (S2, S4)."""

    id = pw.CharField(primary_key=True, max_length=64)
    slug = pw.CharField(unique=True, max_length=128)
    name = pw.CharField(max_length=256)
    archived = pw.BooleanField(default=False)
    hidden = pw.BooleanField(default=False)
    created_at = pw.DoubleField()

    class Meta:
        table_name = "projects"


class Session(_Base):
    """An addressable agent conversation (S1)."""

    id = pw.CharField(primary_key=True, max_length=128)
    project_id = pw.CharField(null=True, index=True, max_length=64)
    title = pw.CharField(max_length=512)
    kind = pw.CharField(max_length=32)
    platform = pw.CharField(null=True, max_length=64)
    parent_id = pw.CharField(null=True, index=True, max_length=128)
    status = pw.CharField(default="idle", max_length=16)
    """Written ``idle`` at creation only: a session's status as read is derived
    (``session_view``), as is its recency from ``updated_at`` and the transcript."""
    turn_owner = pw.CharField(null=True, index=True, max_length=128)
    """The runtime running a direct turn of the session (the mark ``session_view`` reads,
    and whose owner's death ends it); NULL otherwise."""
    turn_id = pw.CharField(null=True, max_length=256)
    """The running direct turn's own id (its first message's): what a stop asked from
    another process names, so that it never stops the session's next turn."""
    config = pw.TextField(default="{}")
    created_at = pw.DoubleField()
    updated_at = pw.DoubleField()

    class Meta:
        table_name = "sessions"
        # A walk in creation order, newest first, from a cursor (``sessions_page``): of
        # every session, and of a project's.
        indexes = ((("created_at", "id"), False), (("project_id", "created_at", "id"), False))


class TranscriptEntry(_Base):
    """One entry of a session's transcript (role, text, visibility, time)."""

    id = pw.BigAutoField()
    session_id = pw.CharField(max_length=128)
    role = pw.CharField(max_length=32)
    text = pw.TextField()
    visible = pw.BooleanField(default=True)
    message_id = pw.CharField(null=True, max_length=256)
    created_at = pw.DoubleField()
    sender_id = pw.CharField(null=True, max_length=256)
    kind = pw.CharField(null=True, max_length=64)

    class Meta:
        table_name = "transcript_entries"
        # A session's entries in order: its transcript, and its newest entry in one probe
        # from the end (the session's recency, ``session_view``), on PostgreSQL too.
        indexes = ((("session_id", "id"), False),)


class DeliveryMarker(_Base):
    """Structured proof that a message's turn committed (I6); never transcript text.

    ``message_id`` is indexed but deliberately not unique: the crash checker
    counts markers per message to prove that no turn ever committed twice.
    """

    id = pw.BigAutoField()
    session_id = pw.CharField(max_length=128)
    message_id = pw.CharField(index=True, max_length=256)
    created_at = pw.DoubleField()

    class Meta:
        table_name = "delivery_markers"


class Task(_Base):
    """A task owned by a session (K1)."""

    id = pw.CharField(primary_key=True, max_length=64)
    project_id = pw.CharField(null=True, max_length=64)
    chat_id = pw.CharField(index=True, max_length=128)
    title = pw.CharField(max_length=512)
    status = pw.CharField(max_length=16)
    blocked_on = pw.CharField(null=True, max_length=16)
    reason = pw.TextField(null=True)
    created_at = pw.DoubleField()
    updated_at = pw.DoubleField()

    class Meta:
        table_name = "tasks"
        # A project's tasks (its prefix), and the latest change of each session's
        # (``TaskStore.last_updates``) read off the index alone: grouped by chat in its
        # order, no table row visited. It replaces ``tasks_project_id``. A task's update
        # moves its entry (``updated_at``): on PostgreSQL no longer a HOT update, for a
        # tool call's write, not the message path's.
        indexes = ((("project_id", "chat_id", "updated_at"), False),)


class InboxMessage(_Base):
    """A row of the durable inbox: one message to one actor address (I1).

    ``seq`` is the journal order (per-target delivery follows it); the
    message id stays the primary key and the idempotency key.
    """

    message_id = pw.CharField(primary_key=True, max_length=256)
    seq = pw.BigIntegerField(unique=True)
    transport = pw.CharField(max_length=16)
    destination_peer_id = pw.CharField(null=True, max_length=128)
    sender_chat_id = pw.CharField(null=True, max_length=128)
    target_chat_id = pw.CharField(max_length=128)
    kind = pw.CharField(max_length=64)
    content = pw.TextField()
    payload = pw.TextField(default="{}")
    status = pw.CharField(max_length=16)
    attempts = pw.IntegerField(default=0)
    max_attempts = pw.IntegerField()
    available_at = pw.DoubleField()
    lease_owner = pw.CharField(null=True, max_length=128)
    lease_until = pw.DoubleField(null=True)
    created_at = pw.DoubleField()
    updated_at = pw.DoubleField()
    delivered_at = pw.DoubleField(null=True)
    last_error = pw.TextField(null=True)
    suspect = pw.BooleanField(null=True)  # NULL (the hand-written INSERT) means False
    """Taken over from a worker that died mid-turn: its turns run one at a time per runtime
    (so a death during one is attributable to it) and record their start."""
    turn_started_at = pw.DoubleField(null=True)
    """Set once a suspect row's turn has started: if that worker dies too, the next
    takeover counts an attempt, so a poison message ends ``failed``."""

    class Meta:
        table_name = "agent_inbox_messages"
        # Its state indexes are partial, over the open rows only (``open_indexes``).


class InboxEvent(_Base):
    """History of a row's failures, requeues and operator actions (kept on requeue)."""

    id = pw.BigAutoField()
    message_id = pw.CharField(index=True, max_length=256)
    at = pw.DoubleField()
    event = pw.CharField(max_length=32)
    attempts = pw.IntegerField()
    detail = pw.TextField(null=True)

    class Meta:
        table_name = "agent_inbox_events"


class ScheduledJob(_Base):
    """A durable schedule (Focal wake-ups, the heartbeat): the truth APScheduler reloads."""

    id = pw.CharField(primary_key=True, max_length=64)
    chat_id = pw.CharField(index=True, max_length=128)
    kind = pw.CharField(max_length=32)
    note = pw.TextField(default="")
    cron = pw.CharField(null=True, max_length=CRON_EXPRESSION_CHARS)
    interval_seconds = pw.DoubleField(null=True)
    run_at = pw.DoubleField(null=True)
    next_run_at = pw.DoubleField(null=True, index=True)
    last_run_at = pw.DoubleField(null=True)
    active = pw.BooleanField(default=True)
    created_at = pw.DoubleField()

    class Meta:
        table_name = "scheduled_jobs"


class CronJob(_Base):
    """A user cron job (C1): a prompt run in session ``cron-<id>`` on a crontab schedule."""

    id = pw.CharField(primary_key=True, max_length=64)
    name = pw.CharField(max_length=256)
    cron = pw.CharField(max_length=CRON_EXPRESSION_CHARS)
    timezone = pw.CharField(default="UTC", max_length=64)
    prompt = pw.TextField()
    active = pw.BooleanField(default=True)
    delivery = pw.CharField(default="announce", max_length=16)
    retry_count = pw.IntegerField(default=0)
    next_run_at = pw.DoubleField(null=True, index=True)
    triggered_at = pw.DoubleField(null=True)
    """When an operator's trigger made the job due (its ``next_run_at`` then); cleared once
    that due time is decided. A trigger is no occurrence of the schedule: never skipped
    as missed, however late a runtime with a brain comes to it."""
    last_run_at = pw.DoubleField(null=True)
    last_result = pw.TextField(null=True)
    last_error = pw.TextField(null=True)
    created_at = pw.DoubleField()
    updated_at = pw.DoubleField()
    idempotency_key = pw.CharField(null=True, unique=True, max_length=IDEMPOTENCY_KEY_CHARS)
    trigger_key = pw.CharField(null=True, max_length=IDEMPOTENCY_KEY_CHARS)
    """The key the client of its last keyed trigger gave (None: none yet): a retry of that
    trigger answers the job as it is instead of running it again."""
    """The key the client that added the job gave its request (None: none given): a
    retry of that request answers this job instead of adding a second."""

    class Meta:
        table_name = "cron_jobs"


class CronRun(_Base):
    """One run of a cron job; ``id`` names the occurrence, so a run is recorded once.

    ``owner`` and ``lease_until`` fence the run like an inbox lease: only the
    owner may finish it, and a run whose owner died is taken over once the
    lease runs out. ``attempts`` is which attempt of its job the run is (1,
    then 2 to 6 for the retries), plus one for each takeover; ``takeovers`` counts
    those alone (the job's retry count, which a resume resets, cannot tell them apart).
    """

    id = pw.CharField(primary_key=True, max_length=128)
    job_id = pw.CharField(max_length=64)
    scheduled_for = pw.DoubleField()
    started_at = pw.DoubleField()
    finished_at = pw.DoubleField(null=True)
    status = pw.CharField(max_length=16, index=True)
    result = pw.TextField(null=True)
    error = pw.TextField(null=True)
    owner = pw.CharField(null=True, max_length=128)
    lease_until = pw.DoubleField(null=True)
    attempts = pw.IntegerField(default=1)
    takeovers = pw.IntegerField(default=0)

    class Meta:
        table_name = "cron_runs"
        # A job's runs newest first: the last runs each run's reminder reads, its listing,
        # and a prune's walk over its oldest, each an ordered walk of one job's range.
        indexes = ((("job_id", "started_at", "id"), False),)


class PeerDevice(_Base):
    """A paired device, one row per direction (P2).

    ``inbound``: the device may connect to us; we keep the SHA-256 of the
    bearer token we issued (never the token), bound to its pinned public key.
    ``outbound``: we connect to it at ``url``; the token it issued is kept
    sealed with our device key (``token_sealed``), never in plain text.
    """

    id = pw.CharField(primary_key=True, max_length=64)
    device_id = pw.CharField(index=True, max_length=32)
    direction = pw.CharField(max_length=16)
    name = pw.CharField(default="", max_length=128)
    public_key = pw.CharField(max_length=64)
    url = pw.CharField(null=True, max_length=1024)
    token_hash = pw.CharField(null=True, unique=True, max_length=64)
    token_sealed = pw.CharField(null=True, max_length=256)
    scopes = pw.CharField(default="agent", max_length=128)
    status = pw.CharField(default="active", max_length=16)
    last_error = pw.TextField(null=True)
    created_at = pw.DoubleField()
    updated_at = pw.DoubleField()
    last_seen_at = pw.DoubleField(null=True)

    class Meta:
        table_name = "peer_devices"


class PeerInvite(_Base):
    """A one-time pairing code, kept only as the SHA-256 of the invite key its secret seeds
    (``transport.invite_code``; codes of the first format were kept as their own SHA-256)."""

    code_hash = pw.CharField(primary_key=True, max_length=64)
    scopes = pw.CharField(max_length=128)
    created_at = pw.DoubleField()
    expires_at = pw.DoubleField()
    used_at = pw.DoubleField(null=True)
    used_by = pw.CharField(null=True, max_length=32)

    class Meta:
        table_name = "peer_invites"


class StopRequest(_Base):
    """A stop asked for a turn that another process runs (T4 across processes): the
    process holding the row's lease reads it at its next tick. Keyed by the running row,
    so a request that comes late can never stop the session's next turn."""

    message_id = pw.CharField(primary_key=True, max_length=256)
    session_id = pw.CharField(max_length=128)
    asked_by = pw.CharField(null=True, max_length=256)
    asked_at = pw.DoubleField()

    class Meta:
        table_name = "stop_requests"


class RateBucket(_Base):
    """A family sender -> target pair's token bucket (F6). In the database so that every
    process sharing it draws on the pair's one bucket; ``tokens`` is NULL until the
    pair's first send (the rule's "no bucket yet")."""

    sender_id = pw.CharField(max_length=128)
    target_id = pw.CharField(max_length=128)
    tokens = pw.DoubleField(null=True)
    updated_at = pw.DoubleField(null=True)

    class Meta:
        table_name = "rate_buckets"
        primary_key = pw.CompositeKey("sender_id", "target_id")


class InboxSeqMark(_Base):
    """SQLite's high-water mark of the inbox's ``seq`` (:mod:`.seq_mark`): one row, the
    highest ``seq`` of the rows a prune deleted, so that no later send is numbered as one
    of them. PostgreSQL numbers rows from its sequence and leaves it empty."""

    id = pw.IntegerField(primary_key=True)
    top = pw.BigIntegerField()

    class Meta:
        table_name = "agent_inbox_seq_mark"


class SocialReply(_Base):
    """A social turn's committed reply that its platform has not taken yet (the outbox of
    channel sends, :mod:`.social_outbox`): written in the turn's commit, deleted once the
    send ended for good, so a send that a stop or crash cut off is sent again."""

    reply_id = pw.CharField(primary_key=True, max_length=256)
    """The message id that caused the reply: the platform's dedupe key for it."""
    session_id = pw.CharField(max_length=128)
    platform = pw.CharField(max_length=32)
    route = pw.TextField()
    """The reply route, as JSON."""
    text = pw.TextField()
    owner = pw.CharField(max_length=256)
    """The runtime that committed it (and sends it while it lives)."""
    created_at = pw.DoubleField()

    class Meta:
        table_name = "social_replies"


class SchemaVersion(_Base):
    """The schema version the last upgrade left the database at (:mod:`.schema_version`):
    one row, ``id`` 1, so that a kinbox can tell a database a newer one upgraded, and
    whether it may still work on it."""

    id = pw.IntegerField(primary_key=True, constraints=[pw.Check("id = 1")])
    version = pw.IntegerField()
    compatible = pw.IntegerField(null=True)
    """The oldest schema version whose code may work on this database as it is (NULL,
    written by version 1, which had no such column: ``version`` itself)."""

    class Meta:
        table_name = "kinbox_schema"


MODELS: tuple[type[_Base], ...] = (
    Project,
    Session,
    TranscriptEntry,
    DeliveryMarker,
    Task,
    InboxMessage,
    InboxEvent,
    ScheduledJob,
    CronJob,
    CronRun,
    PeerDevice,
    PeerInvite,
    StopRequest,
    RateBucket,
    InboxSeqMark,
    SocialReply,
    SchemaVersion,
)


@dataclass(frozen=True)
class Tables:
    """The models bound to one database."""

    db: pw.Database
    project: type[Project]
    session: type[Session]
    transcript: type[TranscriptEntry]
    marker: type[DeliveryMarker]
    task: type[Task]
    inbox: type[InboxMessage]
    event: type[InboxEvent]
    job: type[ScheduledJob]
    cron_job: type[CronJob]
    cron_run: type[CronRun]
    device: type[PeerDevice]
    invite: type[PeerInvite]
    stop: type[StopRequest]
    bucket: type[RateBucket]
    seq_mark: type[InboxSeqMark]
    social_reply: type[SocialReply]
    schema_version: type[SchemaVersion]

    def all(self) -> list[type[pw.Model]]:
        """Every bound model, in creation order."""
        return [self.project, self.session, self.transcript, self.marker, self.task,
                self.inbox, self.event, self.job, self.cron_job, self.cron_run, self.device,
                self.invite, self.stop, self.bucket, self.seq_mark, self.social_reply,
                self.schema_version]


def _bound(model: type[_Base], db: pw.Database) -> type:
    meta = type("Meta", (), {"database": db, "table_name": model._meta.table_name})
    return type(model.__name__, (model,), {"Meta": meta, "__module__": model.__module__})


def bind_tables(db: pw.Database) -> Tables:
    """Return the models bound to ``db``."""
    return Tables(db, *(_bound(m, db) for m in MODELS))
