"""``kinbox bench scaleout`` at a tiny size: every system runs on its own PostgreSQL database
and the report has its keys and the issue's targets. No test asserts a speed."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from kinbox.actors import bench_scaleout
from kinbox.actors.bench_scaleout_systems import (
    REMAINING,
    SYSTEM_NAMES,
    database_name,
    database_url,
    scratch_producer,
    server_problem,
)
from kinbox.actors.cli import main
from kinbox.persistence import open_database


def test_scaleout_refuses_a_database_that_is_not_postgresql(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scaleout", "--quick", "--db", "sqlite:///x.db"]) == 2
    assert "needs a PostgreSQL server" in capsys.readouterr().err
    assert main(["bench", "scaleout", "--quick", "--db",
                 "postgresql://u@127.0.0.1:1/kinbox?dbname=other"]) == 2
    assert "not a dbname parameter" in capsys.readouterr().err


def test_each_system_gets_a_database_of_its_own_on_the_same_server() -> None:
    urls = {database_url("postgresql://u@h:5432/base", s) for s in SYSTEM_NAMES}
    assert len(urls) == len(SYSTEM_NAMES)
    assert "postgresql://u@h:5432/base_bench_dbos" in urls
    # A Unix socket's URL has no host before the path: it keeps its three slashes.
    assert (database_url("postgresql:///base?host=/run/postgresql", "raw")
            == "postgresql:///base_bench_raw?host=/run/postgresql")
    assert (database_url("postgresql://u@[::1]:5432", "raw")
            == "postgresql://u@[::1]:5432/postgres_bench_raw")


def test_the_ratios_name_each_target_with_its_measure() -> None:
    r = {"kinbox_1_worker": {"drain_msgs_per_s": 100, "closed_msgs_per_s": 50},
         "kinbox_2_workers": {"drain_msgs_per_s": 150, "closed_msgs_per_s": 80},
         "pgqueuer": {"drain_msgs_per_s": 50, "closed_msgs_per_s": 100},
         "dbos": {"drain_msgs_per_s": 25, "closed_msgs_per_s": 10},
         "bare_pg": {"drain_msgs_per_s": 400, "closed_msgs_per_s": 100},
         "bare_pg_rows": {"drain_msgs_per_s": 200, "closed_msgs_per_s": 90},
         "bare_pg_rows_2_workers": {"drain_msgs_per_s": 300, "closed_msgs_per_s": 90},
         "kinbox_latency": {"p99_ms": 12.5}, "kinbox_recovery": {"first_redelivery_s": 0.6}}
    ratios = bench_scaleout.ratios(r)
    assert ratios["drain: 2 workers / 1 (target >= 1.3)"] == 1.5
    assert ratios["closed: kinbox 1 worker / pgqueuer (target >= 1)"] == 0.5
    assert ratios["drain: kinbox 1 worker / dbos (target >= 3)"] == 4.0
    assert ratios["recovery to first redelivery, s (target <= 1)"] == 0.6
    assert ratios["drain: kinbox_vs_bare_pg"] == 0.25
    assert ratios["drain: bare_pg_vs_pgqueuer"] == 8.0
    # kinbox_vs_bare_pg split: kinbox's rows (bare_pg_rows / bare_pg), and the rest
    assert ratios["drain: bare_pg_rows_vs_bare_pg"] == 0.5
    assert ratios["drain: kinbox_vs_bare_pg_rows"] == 0.5
    assert ratios["closed: bare_pg_rows_vs_bare_pg"] == 0.9
    assert ratios["drain: bare_pg_rows 2 workers / 1"] == 1.5
    assert "drain: bare_pg 2 workers / 1" not in ratios  # not run here


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_tiny_scaleout_run_reports_every_system_and_workload(
        pg_url: str, request: pytest.FixtureRequest) -> None:
    # About a minute (a dozen runs of worker processes): only with ``-m slow``.
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the scaleout benchmark runs only with -m slow")
    for module in ("asyncpg", "pgqueuer", "procrastinate", "dbos"):
        pytest.importorskip(module, reason="the bench extra: pip install -e '.[bench]'")
    report = bench_scaleout.scaleout(True, pg_url, tiny=True)
    results = report["results"]
    others = [s for s in SYSTEM_NAMES if s != "kinbox"]
    assert set(results) == {"kinbox_1_worker", "kinbox_2_workers", "bare_pg_2_workers",
                            "bare_pg_rows_2_workers",
                            *others, "kinbox_sends_only", "kinbox_latency", "kinbox_recovery"}
    for name in ["kinbox_1_worker", "kinbox_2_workers", "bare_pg_2_workers",
                 "bare_pg_rows_2_workers", *others]:
        assert results[name]["drain_msgs_per_s"] > 0 and results[name]["closed_msgs_per_s"] > 0
    assert results["kinbox_sends_only"]["closed_msgs_per_s"] > 0
    for w in ("drain", "closed"):
        for bare in ("bare_pg", "bare_pg_rows"):
            assert (results[bare][f"{w}_lost"], results[bare][f"{w}_duplicate"]) == (0, 0)
    assert results["kinbox_latency"]["p99_ms"] is not None
    assert results["kinbox_recovery"]["first_redelivery_s"] is not None
    assert len(results["kinbox_latency"]["per_worker"]) == 2


def test_pinning_workers_is_scaleouts_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "recovery", "--quick", "--pin-workers"]) == 2
    assert "--pin-workers applies to bench scaleout only" in capsys.readouterr().err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("url", ["postgresql://u:Sup3r%zzSecret@127.0.0.1:1/kinbox",
                                 "postgresql://u@127.0.0.1:1/kinbox?password=Sup3r%zzSecret",
                                 "postgresql://u:Sup3r/zzSecret@127.0.0.1:1/kinbox"])
def test_a_password_the_driver_quotes_in_its_error_is_masked_there_too(
        capsys: pytest.CaptureFixture[str], url: str) -> None:
    """libpq refuses a URL whose password holds a '%' that starts no escape, quoting it
    ('invalid percent-encoded token: "..."'): the URL was masked, the driver's text not."""
    assert main(["bench", "scaleout", "--quick", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the PostgreSQL server of" in err
    assert "Sup3r" not in err, err


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_pinned_workers_each_run_on_a_cpu_of_their_own(pg_url: str) -> None:
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to tell pinned workers from free ones")
    with scratch_producer("raw", pg_url, 4, 100) as producer:
        pool = bench_scaleout.Workers("raw", producer.url, 2, pin=True)
        try:
            assert [os.sched_getaffinity(p.pid) for p in pool.procs] == [{cpus[0]}, {cpus[1]}]
        finally:
            pool.stop()
        free = bench_scaleout.Workers("raw", producer.url, 1)
        try:
            assert os.sched_getaffinity(free.procs[0].pid) == set(cpus)
        finally:
            free.stop()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_kinbox_progress_poll_reads_the_open_rows_index_after_the_backlog(pg_url: str) -> None:
    # The backlog's ANALYZE says every row is pending, which made the planner scan the whole
    # table (every row version) for each poll while the workers drained it.
    with scratch_producer("kinbox", pg_url, 200, 100) as producer:
        producer.backlog(3000)
        plan = "\n".join(r[0] for r in producer.query(f"EXPLAIN {REMAINING['kinbox']}"))
        assert "Seq Scan" not in plan
        assert "agent_inbox_open_target_seq" in plan
        assert producer.remaining() == 3000


def _bench_name(pg_url: str, system: str) -> str:
    """The name of the database the scale-out bench gives ``system`` beside ``pg_url``'s."""
    return database_name(database_url(pg_url, system))


def _bench_databases(pg_url: str) -> set[str]:
    """The databases the scale-out bench names after ``pg_url``'s, on its server."""
    import psycopg2

    conn = psycopg2.connect(pg_url)
    try:
        with conn.cursor() as cur:
            prefix = _bench_name(pg_url, "")
            cur.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)",
                        (prefix,))
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_measurement_drops_its_database_however_it_ends(pg_url: str) -> None:
    kinbox, raw = _bench_name(pg_url, "kinbox"), _bench_name(pg_url, "raw")
    with scratch_producer("kinbox", pg_url, 4, 100) as producer:
        producer.backlog(8)  # a connection of its own stays open to it
        assert kinbox in _bench_databases(pg_url)
    assert kinbox not in _bench_databases(pg_url)
    with pytest.raises(RuntimeError, match="mid-measurement"), \
            scratch_producer("raw", pg_url, 4, 100):
        assert raw in _bench_databases(pg_url)
        raise RuntimeError("mid-measurement")
    assert raw not in _bench_databases(pg_url)
    # A whole workload the same way: nothing of it is left on the server.
    assert bench_scaleout.sends_only(pg_url, 20) > 0
    assert kinbox not in _bench_databases(pg_url)


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_set_up_that_fails_stops_what_it_started_and_drops_the_database(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from kinbox.actors import Runtime

    def refuse(self: Runtime, name: str) -> None:
        raise RuntimeError("no project today")

    monkeypatch.setattr(Runtime, "create_project", refuse)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="no project today"), \
            scratch_producer("kinbox", pg_url, 4, 100):
        pass
    # The send-only runtime had started its writer and other threads: all ended.
    assert [t.name for t in threading.enumerate() if t.ident not in before] == []
    assert _bench_name(pg_url, "kinbox") not in _bench_databases(pg_url)


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_kinbox_measurement_leaves_no_files_behind(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where a runtime with no data folder of its own would write (and the children inherit).
    monkeypatch.setenv("KINBOX_HOME", str(tmp_path / "home"))
    with scratch_producer("kinbox", pg_url, 4, 100) as producer:
        pool = bench_scaleout.Workers("kinbox", producer.url, 1)
        try:
            producer.backlog(8)
            bench_scaleout.wait_done(producer, 60)
            assert (pool.dir / "w0-home").is_dir()  # the worker's runtime wrote its files there
        finally:
            pool.stop()
        assert not pool.dir.exists()
        assert producer.home is not None and Path(producer.home).is_dir()
    assert not Path(producer.home).exists()
    assert not (tmp_path / "home").exists()


@pytest.mark.timeout(30)
def test_a_server_that_cannot_be_reached_is_a_usage_error_before_any_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on loopback: nothing listens there. The password never reaches the output.
    assert main(["bench", "scaleout", "--quick", "--db",
                 "postgresql://u:hunter2@127.0.0.1:1/kinbox"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the PostgreSQL server of postgresql://u:***@127.0.0.1:1/kinbox" in err
    assert "hunter2" not in err and "Traceback" not in err
    assert main(["bench", "scaleout", "--quick", "--db",
                 "postgresql://u@127.0.0.1:1/kinbox?password=hunter2"]) == 2
    err = capsys.readouterr().err
    assert "?password=***" in err and "hunter2" not in err


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_the_database_the_url_names_need_not_exist(pg_url: str) -> None:
    # Its name only prefixes the systems' databases: the server's DDL goes through the
    # maintenance database (the README's command names one a new server lacks).
    base = database_url(pg_url, "absent")
    assert database_name(base) not in _bench_databases(pg_url)
    assert server_problem(base) is None
    assert bench_scaleout.server_settings(base)["fsync"] in ("on", "off")  # the report's
    with scratch_producer("raw", base, 4, 100) as producer:
        producer.backlog(8)
        assert _bench_name(base, "raw") in _bench_databases(pg_url)
    assert _bench_name(base, "raw") not in _bench_databases(pg_url)


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_role_that_may_not_create_databases_is_told_what_to_do(
        pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    role = f"kinbox_test_no_createdb_{os.getpid()}"  # roles are the server's: one per run
    admin = open_database(pg_url)
    admin.execute_sql(f"DROP ROLE IF EXISTS {role}")
    admin.execute_sql(f"CREATE ROLE {role} LOGIN NOCREATEDB")
    try:
        parts = urlsplit(pg_url)
        url = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
        problem = server_problem(url)
        assert problem is not None and f'ALTER ROLE "{role}" CREATEDB' in problem, problem
        assert main(["bench", "scaleout", "--quick", "--db", url]) == 2
        assert f'ALTER ROLE "{role}" CREATEDB' in capsys.readouterr().err
    finally:
        admin.execute_sql(f"DROP ROLE IF EXISTS {role}")
        admin.close()
