"""The Focal agent (SUZENT): the singleton that sees every project and hears back (FO1-FO5).

Focal never does project work: it dispatches to sessions through the inbox
and is woken, through the inbox, when they answer, block or finish. This
module is the shell around the pure rules in ``focal_policy``,
``focal_context`` and ``focal_heartbeat``; everything it causes is a
journal row committed with the change that caused it. How it hears back
(FO5) is :mod:`.focal_hearing`.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..persistence import (
    OPEN_TASK_STATES,
    DuplicateError,
    NewMessage,
    SessionRecord,
    TaskRecord,
)
from ..transport.key_file import private_folder
from . import access
from . import focal_context as fc
from . import focal_heartbeat as hb
from . import focal_heartbeat_setting as hs
from . import focal_policy as policy
from .context import RuntimeContext
from .errors import ToolError
from .focal_checklist_file import seed_whole
from .focal_hearing import (
    FOCAL_ID,
    NOTIFICATION_LIMIT,
    HearingBack,
    is_focal_chat,
)
from .ids import short
from .outbox import Writes
from .tasks import TaskService
from .turn import Turn
from .validation import (
    ID_LIMIT,
    TITLE_LIMIT,
    lookup_key,
    require_id,
    require_message,
    require_str,
)

log = logging.getLogger("kinbox.focal")

FOCAL_PROJECT = "suzent-focal"
FOCAL_TITLE = "SUZENT"


class Focal(HearingBack):
    """The Focal service of one runtime."""

    def __init__(self, ctx: RuntimeContext, data_dir: Path) -> None:
        self.ctx = ctx
        self.data_dir = data_dir
        self.registry: dict[str, policy.ToolSpec] = {t.name: t for t in policy.BUILTIN_TOOLS}
        self.notifications: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=NOTIFICATION_LIMIT)
        self.unread = 0
        self._lock = threading.Lock()
        self.schedule: Any = None  # the FocalSchedule, set by the runtime

    # -- identity (FO1) --------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        """The hidden project's folder, which holds ``heartbeat.md``."""
        return self.data_dir / "projects" / FOCAL_PROJECT

    def get_or_create_focal_chat(self) -> SessionRecord:
        """The Focal chat, created on first use; its title is restored if it changed."""
        ctx = self.ctx
        now = ctx.now()
        with self._lock:
            chat = ctx.store.session(FOCAL_ID)
            if chat is None:
                project = ctx.store.ensure_project(FOCAL_PROJECT, FOCAL_PROJECT, "SUZENT",
                                                   now, hidden=True)
                try:
                    chat = ctx.store.create_session(
                        FOCAL_ID, project.id, FOCAL_TITLE, access.FOCAL_KIND, now,
                        platform="focal", config={"is_focal_agent": True,
                                                  **hs.DEFAULT.as_config()})
                except DuplicateError:  # another process created it at once: that one it is
                    chat = ctx.store.session(FOCAL_ID)
                    assert chat is not None  # a session is never deleted
            if not chat.config.get("focal_heartbeat_initialized"):
                self._seed_checklist()
                ctx.store.patch_config(FOCAL_ID, {"focal_heartbeat_initialized": True}, now)
                if self.schedule is not None:
                    self.schedule.heartbeat.ensure()
            if chat.title != FOCAL_TITLE:
                ctx.store.update_session(FOCAL_ID, now, title=FOCAL_TITLE)
            return ctx.store.session(FOCAL_ID)  # type: ignore[return-value]

    def _seed_checklist(self) -> None:
        """Write the default ``heartbeat.md`` for the user to edit, unless there is one.
        Best effort: without the file the heartbeat runs the default checklist all the
        same, and a data folder that cannot hold it (a file in the way, no permission, a
        read-only mount) raised from every ``get_or_create_focal_chat()``, and the
        heartbeat's job was never made. Whole or not at all (:func:`.seed_whole`): a
        default cut off half-way was read as the user's edited checklist."""
        path = self.folder / "heartbeat.md"
        try:
            private_folder(self.folder)
            if not path.exists():
                seed_whole(path, hb.DEFAULT_FOCAL_HEARTBEAT)
        except OSError as exc:
            log.warning("heartbeat.md cannot be written in %s (%s); the heartbeat runs the "
                        "default checklist", self.folder, exc.strerror)

    # -- the heartbeat setting (FO6) -------------------------------------------------------

    def heartbeat(self) -> hs.HeartbeatSetting:
        """The heartbeat setting (``enabled``, ``interval_minutes``) as the heartbeat obeys
        it; the Focal chat is made first if needed (on by default, every 30 minutes)."""
        return hs.from_config(self.get_or_create_focal_chat().config)

    def set_heartbeat(self, *, enabled: bool | None = None,
                      interval_minutes: int | None = None) -> hs.HeartbeatSetting:
        """Turn the heartbeat on or off, or change its interval (a whole number of minutes,
        5 to 1440); a field not given is kept. Returns the setting now. Stored in Focal's
        config (kept across restarts, obeyed by every runtime on the database); off, no
        heartbeat looks or wakes Focal; a new interval, or switched back on, the next is
        due one interval from now. A bad value is a ConfigError naming the field, and
        nothing is written."""
        changes = hs.checked(enabled, interval_minutes)
        self.get_or_create_focal_chat()
        assert self.schedule is not None  # set by the runtime before any call
        return self.schedule.heartbeat.change(changes)  # type: ignore[no-any-return]

    def rename(self, session_id: str, title: str, *, auto: bool = False) -> bool:
        """Change a session's title; auto-titling skips Focal, whose title stays pinned. The
        title is held to a new session's rule (:func:`require_message`, ``TITLE_LIMIT``):
        an auto-titler's runaway or blank title was written as it came (PostgreSQL then
        refused it deep in the write, SQLite kept it)."""
        title = require_message(title, TITLE_LIMIT, name="title")
        key = lookup_key(session_id)
        session = self.ctx.store.session(key) if key is not None else None
        if session is None:
            raise ToolError("not_found", f"Session '{session_id}' does not exist.")
        if is_focal_chat(session):
            return False
        self.ctx.store.update_session(session_id, self.ctx.now(), title=title)
        return True

    # -- tools (FO2) -----------------------------------------------------------------------

    def register_tool(self, name: str, group: str = "", discoverable: bool = True) -> None:
        """A product's tool, so the policy can deny it and search can find it. Checked
        here: a name that is not a string was kept and broke every later search."""
        name = require_id("name", name)
        group = require_str("group", group)
        if not isinstance(discoverable, bool):
            raise ToolError("invalid_argument", "discoverable must be true or false.")
        if name == policy.SCHEDULE_WAKEUP:
            raise ToolError("invalid_argument", "schedule_wakeup is reserved for Focal.")
        self.registry[name] = policy.ToolSpec(name, group, discoverable)

    def tool_request(self, session: SessionRecord) -> policy.ToolRequest:
        """The tool request a session's turn runs with."""
        cfg = session.config
        asked = policy.ToolRequest(tools=tuple(cfg.get("tools", ())),
                                   mcp_enabled=bool(cfg.get("mcp_enabled", True)),
                                   cwd=cfg.get("cwd"),
                                   sandbox_volumes=tuple(cfg.get("sandbox_volumes", ())),
                                   permission_mode=str(cfg.get("permission_mode", "ask")))
        if is_focal_chat(session):
            return policy.apply_focal_tool_policy(asked, self.registry.values())
        return policy.ordinary_request(asked)

    def search_tools(self, session_id: str, query: str) -> list[str]:
        """Tool search as a session sees it (never ``schedule_wakeup``)."""
        query = require_str("query", query)
        key = lookup_key(session_id)
        session = self.ctx.store.session(key) if key is not None else None
        denied = self.tool_request(session).denied_tools if session else ()
        return policy.search_tools(self.registry.values(), query, denied)

    def prepare_turn(self, ctx: RuntimeContext, turn: Turn) -> Callable[[], object] | None:
        """Turn hook: the tool request (and, for Focal, the global context) of this turn.

        Resolved on first use, so the many turns that never look cost no
        database read; the canonical Focal chat is resolved before its brain
        runs (the work this hook returns), which also restores its pinned title.
        """
        session_id = turn.session_id  # not the turn: it holds this closure (no cycle)

        def resolve() -> tuple[policy.ToolRequest | None, str | None]:
            session = ctx.store.session(session_id)
            if session is None:
                return None, None
            if not is_focal_chat(session):
                return self.tool_request(session), None
            if session.title != FOCAL_TITLE:
                ctx.store.update_session(session.id, ctx.now(), title=FOCAL_TITLE)
            return self.tool_request(session), self.global_context()

        # Only the Focal chat has a context (its id says so, no read needed): it is
        # computed before the brain, which may then read it on the event loop.
        turn.resolve_with(resolve, context=turn.session_id == FOCAL_ID)
        if turn.session_id == FOCAL_ID:  # the policy applies before the turn
            return lambda: turn.request
        return None

    def global_context(self) -> str:
        """The FO3 text for a Focal turn."""
        store = self.ctx.store
        running = set(self.ctx.turns.running())
        projects = [fc.ProjectInfo(p.id, p.slug, p.archived, p.hidden) for p in store.projects()]
        infos = []
        tasks = self.ctx.tasks
        for p in projects:
            if p.archived or p.hidden:
                continue
            # Ranked on open tasks (all "waiting on the user" needs) and on which sessions
            # have any; every task is read only for the sessions the text lists.
            tasked = tasks.last_updates(p.id)
            first = [fc.SessionInfo(s.id, s.project_id, s.title,
                                    s.id in running or s.status == "active", s.updated_at,
                                    tuple(ts), s.id in tasked)
                     for s, ts in _with_tasks(
                         store.sessions_at_work(p.id, running),  # never all it ever had
                         tasks.for_project(p.id, statuses=OPEN_TASK_STATES))]
            shown = [s.id for s in fc.rank(first)[:fc.SESSIONS_PER_PROJECT]]
            full = dict(_with_tasks(shown, tasks.for_chats(p.id, shown)))
            infos += [replace(s, tasks=tuple(full[s.id])) if s.id in full else s
                      for s in first]
        return fc.build_focal_global_context(projects, infos)

    # -- dispatch (FO4) --------------------------------------------------------------------

    def watch(self, session_id: str, writes: Writes) -> None:
        """Focal sent work to this session: it is followed from now on."""
        now = self.ctx.now()
        writes.write(lambda: self.ctx.store.patch_config_now(
            session_id, {"focal_watching": True}, now), None, lambda _r: None)

    def dispatch_new(self, project_id: Any, title: Any, task_title: Any,
                     message: str, writes: Writes) -> dict[str, Any]:
        """``agent_send(agent_id="new", ...)``: a new session in a project, with the message
        (committed with the Focal turn that asks for it)."""
        ctx = self.ctx
        # Missing arguments are the model's to add, not an absent project (not_found).
        if project_id is None:
            raise ToolError("invalid_argument", "agent_id='new' needs project_id: the id of "
                            "the project to start the session in.")
        if title is None:
            raise ToolError("invalid_argument",
                            "agent_id='new' needs title: the new session's title.")
        project_id = require_id("project_id", project_id, ID_LIMIT)
        project = ctx.store.project(project_id)
        if project is None:
            raise ToolError("not_found", f"Project '{project_id}' does not exist.")
        if project.hidden or project.archived:
            raise ToolError("invalid_argument",
                            f"Project '{project_id}' is hidden or archived; pick an active one.")
        # Every argument is checked before the first write, so a refusal leaves no session
        # without its task or message behind.
        name = require_message(title, TITLE_LIMIT, name="title")
        task_name = (require_message(task_title, TITLE_LIMIT, name="task_title")
                     if task_title is not None else None)
        now = ctx.now()
        sid = f"chat-{short(ctx.new_id(), 12)}"

        # One write: the session without its task and message (the turn ended between
        # them, a thread the brain left running) is a session nobody asked anything of.
        def start(writes: Writes) -> dict[str, Any]:
            writes.create_session(SessionRecord(
                sid, project_id, name, "interactive", None, FOCAL_ID, "idle", now, now,
                {"permission_mode": "auto", "spawned_by_focal": True,
                 "parent_chat_id": FOCAL_ID}))
            task = None
            if task_name is not None:
                task = TaskService(ctx, writes).create(sid, project_id, task_name,
                                                       "in_progress")
            [result] = writes.send([NewMessage(f"msg-{ctx.new_id()}", sid, message,
                                               sender=FOCAL_ID,
                                               payload={"focal_request": True})])
            return {"message_id": result.message_id, "agent_id": sid,
                    "status": result.status, "task_id": task.id if task else None}
        return writes.together(start)

    # -- status (FO8) ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``GET /focal``: waiting, stalled and auto-running counts, unread, last message."""
        chat = self.get_or_create_focal_chat()
        ctx = self.ctx
        per_project: dict[str, int] = {}
        per_chat: dict[str, int] = {}
        for p in ctx.store.projects():
            if p.hidden or p.archived:
                continue
            for t in ctx.tasks.for_project(p.id, statuses=("blocked",)):
                if t.blocked_on == "user":
                    per_project[p.slug] = per_project.get(p.slug, 0) + 1
                    per_chat[t.chat_id] = per_chat.get(t.chat_id, 0) + 1
        watched = self.watched_sessions()
        now = ctx.now()
        stalled = sum(1 for w in watched if hb.is_stalled(w, now))  # the heartbeat's rule
        auto_running = sum(1 for w in watched if w.running and (
            (s := ctx.store.session(w.id)) is not None and s.config.get("spawned_by_focal")))
        # One row, not the whole chat: a long-lived Focal transcript grows without bound.
        last = next(iter(ctx.store.transcript(chat.id, last=1, visible_only=True)), None)
        with self._lock:
            unread = self.unread
        return {"chat_id": chat.id, "title": chat.title,
                "waiting": sum(per_chat.values()), "stalled": stalled,
                "auto_running": auto_running, "waiting_by_project": per_project,
                "waiting_by_chat": per_chat, "unread": unread,
                "last_message": ({"role": last.role, "text": last.text, "at": last.created_at}
                                 if last else None)}

    def watched_sessions(self) -> list[hb.WatchedSession]:
        """What the heartbeat and the status look at: the sessions of every visible project
        that have a task or are active or running here, the only ones a finding
        (:func:`.focal_heartbeat.findings`) or a running count can be about; every session
        of every project was read for them on each look."""
        ctx = self.ctx
        running = set(ctx.turns.running())
        out = []
        for p in ctx.store.projects():
            if p.hidden or p.archived:
                continue
            tasks: dict[str, list[TaskRecord]] = {}
            # Open tasks only, by session (one pass, not one a session); the latest change
            # of any task is one aggregate, not every done task the project ever had.
            for t in ctx.tasks.for_project(p.id, statuses=OPEN_TASK_STATES):
                tasks.setdefault(t.chat_id, []).append(t)
            last = ctx.tasks.last_updates(p.id)
            for s in ctx.store.sessions_at_work(p.id, also=running):
                mine = tasks.get(s.id, [])
                out.append(hb.WatchedSession(
                    s.id, s.title, max(s.updated_at, last.get(s.id, s.updated_at)),
                    s.id in running or s.status == "active",
                    sum(1 for t in mine if t.status in OPEN_TASK_STATES),
                    tuple(t.updated_at for t in mine
                          if t.status == "blocked" and t.blocked_on == "user")))
        return out

    def mark_read(self) -> None:
        """The user saw the notifications."""
        with self._lock:
            self.unread = 0

    def panel(self) -> dict[str, Any]:
        """``GET /focal/panel``: the fixed tool list and the scheduled wake-ups."""
        self.get_or_create_focal_chat()
        wakeups = self.schedule.wakeups() if self.schedule is not None else []
        return {"tools": list(policy.FOCAL_TOOL_NAMES), "wakeups": wakeups}


def _with_tasks(sessions: Sequence[Any], tasks: Sequence[TaskRecord]
                ) -> list[tuple[Any, list[fc.TaskInfo]]]:
    """Each of ``sessions`` (records, or ids) with its tasks among ``tasks`` as the context
    shows them, in their order."""
    by_chat: dict[str, list[fc.TaskInfo]] = {}
    for t in tasks:
        by_chat.setdefault(t.chat_id, []).append(
            fc.TaskInfo(t.title, t.status, t.blocked_on, t.reason))
    return [(s, by_chat.get(s if isinstance(s, str) else s.id, [])) for s in sessions]
