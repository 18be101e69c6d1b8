"""The listing commands never cut a listing silently, and read the page they print.

``sessions list``, ``inbox list``, ``cron list`` and ``cron runs`` print at most
``--limit`` rows. With ``--json`` they printed a bare list: a script reading it
believed it had seen everything when the default 100 (or 20 runs) cut it, and only
the table of ``sessions list`` said that more followed. Now ``--json`` prints
``{"items": [...], "more": ..., "next_offset": ...}`` and every table says how to
list the next page; ``cron list`` read every job into memory to print them.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from kinbox.actors.cli import main
from kinbox.persistence import CronJobRecord, CronStore, NewMessage
from kinbox.persistence import cron_store as cron_store_module

from .conftest import Stores, ids_read
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_040.0


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out=out)
    return code, out.getvalue()


def page(*args: str) -> dict[str, Any]:
    code, text = run(*args, "--json")
    assert code == 0, text
    listed = json.loads(text)
    assert isinstance(listed, dict), listed  # a bare list says nothing of what it left out
    return listed


def ids(listed: dict[str, Any], key: str) -> list[str]:
    return [item[key] for item in listed["items"]]


@pytest.fixture
def busy_db(db_url: str) -> str:
    """Five inbox rows (m0 the oldest), 102 sessions of one time (listed by id), 7 cron
    jobs due a minute apart (c0 first), and 25 runs of c0 (r00 the oldest)."""
    s = Stores(db_url)
    s.store.create_many([(f"s{i:03d}", None, f"t{i}", "cron") for i in range(102)], 0)
    for i in range(5):
        s.journal.enqueue(NewMessage(f"m{i}", "s000", "body"), i)
    crons = CronStore(s.tables, s.writer)
    for i in range(7):
        crons.create(CronJobRecord(f"c{i}", f"job {i}", "0 0 1 1 *", "UTC", "p", True, "none",
                                   0, NOW + 60 * i, None, None, None, NOW, NOW))
    r = s.tables.cron_run
    s.writer.call(lambda: r.insert_many([
        {"id": f"r{i:02d}", "job_id": "c0", "scheduled_for": NOW + i, "started_at": NOW + i,
         "finished_at": NOW + i, "status": "success", "result": "ok", "error": None,
         "owner": None, "lease_until": None, "attempts": 1} for i in range(25)]).execute())
    s.close()
    return db_url


def test_sessions_list_json_says_whether_more_follow(busy_db: str) -> None:
    first = page("sessions", "list", "--db", busy_db)  # newest first: one time, by id
    assert ids(first, "id") == [f"s{i:03d}" for i in reversed(range(2, 102))]
    assert (first["more"], first["next_offset"]) == (True, 100)
    last = page("sessions", "list", "--db", busy_db, "--offset", "100")
    assert ids(last, "id") == ["s001", "s000"]
    assert (last["more"], last["next_offset"], last["next_after"]) == (False, None, None)
    # The cursor walk: the same page after the first.
    after = page("sessions", "list", "--db", busy_db, "--after", first["next_after"])
    assert after == {**last, "next_offset": None}
    # A page exactly as long as what is left is the last one, and says so.
    exact = page("sessions", "list", "--db", busy_db, "--limit", "2", "--offset", "100")
    assert (exact["more"], exact["next_offset"]) == (False, None)


def test_inbox_list_pages_back_through_older_rows(busy_db: str) -> None:
    newest = page("inbox", "list", "--db", busy_db, "--limit", "2")
    assert ids(newest, "message_id") == ["m3", "m4"]  # the newest, oldest first
    assert (newest["more"], newest["next_offset"]) == (True, 2)
    older = page("inbox", "list", "--db", busy_db, "--limit", "2", "--offset", "2")
    assert ids(older, "message_id") == ["m1", "m2"] and older["next_offset"] == 4
    oldest = page("inbox", "list", "--db", busy_db, "--limit", "2", "--offset", "4")
    assert ids(oldest, "message_id") == ["m0"]
    assert (oldest["more"], oldest["next_offset"]) == (False, None)
    assert all("content" not in row for row in newest["items"])  # bodies stay out
    code, text = run("inbox", "list", "--db", busy_db, "--limit", "2")
    assert code == 0
    assert text.splitlines()[-1] == "... more: --before-seq 4 lists the 2 rows before these"
    code, text = run("inbox", "list", "--db", busy_db, "--limit", "5")
    assert not text.splitlines()[-1].startswith("...")


def test_inbox_list_walks_back_each_row_once_while_rows_arrive(busy_db: str) -> None:
    """The next page the table named was ``--offset N``, counted from the newest row: a
    row enqueued between two reads (a runtime delivering meanwhile) pushed every row one
    place back, and the page the operator was told to list repeated the rows just seen
    (and with ``--state``, a row leaving the state made the next skip one). It names the
    position ``--before-seq`` (``seq`` is unique and never changes): each row once."""
    code, text = run("inbox", "list", "--db", busy_db, "--limit", "2")
    assert code == 0
    hint = text.splitlines()[-1].split()
    assert hint[:2] == ["...", "more:"]
    s = Stores(busy_db)
    for i in (5, 6):  # arrive after the first page was printed
        s.journal.enqueue(NewMessage(f"m{i}", "s000", "body"), i)
    s.close()
    older = page("inbox", "list", "--db", busy_db, "--limit", "2", *hint[2:4])
    assert ids(older, "message_id") == ["m1", "m2"]
    oldest = page("inbox", "list", "--db", busy_db, "--limit", "2", "--before-seq",
                  str(older["next_before_seq"]))
    assert ids(oldest, "message_id") == ["m0"]
    assert (oldest["more"], oldest["next_before_seq"]) == (False, None)
    with pytest.raises(SystemExit) as refused:  # an offset from a position: one or other
        run("inbox", "list", "--db", busy_db, "--offset", "1", "--before-seq", "3")
    assert refused.value.code == 2


def test_cron_list_pages_in_listing_order(busy_db: str) -> None:
    first = page("cron", "list", "--db", busy_db, "--limit", "3")
    assert ids(first, "job_id") == ["c0", "c1", "c2"]
    assert (first["more"], first["next_offset"]) == (True, 3)
    rest = page("cron", "list", "--db", busy_db, "--offset", "3")
    assert ids(rest, "job_id") == ["c3", "c4", "c5", "c6"]
    assert (rest["more"], rest["next_offset"]) == (False, None)
    code, text = run("cron", "list", "--db", busy_db, "--limit", "3")
    assert code == 0
    assert text.splitlines()[-1] == "... more: --offset 3 lists the next 3"


def test_cron_list_reads_the_page_not_every_job(busy_db: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    built = ids_read(monkeypatch, cron_store_module, "_job")
    assert ids(page("cron", "list", "--db", busy_db, "--limit", "2"), "job_id") == ["c0", "c1"]
    assert built == ["c0", "c1", "c2"]  # the page, and the one that says more follow


def test_cron_runs_says_whether_older_runs_follow(busy_db: str) -> None:
    newest = page("cron", "runs", "c0", "--db", busy_db)
    assert ids(newest, "run_id") == [f"r{i:02d}" for i in range(24, 4, -1)]  # default 20
    assert (newest["more"], newest["next_offset"]) == (True, 20)
    older = page("cron", "runs", "--db", busy_db, "--offset", "20")
    assert ids(older, "run_id") == ["r04", "r03", "r02", "r01", "r00"]
    assert (older["more"], older["next_offset"]) == (False, None)
    by_cursor = page("cron", "runs", "--db", busy_db, "--before", newest["next_before"])
    assert ids(by_cursor, "run_id") == ids(older, "run_id")
    assert (by_cursor["more"], by_cursor["next_before"]) == (False, None)
    code, text = run("cron", "runs", "--db", busy_db, "--limit", "5")
    assert code == 0
    # The cursor, not an offset: runs recorded meanwhile shift an offset's pages.
    last = text.splitlines()[-1]
    assert last.startswith("... more: --before ") and last.endswith(
        " lists the 5 runs before these"), last


@pytest.mark.parametrize("args", [
    ("inbox", "list", "--offset", "-1"),
    ("inbox", "list", "--offset", "1.5"),
    ("cron", "list", "--limit", "0"),
    ("cron", "list", "--limit", "501"),
    ("cron", "list", "--offset", "ten"),
    ("cron", "runs", "--offset", "-1"),
])
def test_limits_and_offsets_are_checked_everywhere(args: tuple[str, ...]) -> None:
    done = kinbox(*args)
    assert done.returncode == 2, done.stdout
    assert f"argument {args[2]}" in done.stderr and "Traceback" not in done.stderr
    assert not done.stdout


def test_the_runs_of_an_unknown_job_are_still_refused(busy_db: str) -> None:
    done = kinbox("cron", "runs", "nope", "--db", busy_db, "--json")
    assert done.returncode == 1 and "no cron job with id 'nope'" in done.stderr



def test_inbox_list_json_keeps_a_social_message_text_out_as_it_keeps_the_body(
        db_url: str) -> None:
    """``inbox list`` left out a row's body (``content``) but printed its ``payload``, and
    a chat message's payload holds the sender's text whole (and its attachments): every
    WhatsApp or Slack message a user sent was in a listing an operator pastes into a
    ticket. Listings print neither; ``inbox show`` prints both on request."""
    from kinbox.actors.social_rules import SocialEvent
    from kinbox.actors.social_state import turn_message

    said = "my card number is 4111 1111 1111 1111"
    message = turn_message(SocialEvent("ev1", "slack", "U1", "Ann", "T1", said))
    s = Stores(db_url)
    s.store.create_session("s1", None, "Slack: Ann", "social", 0)
    s.journal.enqueue(NewMessage("ev1", "s1", message.content, kind=message.kind,
                                 payload=message.payload), 0)
    s.close()
    listed = page("inbox", "list", "--db", db_url)
    assert ids(listed, "message_id") == ["ev1"]
    assert "4111" not in json.dumps(listed)
    code, shown = run("inbox", "show", "ev1", "--db", db_url, "--json")
    assert code == 0 and json.loads(shown)["payload"]["text"] == said
