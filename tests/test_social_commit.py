"""Social turns whose commit outcome is unknown (SO1): a waiter whose wait ran out on a
commit its writer had already taken (``WriteTimeout(withdrawn=False)``) waits on for the
outcome, and the event's reply leaves exactly once either way."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest

from kinbox.actors import Runtime, steps
from kinbox.actors import social_rules as rules
from kinbox.persistence.driver_errors import OperationalError

from .helpers import heard_slow_write
from .social_helpers import MakeRuntime, SocialRt, event, social_runtime


@pytest.fixture
def social_rt(make_runtime: MakeRuntime, any_db_url: str) -> SocialRt:
    return social_runtime(partial(make_runtime, db=any_db_url))


def _stall_commit(rt: Runtime, monkeypatch: pytest.MonkeyPatch, *, lands: bool
                  ) -> threading.Event:
    """Hold the first social commit on the writer until its waiter gave up (the event
    returned is set then: the turn says its write is slow); it then lands, or fails in
    the database (``lands``)."""
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", 0.5)  # the turn's commit waits this
    monkeypatch.setattr(rules, "stall_pause", lambda stalls: 0.01)
    gave_up = heard_slow_write(monkeypatch).event
    rt.subscribe(lambda name, data: gave_up.set() if name == "lease_lost" else None)
    store = rt.context.store
    real_patch = store.patch_config_now
    calls: list[str] = []

    def patch_config_now(session_id: str, patch: dict[str, Any], now: float) -> None:
        calls.append(session_id)
        if len(calls) == 1:  # on the writer thread, inside the first turn's commit
            assert gave_up.wait(10), "the turn never gave up on its commit"
            if not lands:
                raise OperationalError("disk I/O error")
        real_patch(session_id, patch, now)

    store.patch_config_now = patch_config_now  # type: ignore[method-assign]
    return gave_up


@pytest.mark.timeout(60)
def test_a_commit_that_landed_after_its_waiter_gave_up_sends_its_reply_once(
        social_rt: SocialRt, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn's commit was slow: the waiter gave up while the writer ran it, and it
    landed after. The event ran again, its rerun found the event's marker (\"ran
    elsewhere\") and nobody sent the reply: accepted with a 202, answered never. The
    turn now waits for the commit's outcome: its reply leaves, once, and the brain ran once."""
    rt, brain, sent = social_rt
    gave_up = _stall_commit(rt, monkeypatch, lands=True)
    rt.social.ingest(event("slow", event_id="Ev-1"))
    assert gave_up.wait(10)
    assert rt.social.wait_idle(20), rt.social.statistics()
    assert brain.turns == [["slow"]]
    assert sent == [({"channel": "C9", "ts": "T1"}, "echo: slow")]
    stats = rt.social.statistics()
    assert (stats["turns"], stats["failed_turns"], stats["duplicates"]) == (1, 0, 0)
    sid = rules.session_id_for("slack", "T1")
    assert [e.text for e in rt.transcript(sid) if e.role == "assistant"] == ["echo: slow"]


@pytest.mark.timeout(60)
def test_a_commit_that_failed_after_its_waiter_gave_up_runs_again_and_answers_once(
        social_rt: SocialRt, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, but the slow commit failed in the end: nothing of it is in the journal,
    so the event runs again and its reply leaves once, from the commit that held."""
    rt, brain, sent = social_rt
    gave_up = _stall_commit(rt, monkeypatch, lands=False)
    rt.social.ingest(event("slow", event_id="Ev-1"))
    assert gave_up.wait(10)
    assert rt.social.wait_idle(20), rt.social.statistics()
    assert brain.turns == [["slow"], ["slow"]]
    assert sent == [({"channel": "C9", "ts": "T1"}, "echo: slow")]
    sid = rules.session_id_for("slack", "T1")
    assert [e.text for e in rt.transcript(sid) if e.role == "assistant"] == ["echo: slow"]
