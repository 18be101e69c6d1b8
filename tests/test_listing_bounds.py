"""Listings read a bounded page, with today's answers: ``agent_list`` and the family's
"out of reach" check against the rules they had when they read every session.

The reference functions below are the listings as they were before they read pages
(every session of the project, or of the database for Focal, filtered, ordered and cut
in Python): on a mixed population (projects, a session without one, hidden kinds and
platforms, sub-agents, Focal, ties in recency, sessions active by a direct turn and by a
leased inbox row), every caller kind must get the same answer from both, on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError, access, roster
from kinbox.actors import focal_heartbeat as hb
from kinbox.actors.family import member, subject
from kinbox.actors.tools import listing
from kinbox.persistence import OPEN_TASK_STATES, TurnEntry, session_filters
from kinbox.persistence import sessions as sessions_module

from .conftest import Stores, ids_read

MakeRuntime = Callable[..., Runtime]


def old_agent_list(rt: Runtime, caller_id: str, mode: str, n: int) -> dict[str, Any]:
    """``agent_list`` as it was: the whole pool read, then filtered and cut in Python."""
    store = rt.context.store
    caller = store.session(caller_id)
    assert caller is not None
    me = subject(caller)
    pool = (store.sessions() if access.is_focal(me)
            else store.sessions(project_id=caller.project_id)
            if caller.project_id is not None else [caller])
    visible = [listing(s) for s in pool
               if access.decide("agent_list", me, subject(s)) == "allow"
               and (mode == "recent" or s.status == "active")]
    return {"agents": visible[:n], "has_more": len(visible) > n}


def old_beyond_reach(rt: Runtime, caller_id: str, name: str) -> bool:
    """The family's "out of reach" check as it was (for a caller in a project)."""
    store = rt.context.store
    caller = store.session(caller_id)
    assert caller is not None and caller.project_id is not None
    return any(roster.designates(name, s.title, s.id)
               for s in store.sessions(project_id=caller.project_id)
               if s.id != caller.id and not access.is_hidden(subject(s)))


def old_list_agents(rt: Runtime, caller_id: str) -> list[dict[str, str]]:
    """``list_agents`` as it was: the family read with every root of the project."""
    store = rt.context.store
    caller = store.session(caller_id)
    assert caller is not None
    every = store.sessions()
    near = {caller.id, caller.parent_id} - {None}
    first = [s for s in every if s.id in near or s.parent_id in near
             or (s.parent_id is None and caller.project_id is not None
                 and s.project_id == caller.project_id)]
    children = {s.id for s in first if s.parent_id == caller.id}
    related = {s.id: s for s in [*first, *(s for s in every if s.parent_id in children)]}
    me = subject(caller)
    kin = [member(s) for s in related.values()
           if access.can_reach(me, subject(s), allow_self=True)]
    return [e.to_dict() for e in roster.roster(member(caller), kin)]


@pytest.fixture(params=["sqlite", "postgres"])
def mixed(request: pytest.FixtureRequest, make_runtime: MakeRuntime, clock: ManualClock,
          tmp_path: Any) -> Iterator[dict[str, Any]]:
    """Two projects of every kind of session, a loner, Focal; ties and active sessions."""
    url = (f"sqlite:///{tmp_path / 'mixed.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_url"))
    rt = make_runtime(db=url)
    store = rt.context.store
    w: dict[str, Any] = {"rt": rt, "focal": rt.get_or_create_focal_chat().id}
    kinds = [("interactive", None), ("cron", None), ("social", None), ("dream", None),
             ("interactive", "subagent_wakeup"), ("remote", None)]
    for p in ("one", "two"):
        project = w[p] = rt.create_project(p)
        root = rt.create_session(project.id, f"{p}-root")
        w[f"{p}-root"] = root.id
        for i, (kind, platform) in enumerate(itertools.islice(itertools.cycle(kinds), 18)):
            s = store.create_session(f"{p}-{i:02d}", project.id, f"{p} {kind} {i}", kind,
                                     clock.now(), platform=platform)
            if i % 4 == 0:
                clock.advance(1)  # the others tie with a neighbour: ordered by id
            if i % 3 == 1:
                store.append(s.id, [TurnEntry("user", f"hi {i}")], clock.now() + 30 - i)
        child = rt.create_session(project.id, f"{p}-child", kind="subagent",
                                  parent_id=root.id)
        grandchild = rt.create_session(project.id, unicodedata.normalize("NFD", "Café"),
                                       kind="subagent", parent_id=child.id)
        w[f"{p}-child"], w[f"{p}-grandchild"] = child.id, grandchild.id
        clock.advance(1)
    # Roots that share a worker are siblings (its value as a string: 5 and "5" are one).
    for sid, worker in (("w1a", "w1"), ("w1b", "w1"), ("w2", "w2"), ("w5", 5),
                        ("w5s", "5"), ("w0", 0), ("wnone", None)):
        w[sid] = store.create_session(sid, w["one"].id, f"worker {sid}", "cron", clock.now(),
                                      config={"worker": worker, "note": "worker"}).id
    store.create_session("w1-far", w["two"].id, "worker far", "cron", clock.now(),
                         config={"worker": "w1"})
    w["loner"] = rt.create_session(None, "Loner").id
    w["dream"], w["wake"] = "one-03", "one-04"
    w["cron"] = "one-01"
    # Active: a direct turn's mark, and a row leased to another runtime.
    assert store.take_direct_turn("one-02", "elsewhere", "turn-1", clock.now())
    rt.post("one-07", "work")
    assert rt.context.journal.claim("elsewhere", clock.now(), lease=300).rows
    assert {s.id for s in store.sessions() if s.status == "active"} == {"one-02", "one-07"}
    yield w


CALLERS = ("focal", "one-root", "cron", "dream", "wake", "loner", "two-root")


@pytest.mark.parametrize("who", CALLERS)
def test_agent_list_answers_as_it_did_for_every_caller(mixed: dict[str, Any], who: str
                                                       ) -> None:
    rt = mixed["rt"]
    caller = mixed[who]
    tools = rt.tools_for(caller)
    for mode in ("recent", "active"):
        whole = old_agent_list(rt, caller, mode, 50)["agents"]
        # Every cut around the number of visible sessions, where has_more turns over.
        for n in sorted({1, 2, 5, 50, max(1, len(whole) - 1), max(1, len(whole)),
                         min(50, len(whole) + 1)}):
            assert tools.agent_list(mode, n) == old_agent_list(rt, caller, mode, n), (mode, n)


@pytest.mark.parametrize("who", [*CALLERS[1:], "one-child", "one-grandchild", "w1a", "w5",
                                 "w5s", "w0", "wnone"])  # Focal holds no family tools
def test_list_agents_answers_as_it_did_for_every_caller(mixed: dict[str, Any], who: str
                                                        ) -> None:
    rt = mixed["rt"]
    listed = rt.tools_for(mixed[who]).list_agents()["agents"]
    assert listed == old_list_agents(rt, mixed[who])
    if who in ("w1a", "w5"):  # the population does hold roots that share a worker
        assert {"w1a": ["w1b"], "w5": ["w5s"]}[who] == [a["id"] for a in listed]


def test_a_sub_agent_still_holds_no_agent_list(mixed: dict[str, Any]) -> None:
    with pytest.raises(ToolError) as info:
        mixed["rt"].tools_for(mixed["one-child"]).agent_list()
    assert info.value.code == "execution_failed"


@pytest.mark.parametrize("name", [
    "Café",  # the grandchild, typed precomposed while stored decomposed
    unicodedata.normalize("NFD", "Café"),
    "two-root",  # a root of another project: never named
    "one dream 3",  # a hidden session's title: never said to exist
    "one-03",  # ... nor its id
    "one cron 1",  # a session of the project outside the roster
    "one-child",  # the caller itself
    "nobody",
])
def test_out_of_reach_answers_as_it_did(mixed: dict[str, Any], name: str) -> None:
    rt = mixed["rt"]
    caller = mixed["two-child"] if name == "two-root" else mixed["one-child"]
    key = mixed.get(name, name)
    with pytest.raises(ToolError) as info:
        rt.tools_for(caller).send("hi", receiver_role="sibling", receiver_name=key)
    said_out_of_reach = info.value.message == roster.REACH_ERROR
    # A relative on the roster under another role is named as such, never out of reach.
    on_roster = any(roster.designates(key.strip(), e["name"], e["id"])
                    for e in old_list_agents(rt, caller))
    assert said_out_of_reach == (old_beyond_reach(rt, caller, key.strip())
                                 and not on_roster), name
    if on_roster:
        assert info.value.message.endswith(")."), info.value.message


@pytest.fixture
def crowded(make_runtime: MakeRuntime, clock: ManualClock) -> dict[str, Any]:
    """A project of 300 sessions beside one of 3, on a SQLite file."""
    rt = make_runtime()
    big, small = rt.create_project("big"), rt.create_project("small")
    store = rt.context.store
    store.create_many([(f"b{i:03d}", big.id, f"big {i}", "cron") for i in range(300)],
                      clock.now())
    root = rt.create_session(big.id, "root")
    child = rt.create_session(big.id, "child", kind="subagent", parent_id=root.id)
    for i in range(3):
        rt.create_session(small.id, f"small {i}")
    return {"rt": rt, "root": root.id, "child": child.id,
            "focal": rt.get_or_create_focal_chat().id}


def records_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the session rows read into records from now on."""
    return ids_read(monkeypatch, sessions_module, "_session")


@pytest.mark.parametrize("who", ["root", "focal"])
def test_agent_list_reads_a_page_not_every_session(crowded: dict[str, Any], who: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tools = crowded["rt"].tools_for(crowded[who])
    built = records_built(monkeypatch)
    page = tools.agent_list("recent", 5)
    assert len(page["agents"]) == 5 and page["has_more"]
    assert len(built) <= 5 + 1 + 2, built  # the page, the one that says more, the caller


def test_a_name_out_of_reach_is_found_without_reading_every_session(
        crowded: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    tools = crowded["rt"].tools_for(crowded["child"])
    built = records_built(monkeypatch)
    with pytest.raises(ToolError) as info:
        tools.send("hi", receiver_role="sibling", receiver_name="big 7")
    assert info.value.message == roster.REACH_ERROR
    assert len(built) <= 5, built


def test_the_active_filter_reads_marks_and_leases_off_their_indexes(tmp_path: Any) -> None:
    """``agent_list("active")`` asks for the sessions active now: a handful, found by the
    direct-turn marks' index and the processing rows' (IS NOT NULL alone scanned every
    session on SQLite)."""
    stores = Stores(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        sql, params = session_filters.active_ids(stores.tables).sql()
        plan = [r[-1] for r in stores.db.execute_sql("EXPLAIN QUERY PLAN " + sql, params)]
        assert not [step for step in plan if step.startswith("SCAN m")], plan
        assert any("USING INDEX sessions_turn_owner" in step for step in plan), plan
    finally:
        stores.close()


def old_watched(rt: Runtime) -> list[hb.WatchedSession]:
    """The heartbeat's look as it was: every session of every visible project."""
    ctx = rt.context
    running = set(ctx.turns.running())
    out = []
    for p in ctx.store.projects():
        if p.hidden or p.archived:
            continue
        tasks: dict[str, list[Any]] = {}
        for t in ctx.tasks.for_project(p.id):
            tasks.setdefault(t.chat_id, []).append(t)
        for s in ctx.store.sessions(project_id=p.id):
            mine = tasks.get(s.id, [])
            out.append(hb.WatchedSession(
                s.id, s.title, max([s.updated_at, *(t.updated_at for t in mine)]),
                s.id in running or s.status == "active",
                sum(1 for t in mine if t.status in OPEN_TASK_STATES),
                tuple(t.updated_at for t in mine
                      if t.status == "blocked" and t.blocked_on == "user")))
    return out


@pytest.fixture
def watched_world(make_runtime: MakeRuntime, clock: ManualClock) -> dict[str, Any]:
    """Stalled, blocked, finished, active and idle sessions; a hidden and an archived
    project; tasks of several ages."""
    rt = make_runtime()
    store = rt.context.store
    rt.get_or_create_focal_chat()
    p = rt.create_project("work")
    store.create_project("p-arch", "old", "old", clock.now(), archived=True)
    store.create_many([(f"idle{i:02d}", p.id, f"idle {i}", "cron") for i in range(40)],
                      clock.now())
    stuck = rt.create_session(p.id, "Stuck").id
    rt.tools_for(stuck).task_create("long job", status="in_progress")
    waiting = rt.create_session(p.id, "Waiting").id
    task = rt.tools_for(waiting).task_create("ask", status="in_progress")
    rt.tools_for(waiting).task_update(task["task_id"], status="blocked", blocked_on="user")
    done = rt.create_session(p.id, "Done").id
    task = rt.tools_for(done).task_create("quick", status="in_progress")
    rt.tools_for(done).task_update(task["task_id"], status="completed")
    busy = store.create_session("busy", p.id, "Busy", "interactive", clock.now(),
                                config={"spawned_by_focal": True}).id
    rt.tools_for(busy).task_create("working", status="in_progress")
    assert store.take_direct_turn(busy, "elsewhere", "t1", clock.now())
    auto = store.create_session("auto", p.id, "Auto", "interactive", clock.now(),
                                config={"spawned_by_focal": True}).id
    assert store.take_direct_turn(auto, "elsewhere", "t2", clock.now())
    gone = store.create_session("gone", "p-arch", "Gone", "interactive", clock.now()).id
    rt.tools_for(gone).task_create("forgotten", status="in_progress")
    clock.advance(3 * 60 * 60)  # past the stall and the reminder
    fresh = rt.create_session(p.id, "Fresh").id
    rt.tools_for(fresh).task_create("just started", status="in_progress")
    return {"rt": rt, "clock": clock}


def test_the_heartbeat_look_finds_what_it_did(watched_world: dict[str, Any]) -> None:
    rt, clock = watched_world["rt"], watched_world["clock"]
    old, new = old_watched(rt), rt.focal.watched_sessions()
    found = hb.findings(new, clock.now())
    assert found == hb.findings(old, clock.now())
    assert [f.split(":")[0] for f in found] == ["stalled", "unanswered"], found  # busy runs
    by_id = {w.id: w for w in old}
    assert all(by_id[w.id] == w for w in new)  # each as it was
    assert {w.id for w in new if w.running} == {w.id for w in old if w.running} == {
        "busy", "auto"}
    status = rt.focal.status()
    assert (status["stalled"], status["auto_running"]) == (1, 2)


def test_the_heartbeat_look_reads_the_sessions_at_work_only(
        watched_world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    built = records_built(monkeypatch)
    watched = watched_world["rt"].focal.watched_sessions()
    assert len(watched) == 6 and len(built) == 6, built  # not the 40 idle ones


def old_global_context(rt: Runtime) -> str:
    """Focal's global context as it was: every task of every project read, then built."""
    from kinbox.actors import focal_context as fc
    ctx = rt.context
    running = set(ctx.turns.running())
    projects = [fc.ProjectInfo(p.id, p.slug, p.archived, p.hidden)
                for p in ctx.store.projects()]
    infos = []
    for p in projects:
        if p.archived or p.hidden:
            continue
        by_chat: dict[str, list[fc.TaskInfo]] = {}
        for t in ctx.tasks.for_project(p.id):
            by_chat.setdefault(t.chat_id, []).append(
                fc.TaskInfo(t.title, t.status, t.blocked_on, t.reason))
        for s in ctx.store.sessions_at_work(p.id, running):
            infos.append(fc.SessionInfo(s.id, s.project_id, s.title,
                                        s.id in running or s.status == "active",
                                        s.updated_at, tuple(by_chat.get(s.id, ()))))
    return fc.build_focal_global_context(projects, infos)


def test_focals_context_reads_every_task_only_of_the_sessions_it_lists(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Focal turn read every task the project ever had (done ones too) to list ten
    sessions with theirs; now their open tasks rank them and only the listed ten are read
    whole. The text is the same."""
    from kinbox.persistence import tasks as tasks_module
    rt = make_runtime()
    rt.get_or_create_focal_chat()
    tasks = rt.context.tasks
    p = rt.create_project("work")
    for i in range(25):  # 25 sessions with tasks: 10 listed, "15 more sessions"
        sid = rt.create_session(p.id, f"s{i:02d}").id
        for k in range(30):  # a long history of done tasks each
            tasks.create(f"t{i:02d}-{k:02d}", p.id, sid, f"old {k}", "completed", clock.now())
        if i % 3 == 0:
            tasks.create(f"t{i:02d}-open", p.id, sid, "open one", "in_progress", clock.now())
        if i == 0:  # the oldest-ranked by recency, but waiting on the user: listed first
            tasks.update(f"t{i:02d}-open", sid, {"status": "blocked", "blocked_on": "user"},
                         clock.now())
        clock.advance(60)
    expected = old_global_context(rt)
    assert "15 more sessions" in expected and "blocked on user" in expected
    built = ids_read(monkeypatch, tasks_module, "_record")
    assert rt.focal.global_context() == expected
    # The listed sessions' tasks (31 at most each) and the 9 open ones, not all 759.
    assert len(built) <= 10 * 31 + 9, len(built)


def test_the_roster_of_a_session_focal_dispatched_reads_its_own_project_only(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions Focal dispatched share its id as their parent, in every project: the family
    read of one of them read every session Focal ever dispatched, anywhere, to keep the two
    of its own project (kinship never crosses the project boundary)."""
    rt = make_runtime()
    focal = rt.get_or_create_focal_chat().id
    web, ops = rt.create_project("web"), rt.create_project("ops")
    store = rt.context.store
    for i in range(200):
        store.create_session(f"ops-{i:03d}", ops.id, f"ops {i}", "interactive", clock.now(),
                             parent_id=focal)
    alpha = store.create_session("alpha", web.id, "alpha", "interactive", clock.now(),
                                 parent_id=focal).id
    store.create_session("gamma", web.id, "gamma", "interactive", clock.now(),
                         parent_id=focal)
    built = records_built(monkeypatch)
    roster_now = rt.tools_for(alpha).list_agents()["agents"]
    assert [(e["relationship"], e["name"]) for e in roster_now] == [("sibling", "gamma")]
    assert len(built) <= 5, len(built)
