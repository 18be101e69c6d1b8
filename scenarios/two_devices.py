"""two_devices: a phone and a laptop are paired; the laptop drops off the network and returns.

The phone's Assistant session sends the laptop three messages over the peer
link, each acknowledged before the next goes; the laptop's brain answers each in
its ``suzent:<phone>`` session.
Then the laptop goes offline. Two more messages are committed on the phone
at once (``agent_send`` never waits for the network) and retried with the
peer backoff (2 s, 4 s, ...) on the scenario clock; when the laptop is back
they are delivered, in order, exactly once. Expected: five messages
delivered (note 4 after three failed attempts, note 5, queued behind it, after
two), five
rows on the laptop, and ``agent_read("peer:<laptop>")`` showing the whole
conversation in order. Pairing is once per pair of databases: a database an
earlier run paired is refused (exit 2) before it runs, as for ``focal_day``.
"""

import hashlib
import shutil
import tempfile
import threading
import time

import uvicorn

from kinbox.actors import Runtime, Turn
from kinbox.actors.peers import new_invite
from kinbox.actors.runtime import resolve_data_dir
from kinbox.actors.scenario import Scenario
from kinbox.actors.serve import app_for
from kinbox.transport import key_file
from kinbox.transport.identity import DeviceIdentity

ONCE_PER_DATABASE = "pairing"  # a database holding an earlier run's pairing is refused


def wait(condition, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for the other device (real sockets): poll with a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.01)


class Laptop:
    """The second device: its own runtime and database, served on a fixed port."""

    def __init__(self, sc: Scenario, url: str) -> None:
        self.rt = Runtime(db=url, clock=sc.clock, brain=self.brain).start()
        self.port = 0
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @staticmethod
    def brain(turn: Turn) -> None:
        for m in turn.messages:
            turn.reply(f"laptop got: {m.content}")

    def online(self) -> None:
        config = uvicorn.Config(app_for(self.rt), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait(lambda: self.server is not None and self.server.started, "the laptop to listen")
        if not self.port:
            self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def offline(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(10)


def seeded_key(sc: Scenario, url: str, name: str) -> None:
    """Give a device a key derived from the seed, so the report is the same run after run."""
    seed = hashlib.sha256(f"{sc.seed}:{name}".encode()).digest()
    directory = resolve_data_dir(url)
    if not (directory / key_file.KEY_FILE_NAME).exists():
        key_file.install(directory, DeviceIdentity.from_seed(seed))


def laptop_url_for(phone_url: str) -> tuple[str, str | None]:
    """The laptop is another device: an embedded database of its own, in a folder beside
    the phone's file (not beside the file itself: the files folder, and the device key in
    it, is one per folder of SQLite files, so the two devices had one key), or in a fresh
    folder when the phone is on a server database (the folder is returned too, for the run
    to remove at its end; None beside a file)."""
    if phone_url.startswith("sqlite:///") and phone_url.endswith(".db"):
        return phone_url[:-3] + "-laptop/laptop.db", None
    folder = tempfile.mkdtemp(prefix="kinbox-laptop-")
    return f"sqlite:///{folder}/laptop.db", folder


def run(sc: Scenario) -> None:
    laptop_url, folder = laptop_url_for(sc.db_url)
    try:
        _run(sc, laptop_url)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _run(sc: Scenario, laptop_url: str) -> None:
    seeded_key(sc, sc.db_url, "phone")
    seeded_key(sc, laptop_url, "laptop")
    phone = sc.start()
    # The link reports acks and retries as events after their commits: the script waits
    # for the events (recorded by then on the timeline), not the rows, so the report is
    # the same run after run.
    heard: dict[str, int] = {"peer_acked": 0, "peer_retry": 0}

    def count(event: str, data: dict[str, object]) -> None:
        if event in heard:
            heard[event] += 1

    phone.subscribe(count)
    laptop = Laptop(sc, laptop_url)
    try:
        laptop.online()
        code = new_invite(laptop.rt.peers.identity, laptop.rt.peers.peers,
                          frozenset({"agent"}), 600, sc.clock.now())
        device = phone.peers.pair(f"http://127.0.0.1:{laptop.port}", code, name="laptop")
        peer = f"peer:{device.device_id}"
        sc.note(f"paired with the laptop as {peer}")
        sc.expect(device.device_id != phone.peers.identity.device_id,
                  "the laptop is a device of its own (its own key)")
        assistant = phone.create_session(phone.project("default").id, "Assistant")
        tools = phone.tools_for(assistant.id)
        # One at a time: the link may deliver a note before the next is sent, or after,
        # as the threads happen to run; the report would tell the two apart.
        for n in (1, 2, 3):
            tools.agent_send(peer, f"note {n}")
            wait(lambda n=n: heard["peer_acked"] == n, f"the ack of note {n}")

        sc.note("the laptop goes offline")
        laptop.offline()
        journal = phone.context.journal
        fourth = tools.agent_send(peer, "note 4")["message_id"]
        wait(lambda: journal.get(fourth)["attempts"] == 1 and heard["peer_retry"] == 1,
             "the first failed attempt")
        fifth = tools.agent_send(peer, "note 5")["message_id"]  # queued behind note 4
        retries = 1
        for attempt, delay in ((1, 2), (2, 4), (3, 8)):
            wait(lambda a=attempt, r=retries: journal.get(fourth)["attempts"] == a
                 and journal.get(fifth)["attempts"] == a - 1 and heard["peer_retry"] == r,
                 f"attempt {attempt}")
            retries += 2  # the next round fails note 4 and note 5 once each
            if attempt == 3:
                sc.note("the laptop is back")
                laptop.online()
            sc.advance(delay)
        wait(lambda: heard["peer_acked"] == 5, "every ack")
        wait(lambda: laptop.rt.is_idle(), "the laptop's turns")

        rows = sc.inbox()  # this run's rows: earlier runs on a shared --db hold others
        sc.expect([r["status"] for r in rows] == ["delivered"] * 5, "all five delivered")
        sc.expect([r["attempts"] for r in rows] == [0, 0, 0, 3, 2],
                  "note 4 failed three attempts; note 5 waited behind it and failed two",
                  repr([r["attempts"] for r in rows]))
        me = phone.peers.identity.device_id
        received = [r["content"] for r in laptop.rt.inbox() if r["sender_chat_id"] == f"peer:{me}"]
        sc.expect(received == [f"note {n}" for n in range(1, 6)],
                  "the laptop holds each message once, in order", repr(received))
        transcript = tools.agent_read(peer)["transcript"]
        sc.expect(transcript.index("note 3") < transcript.index("laptop got: note 4")
                  < transcript.index("laptop got: note 5"),
                  "agent_read on the peer shows the conversation in order")
    finally:
        if laptop.server is not None and laptop.server.started and not laptop.server.should_exit:
            laptop.offline()
        laptop.rt.stop()
