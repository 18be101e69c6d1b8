"""A social reply is durable until its platform accepted it (SO1): a send that a stop cut
off is sent again at the next start, with the reply's stable id as the platform's dedupe
key, and a reply the platform accepted is never sent again."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.persistence import DatabaseFailed, GroupCommitWriter, WriteTimeout

from .helpers import SHORT, failing_once, wait_for
from .social_helpers import PlatformServer, respond


class Platform(PlatformServer):
    """A chat platform's message endpoint on 127.0.0.1. The first post of ``held`` text
    waits until ``cut`` is set, then the platform drops the connection unanswered (nothing
    posted); every other post is accepted (200) and kept in ``accepted``."""

    def __init__(self) -> None:
        self.held = ""
        self.holding, self.cut = threading.Event(), threading.Event()
        self.accepted: list[dict[str, Any]] = []
        self.first: dict[str, Any] = {}
        self.dropped = 0
        super().__init__(self._answer)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if body["text"] == self.held and not self.holding.is_set():
            self.first = body
            self.holding.set()
            self.cut.wait(30)
            self.dropped += 1
            handler.close_connection = True
            return  # no answer: the post never went out
        self.accepted.append(body)
        respond(handler, 200)

    def send(self, route: Mapping[str, Any], text: str, reply_id: str | None = None) -> None:
        """The product's adapter: posts the reply with the platform's dedupe key."""
        body = json.dumps({"channel": route["channel"], "text": text, "client_msg_id": reply_id})
        request = urllib.request.Request(
            self.url, body.encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).close()

    def close(self) -> None:
        self.cut.set()
        super().close()


@pytest.fixture
def platform() -> Iterator[Platform]:
    p = Platform()
    yield p
    p.close()


def booked(turn: Turn) -> str:
    return "Booked." if turn.messages[0].kind == "social_message" else "Noted."


def started(db_url: str, platform: Platform) -> Runtime:
    rt = Runtime(db=db_url, brain=booked).start()
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=platform.send)
    return rt


EVENT = {
    "platform": "slack",
    "event_id": "Ev-1",
    "sender_id": "U1",
    "sender_name": "Ann",
    "thread_id": "T42",
    "text": "Can you book a table tonight?",
    "reply_route": {"channel": "C9", "thread_ts": "T42"},
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("turn", ["event", "agent_send"])
def test_a_reply_whose_send_a_stop_cut_off_is_sent_at_the_next_start_once(
    db_url: str, platform: Platform, turn: str
) -> None:
    """The turn committed (a social event's own turn, or an inbox turn of the thread's
    session), its reply was on its way to the platform when the runtime stopped, and the
    platform never took it: the reply was in the transcript and the user never got it
    (no start sent it again)."""
    rt = started(db_url, platform)
    try:
        rt.social.ingest(dict(EVENT))
        if turn == "event":
            platform.held = "Booked."
        else:  # the event's reply goes out; then a colleague's note is answered there
            wait_for(lambda: len(platform.accepted) == 1, 20, "the event's reply")
            platform.held = "Noted."
            colleague = rt.create_session("social", "Helper").id
            rt.tools_for(colleague).agent_send("social-slack-T42", "a note")
        assert platform.holding.wait(20), "the reply never reached the platform"
        rt.stop(timeout=1)  # the send still waits on the platform
    finally:
        platform.cut.set()  # the platform drops it: not posted
    wait_for(lambda: platform.dropped == 1, 20, "the platform to drop the post")
    before = len(platform.accepted)

    again = started(db_url, platform)
    try:
        wait_for(lambda: len(platform.accepted) > before, 20, "the reply to be sent again")
        assert again.social.wait_idle(20)
        again.run_until_idle()
    finally:
        again.stop()
    [resent] = platform.accepted[before:]
    assert resent == platform.first  # the same reply, under the same dedupe key
    assert resent["text"] == platform.held and resent["client_msg_id"]

    third = started(db_url, platform)  # the platform took it: nothing is sent any more
    try:
        assert third.social.wait_idle(20)
        third.run_until_idle()
    finally:
        third.stop()
    assert len(platform.accepted) == before + 1


@pytest.mark.timeout(120)
def test_two_live_runtimes_send_a_reply_a_gone_one_kept_once(
    pg_url: str, platform: Platform
) -> None:
    """On PostgreSQL two runtimes that start after one whose send a stop cut off each
    found its kept reply and sent it: the user got it twice. The one that takes the reply
    over sends it; the other sees it taken by a live runtime and leaves it."""
    rt = started(pg_url, platform)
    try:
        rt.social.ingest(dict(EVENT))
        platform.held = "Booked."
        assert platform.holding.wait(20), "the reply never reached the platform"
        rt.stop(timeout=1)
    finally:
        platform.cut.set()
    wait_for(lambda: platform.dropped == 1, 20, "the platform to drop the post")
    before = len(platform.accepted)

    gate = threading.Event()  # both have registered before either send goes out

    def slow_send(route: Mapping[str, Any], text: str, reply_id: str | None = None) -> None:
        gate.wait(20)
        platform.send(route, text, reply_id)

    live = []
    try:
        for _ in range(2):
            other = Runtime(db=pg_url, brain=booked).start()
            live.append(other)
            other.social.allow("slack", ["U1"])
            other.social.register_channel("slack", send=slow_send)
        gate.set()
        wait_for(lambda: len(platform.accepted) > before, 20, "the reply to be sent again")
        for other in live:
            assert other.social.wait_idle(20)
    finally:
        gate.set()
        for other in live:
            other.stop()
    assert [b["text"] for b in platform.accepted[before:]] == ["Booked."]


def holding_a_reply(pg_url: str, platform: Platform) -> tuple[Runtime, int]:
    """A runtime (beside the test's) whose reply to :data:`EVENT` the platform holds, on
    its way and not yet taken; and how many posts the platform had taken by then."""
    doomed = started(pg_url, platform)
    doomed.social.ingest(dict(EVENT))
    platform.held = "Booked."
    assert platform.holding.wait(20), "the reply never reached the platform"
    return doomed, len(platform.accepted)


@pytest.mark.timeout(120)
def test_a_live_runtime_sends_the_reply_of_one_that_died_beside_it(
    pg_url: str, platform: Platform
) -> None:
    """On PostgreSQL a runtime running beside one whose send was cut off looked for kept
    replies only when its own channel was registered, before the other died: the reply
    waited for the next start of some runtime, however long that was. The tick that takes
    a gone runtime's leases over takes its kept replies over too, and sends them once."""
    survivor = started(pg_url, platform)
    try:
        try:
            doomed, before = holding_a_reply(pg_url, platform)
            doomed.stop(timeout=1)  # its life lock goes with it: gone to the survivor
        finally:
            platform.cut.set()
        wait_for(lambda: platform.dropped == 1, 20, "the platform to drop the post")
        wait_for(lambda: len(platform.accepted) > before, 20, "the survivor to send it")
        assert survivor.social.wait_idle(20)
        survivor.run_until_idle()
    finally:
        survivor.stop()
    [resent] = platform.accepted[before:]
    assert resent == platform.first  # the same reply, under the same dedupe key


class SlowWriteWatch(logging.Handler):
    """Set once a write's wait ran out: the tick's failure, or the wait going on."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        failed = record.exc_info is not None and isinstance(record.exc_info[1], WriteTimeout)
        if failed or (record.name == "kinbox.writer" and record.levelno == logging.WARNING):
            self.event.set()


class ShortWaits:
    """The survivor's writer with a short wait (:data:`helpers.SHORT`), saying when a
    write was submitted: the real writer's ``call`` and ``call_landed``, no other change."""

    def __init__(self, real: GroupCommitWriter) -> None:
        self.real = real
        self.submitted = threading.Event()

    def call(self, op: Any, timeout: float | None = SHORT) -> Any:
        reply = self.real.submit(op)
        self.submitted.set()
        return reply.result(timeout)

    def call_landed(self, op: Any) -> Any:
        reply = self.real.submit(op)
        self.submitted.set()
        return reply.landed(SHORT)


@pytest.mark.timeout(120)
def test_a_take_over_whose_write_outran_its_wait_still_sends_the_reply(
    pg_url: str, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick takes a gone runtime's kept reply over in a writer batch. When that batch
    ran past the wait (a slow disk, a lock another process held), the tick took the take
    over as failed; it then committed: the reply was this live runtime's, which never
    sent it, and no other runtime would take it over while this one lived."""
    survivor = started(pg_url, platform)
    try:
        try:
            doomed, before = holding_a_reply(pg_url, platform)
            kept = survivor.social.channels.kept
            writer = kept.writer
            watch = SlowWriteWatch()
            for name in ("kinbox.runtime", "kinbox.writer"):
                logger = logging.getLogger(name)
                monkeypatch.setattr(logger, "handlers", [*logger.handlers, watch])
            short = ShortWaits(writer)
            monkeypatch.setattr(kept, "writer", short)
            gate, holding, batch_done = threading.Event(), threading.Event(), threading.Event()
            writer.submit(lambda: (holding.set(), gate.wait(30)))  # the writer is busy ...
            assert holding.wait(10)

            def then() -> None:
                assert short.submitted.wait(30), "the take-over never queued"
                writer.submit(lambda: batch_done.wait(30))  # ... and its batch runs long
                gate.set()
            helper = threading.Thread(target=then, daemon=True)
            helper.start()
            doomed.stop(timeout=1)  # its life lock goes with it: gone to the survivor
        finally:
            platform.cut.set()
        try:
            assert watch.event.wait(30), "the take-over's wait never ran out"
        finally:
            gate.set()
            batch_done.set()  # the take-over commits: the reply is the survivor's
        helper.join(30)
        wait_for(lambda: len(platform.accepted) > before, 30, "the survivor to send it")
        assert survivor.social.wait_idle(20)
    finally:
        survivor.stop()
    [resent] = platform.accepted[before:]
    assert resent == platform.first


@pytest.mark.timeout(120)
def test_a_take_over_whose_answer_was_lost_still_sends_the_reply(
    pg_url: str, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick's take-over of a gone runtime's kept reply committed while its answer was
    lost with the connection (a server restart, a failover, a cut network): the tick took
    it for failed, and the reply was this live runtime's, which never sent it, and which
    its next looks (for replies other runtimes kept) never saw again."""
    survivor = started(pg_url, platform)
    try:
        try:
            doomed, before = holding_a_reply(pg_url, platform)
            kept = survivor.social.channels.kept
            real = kept.take_over
            lost = threading.Event()

            def take_over(reply_ids: list[str], gone: set[str], owner: str) -> set[str]:
                taken = real(reply_ids, gone, owner)
                if taken and not lost.is_set():
                    lost.set()
                    raise DatabaseFailed("server closed the connection unexpectedly")
                return taken
            monkeypatch.setattr(kept, "take_over", take_over)
            doomed.stop(timeout=1)  # its life lock goes with it: gone to the survivor
        finally:
            platform.cut.set()
        assert lost.wait(30), "the take-over never came"
        wait_for(lambda: len(platform.accepted) > before, 30, "the survivor to send it")
        assert survivor.social.wait_idle(20)
    finally:
        survivor.stop()
    [resent] = platform.accepted[before:]
    assert resent == platform.first


@pytest.mark.timeout(90)
def test_a_reply_the_platform_took_is_not_sent_again_when_its_delivery_note_failed(
    db_url: str, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform took the reply, then the hidden ``delivery`` note in the transcript
    failed to write (a writer wait that ran out under load): the send raised out of
    ``Channels.send`` before it settled the kept reply, so the next start sent it again and
    the user got it twice. The note is a record of the send, not part of it."""
    rt = started(db_url, platform)
    try:
        store = rt.social.channels.ctx.store
        real_append = store.append

        def slow_append(session_id: str, entries: Any, now: float) -> None:
            if any(e.role == "delivery" for e in entries):
                raise WriteTimeout(5.0, True)
            real_append(session_id, entries, now)
        monkeypatch.setattr(store, "append", slow_append)
        rt.social.ingest(dict(EVENT))
        wait_for(lambda: len(platform.accepted) == 1, 20, "the reply to be sent")
        assert rt.social.wait_idle(20)
        rt.run_until_idle()
    finally:
        rt.stop()
    monkeypatch.undo()

    again = started(db_url, platform)
    try:
        assert again.social.wait_idle(20)
        again.run_until_idle()
    finally:
        again.stop()
    assert [b["text"] for b in platform.accepted] == ["Booked."]


def answer_the_text(turn: Turn) -> str:
    return "re: " + str(turn.messages[0].payload.get("text", turn.messages[0].content))


@pytest.mark.timeout(120)
def test_a_threads_replies_left_by_an_earlier_life_leave_before_its_later_ones(
    db_url: str, platform: Platform
) -> None:
    """A stop cut off the send of a thread's first reply (kept) and handed its next event
    to the inbox; the next start answered that event before the product registered the
    channel (held in memory). The registration sent the held, later reply first and the
    earlier life's reply after it: the thread read its answers out of order."""
    rt = Runtime(db=db_url, brain=answer_the_text).start()
    try:
        rt.social.allow("slack", ["U1"])
        rt.social.register_channel("slack", send=platform.send)
        platform.held = "re: first"
        rt.social.ingest({**EVENT, "text": "first"})
        assert platform.holding.wait(20), "the reply never reached the platform"
        rt.social.ingest({**EVENT, "event_id": "Ev-2", "text": "second"})  # waits its turn
        wait_for(lambda: rt.social.statistics()["queued_now"] == 0, 10, "the routing")
        rt.stop(timeout=1)  # the first reply's send still waits; the second event waits
    finally:
        platform.cut.set()
    wait_for(lambda: platform.dropped == 1, 20, "the platform to drop the post")

    again = Runtime(db=db_url, brain=answer_the_text).start()
    try:
        again.social.allow("slack", ["U1"])
        wait_for(lambda: [o["status"] for o in again.social.outcomes] == ["no_channel"], 20,
                 "the handed-over event's reply, held for the channel")
        again.social.register_channel("slack", send=platform.send)
        wait_for(lambda: len(platform.accepted) == 2, 20, "both replies")
        assert again.social.wait_idle(20)
    finally:
        again.stop()
    assert [a["text"] for a in platform.accepted] == ["re: first", "re: second"]


@pytest.mark.timeout(60)
def test_a_registration_whose_look_for_kept_replies_failed_looks_again_at_the_next(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``register_channel`` takes up the replies an earlier life kept, once per platform.
    When that look failed (the database did not answer), the product's next
    ``register_channel`` found the platform looked at already: the earlier life's reply
    was not sent until the runtime started again (on SQLite no tick looks again)."""
    with Runtime(db=db_url, brain=booked) as rt:
        rt.social.allow("slack", ["U1"])  # no channel yet: the reply is kept, unsent
        rt.social.ingest(dict(EVENT))
        assert rt.social.wait_idle(20)
    sent: list[str] = []
    with Runtime(db=db_url, brain=booked) as again:
        kept = again.social.channels.kept
        failures: list[str] = []
        monkeypatch.setattr(kept, "left_by_others", failing_once(
            kept.left_by_others, DatabaseFailed("the database did not answer"), failures,
            "look"))
        with pytest.raises(DatabaseFailed):
            again.social.register_channel("slack", send=lambda route, text: sent.append(text))
        again.social.register_channel("slack", send=lambda route, text: sent.append(text))
        wait_for(lambda: sent == ["Booked."], 20, "the kept reply to be sent")
        assert again.social.wait_idle(20)
    assert sent == ["Booked."]


@pytest.mark.timeout(60)
def test_a_registration_whose_look_failed_loses_no_reply_held_for_its_platform(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply whose turn ran before its platform's channel was registered waits in this
    runtime's memory. The registration handed those over before its look for an earlier
    life's replies; when that look failed, it raised with them already taken, and the
    product's next ``register_channel`` (which looks again) found none: the reply was not
    sent until the runtime started again."""
    sent: list[str] = []
    with Runtime(db=db_url, brain=booked) as rt:
        rt.social.allow("slack", ["U1"])  # no channel yet: the reply waits for one
        rt.social.ingest(dict(EVENT))
        assert rt.social.wait_idle(20)
        kept = rt.social.channels.kept
        failures: list[str] = []
        monkeypatch.setattr(kept, "left_by_others", failing_once(
            kept.left_by_others, DatabaseFailed("the database did not answer"), failures,
            "look"))
        with pytest.raises(DatabaseFailed):
            rt.social.register_channel("slack", send=lambda route, text: sent.append(text))
        rt.social.register_channel("slack", send=lambda route, text: sent.append(text))
        wait_for(lambda: sent == ["Booked."], 20, "the held reply to be sent")
        assert rt.social.wait_idle(20)
    assert sent == ["Booked."]
