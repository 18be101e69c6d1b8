"""The peer service: this runtime's device identity, its links, and its peer endpoint.

The composition of the peers feature (SPEC §8) inside one runtime:

- sending: ``agent_send("peer:<id>")`` queues a ``suzent_peer`` row and wakes
  that device's :class:`~.peer_link.PeerLink` (one per outbound device,
  started for every paired device at start, so a restart rehydrates);
- receiving: :class:`~.peer_backend.PeerHttpBackend`, what the websocket endpoint
  calls, built on this service (its identity, its store);
- pairing, ``agent_read``/``agent_stop`` on ``peer:<id>`` (one-shot links)
  and the ``agent_list`` entries of paired devices.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from ..persistence import (
    NewMessage,
    PersistenceError,
    WriterClosed,
)
from ..persistence.peer_outbox import PeerOutbox
from ..persistence.peers import OUTBOUND, DeviceRecord, PeerStore
from ..transport import frames as wire
from ..transport import key_file, receiver
from ..transport.errors import (
    FrameError,
    HandshakeRefused,
    IdentityError,
    PeerBusy,
    PeerUnavailable,
    TransportError,
)
from ..transport.grants import Refusal
from ..transport.handshake import NONCE_BYTES, new_nonce
from ..transport.identity import SEAL_NONCE_BYTES, DeviceIdentity
from ..transport.invite_code import is_code, is_old_code, new_code, parse_code
from ..transport.link import (
    BUSY_REASONS,
    Acked,
    Answer,
    LinkState,
    Retry,
    SenderLink,
    Terminal,
    busy_wait,
)
from ..transport.peer_address import address_problem
from ..transport.peer_client import connect_link, endpoint, pair_with
from .context import RuntimeContext
from .errors import ConfigError, PairingFailed, ToolError
from .ids import short
from .outbox import Writes
from .peer_link import PeerLink, peer_target
from .validation import SEND_LIMIT, require_message

log = logging.getLogger("kinbox.peers")

PEER_PREFIX = "peer:"
URL_LIMIT = 1024
"""Characters in a paired device's address (its column)."""
REQUEST_TIMEOUT = 10.0
"""Seconds an ``agent_read``/``agent_stop`` on a peer may take from the open socket to its
answer, whatever else the peer sends meanwhile (pings, frames of no interest): one
deadline for the exchange, not one per frame, or a chatty peer holds the calling turn."""

SPENT_CODE = (
    "the other device refused the pairing code (expired_invite): it was used by another "
    "device, withdrawn or expired there, or never issued (a device does not say which); "
    "ask that device for a new one: kinbox peers invite"
)
"""What a code the other device will not redeem is told as: it answers alike for a code
used, withdrawn, expired or never issued, so that trying codes there learns nothing."""

OLD_CODE = (
    "that pairing code was made by an earlier kinbox (kbp_ and 43 characters): such codes "
    "were sent as they are, readable on the way, and pair nothing any more; ask the other "
    "device for a new one (kinbox peers invite, after updating kinbox there)"
)
"""What a code of the first format is told as, before anything is dialled."""

NOT_THE_DEVICE = (
    "the pairing did not complete ({detail}): the address is not the device that made the "
    "code, or something between the two devices (a relay, a proxy) changed what they said. "
    "Nothing it saw lets it pair, and the code is still good for this device: check the "
    "address (kinbox peers whoami there shows the device id the code begins with) and run "
    "the same command again"
)
"""What a pairing is told as when the code's device did not answer, or its answer or the
request was changed on the way: the refusals no one learns the code from (see
``transport.handshake``)."""

UNREACHABLE = (
    "the pairing did not complete ({detail}): the other device must be running `kinbox "
    "serve` at that address (check the host and port it printed); the code is still good "
    "for this device: run the same command again once it answers"
)
"""What a pairing is told as when the device could not be reached, or asked to be tried
later: the error alone (``ConnectionRefusedError``) told a first user nothing to do."""

BUSY = (
    "the pairing did not complete ({detail}): the other device is up, running `kinbox "
    "serve` at that address, but it is {why}; {code}: try the same command again in "
    "{wait:g} s"
)
"""What a pairing is told as when the device answered that it is busy (``503 busy``) or
refuses this address for a while (``429 too_many_tries``), ``why`` from
:data:`~kinbox.transport.link.BUSY_REASONS` and ``code`` from :data:`BUSY_CODE`:
:data:`UNREACHABLE` sent a user to check a server that was running."""

BUSY_CODE = {
    Refusal.BUSY.value: "the code is still good for this device",
    Refusal.TOO_MANY_TRIES.value: "the code was not read, so it is as good as it was (a "
    "wrong or spent code stays refused)",
}
"""What a busy answer says of the code, by its refusal's code: a busy device had a good
code's pairing waiting for a slot; one refusing this address never looked at it, and the
tries that locked it out may have been this very code."""

TAMPERED = frozenset({Refusal.WRONG_DEVICE, Refusal.BAD_SIGNATURE})

DEVICE_SCAN_SECONDS = 1.0
"""How often a delivering runtime looks for outbound devices it has no link for: one
paired by another process since its start (``kinbox peers pair``), whose rows another
process (a send-only ``kinbox serve``) queues. Their rows are mailboxes only a link reads.
"""

STOP_SECONDS = 5.0
"""How long a stop waits for all the links together to close and hand their rows back (a
close waits up to 2 s for a peer's answer; the links close at once, not in turn)."""


def is_peer_target(agent_id: str) -> bool:
    """Is this an address of a paired device?"""
    return agent_id.startswith(PEER_PREFIX)


def device_identity(data_dir: Path) -> DeviceIdentity:
    """This device's key from ``data_dir`` (made on first use); an unusable key file is a
    :class:`ConfigError` naming ``data_dir``, for a runtime's start as for the CLI."""
    try:
        return key_file.load_or_create(data_dir)
    except IdentityError as exc:
        raise ConfigError(str(exc), field="data_dir") from exc


class PeerService:
    """Peers of one started runtime."""

    def __init__(self, ctx: RuntimeContext, data_dir: Path, *, delivering: bool = True) -> None:
        self.ctx = ctx
        self.delivering = delivering
        """False in a send-only runtime: it receives and queues, but runs no outbound link
        (the delivering process's link sends the rows)."""
        self.data_dir = data_dir
        self.identity = device_identity(data_dir)
        t, w = ctx.journal.t, ctx.journal.writer
        self.peers = PeerStore(t, w)
        self.outbox = PeerOutbox(t, w)
        self.links: dict[str, PeerLink] = {}
        self._lock = threading.Lock()
        self._unsubscribe: Any = None
        self._stopping = False
        """A stop has taken the links: no link starts after it (a send arriving mid-stop
        would start one no stop ends, holding its rows until their lease ran out)."""
        self._scanned = time.monotonic()
        """When :meth:`tick` last looked for devices paired since (monotonic)."""

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start a link for every outbound device (their rows are their mailboxes)."""
        with self._lock:
            self._stopping = False
        subscribe = getattr(self.ctx.clock, "subscribe", None)
        if subscribe is not None:  # an injected clock moved: backoffs may have run out
            self._unsubscribe = subscribe(self.clock_moved)
        self._link_every_device()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop every link (before the dispatcher and the writer stop), all at once under
        one deadline: each closes its own socket, which may wait up to its close timeout
        for a peer that does not answer, and hands its rows back. A link still running at
        the deadline keeps its rows until their lease runs out."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        with self._lock:
            self._stopping = True
            links, self.links = list(self.links.values()), {}
        deadline = time.monotonic() + timeout
        for link in links:
            link.begin_stop()
        late = [link.device_id for link in links
                if not link.join(max(0.0, deadline - time.monotonic()))]
        if late:
            log.warning("peer links to %s still closing %.1f s into the stop; the rows they "
                        "hold come back by lease", ", ".join(late), timeout)

    def tick(self) -> None:
        """The runtime's tick: at most each :data:`DEVICE_SCAN_SECONDS`, start a link for
        every outbound device that has none. :meth:`start` starts the links of the devices
        paired then, and a send from this runtime starts its device's; a device paired
        by another process later, with rows other processes queue for it, had no link
        here, and its rows waited for this runtime's restart. It also wakes a sleeping
        link whose device has a row due: one another process queued (nothing else tells
        this one on SQLite), or one whose lease another process's link left to run out;
        and the link of a device paused or revoked since, to fail its rows."""
        if not self.delivering or time.monotonic() - self._scanned < DEVICE_SCAN_SECONDS:
            return
        self._scanned = time.monotonic()
        try:
            self._link_every_device()
        except PersistenceError as exc:  # the next scan reads again
            log.warning("looking for newly paired devices failed: %s", type(exc).__name__)

    def _link_every_device(self) -> None:
        """A link for each outbound device (:meth:`link_for`: one already running stays),
        but a paused or revoked one's only while it has open rows (its link fails them
        and ends); a paused one resumed since gets its link back here."""
        if not self.delivering:
            return
        for rec in self.peers.devices(OUTBOUND):
            if rec.status != "active":
                with self._lock:
                    linked = rec.device_id in self.links
                if not linked and self.outbox.next_due(peer_target(rec.device_id)) is None:
                    continue
                # A sleeping link no longer reads its grant: woken, it fails what it holds
                # (the rows waiting for a backoff too) and ends.
                self.link_for(rec.device_id, wake=True)
                continue
            link = self.link_for(rec.device_id)
            if link is not None and link.asleep:
                due = self.outbox.next_due(link.target)
                if due is not None and due <= self.ctx.now():
                    link.wake()

    def let_go(self, link: PeerLink) -> bool:
        """``link`` (of a paused or revoked device, with no row left to fail) ends: False,
        keeping it, when a send woke it since its last look (it looks again)."""
        with self._lock:
            if link.woken:
                return False
            if self.links.get(link.device_id) is link:
                del self.links[link.device_id]
        return True

    def link_for(self, device_id: str, *, wake: bool = False) -> PeerLink | None:
        """The device's link, started on first use (None in a send-only runtime, or once
        the service is stopping: the device's rows wait in the journal for the next start).

        ``wake``: it looks at its rows again (a send committed some). Woken under the
        lock :meth:`let_go` takes: woken after the look-up, a link that had just found
        nothing to fail could end in between, and the rows waited for the device scan."""
        if not self.delivering:
            return None
        with self._lock:
            if self._stopping:
                return None
            link = self.links.get(device_id)
            if link is None:
                link = self.links[device_id] = PeerLink(self, device_id)
                link.start()
            if wake:
                link.wake()
        return link

    def clock_moved(self, now: float) -> None:
        """The injected clock moved: each link whose rows it can have made due looks again
        (:meth:`PeerLink.clock_moved`; under the lock, as :meth:`link_for`)."""
        with self._lock:
            for link in self.links.values():
                link.clock_moved(now)

    def random(self, n: int) -> bytes:
        """Randomness for nonces, tokens and seals."""
        return os.urandom(n)

    # -- what a device said of this one, on any link ---------------------------------------

    def refused_by(self, rec: DeviceRecord, refusal: Terminal) -> bool:
        """The device refused this one for good, signed by its pinned key: record it paused
        or revoked here, and wake its link, which fails the open rows at once. The same on
        a live link and on the one-shot link of a read or stop. False, changing nothing,
        when the device was paired again meanwhile (the refusal was of the old token)."""
        if not self.peers.close_outbound(rec.device_id, rec.token_sealed, refusal.status,
                                         refusal.reason, self.ctx.now()):
            return False
        log.warning("peer %s refused this device: %s", rec.device_id, refusal.reason)
        with self._lock:  # as link_for(wake=True), without starting one
            link = self.links.get(rec.device_id)
            if link is not None:
                link.wake()
        return True

    def unproven(self, rec: DeviceRecord, reason: str) -> None:
        """Something at the device's address refused us or answered as another device,
        unsigned: the pairing stands, the operator is told (``kinbox peers list``) when
        the database takes the note (it is left out, logged, when it does not)."""
        log.warning("peer %s: %s; retrying", rec.device_id, reason)
        self.note(rec, reason)

    def note(self, rec: DeviceRecord, text: str) -> None:
        """Show ``text`` as the device's problem in ``kinbox peers list`` (its status
        unchanged; the device's next welcomed link clears it); logged and left out when
        the database refuses it."""
        try:
            self.peers.note_problem(rec.device_id, OUTBOUND, text, self.ctx.now())
        except WriterClosed:
            raise
        except PersistenceError as exc:
            # Bookkeeping: refused, it must not keep the link from recording its rows'
            # retries (they stayed leased, the device's messages held for a whole lease).
            log.warning("noting the problem of peer %s failed: %s", rec.device_id,
                        type(exc).__name__)

    # -- pairing (the sending side) --------------------------------------------------------

    def pair(self, url: str, code: str, name: str = "") -> DeviceRecord:
        """Redeem a pairing code printed by ``kinbox peers invite`` on the other device."""
        rec = complete_pairing(self.identity, self.peers, url, code, name, self.ctx.now())
        # Woken: a link of the device paused before, letting go, looks again (now active).
        self.link_for(rec.device_id, wake=True)
        return rec

    # -- the agent tools on peer:<id> ------------------------------------------------------

    def _outbound(self, agent_id: str) -> DeviceRecord:
        rec = self.peers.device(agent_id[len(PEER_PREFIX):], OUTBOUND)
        if rec is None:
            raise ToolError("not_found",
                            f"Agent '{agent_id}' is not available in the current project.")
        return rec

    def _message(self, caller_id: str, rec: DeviceRecord, text: str,
                 session: str | None) -> NewMessage:
        message_id = f"msg-{self.ctx.new_id()}"
        try:  # the frame the link will send: refused now, not failed after the commit
            wire.encode(wire.Deliver(message_id, text, session))
        except FrameError as exc:
            raise ToolError("invalid_argument",
                            f"The message cannot travel to a peer ({exc.reason}: {exc.detail}); "
                            f"a frame holds at most {wire.MAX_FRAME_BYTES:,} bytes of JSON. "
                            "Shorten it or split it into several messages.") from None
        return NewMessage(message_id, peer_target(rec.device_id), text,
                          sender=caller_id, transport="suzent_peer",
                          destination_peer_id=rec.device_id,
                          payload={"session": session} if session else {})

    def send(self, caller_id: str, agent_id: str, text: str, session: str | None = None, *,
             writes: Writes | None = None) -> dict[str, Any]:
        """Queue ``text`` for a paired device; the link carries it."""
        return self.send_many(caller_id, agent_id, [text], session, writes=writes)[0]

    def send_many(self, caller_id: str, agent_id: str, texts: Sequence[str],
                  session: str | None = None, *,
                  writes: Writes | None = None) -> list[dict[str, Any]]:
        """Queue several messages for a paired device in one commit per 500, in order
        (with the calling turn's commit when ``writes`` holds its outbox)."""
        rec = self._outbound(agent_id)
        if session is not None and (not isinstance(session, str)
                                    or receiver.SESSION_NAME.fullmatch(session) is None):
            # The receiver's rule, checked here: refused after a round trip, the rows fail.
            raise ToolError("invalid_argument", "session must be 1 to 64 letters, digits, "
                            f"'_' or '-', got {session!r}.")
        out = writes if writes is not None else Writes(self.ctx, None)
        # The agent_send rules (rt.post's too): a blank text passed the frame's own check,
        # was committed, and failed at the receiver after a round trip.
        msgs = [self._message(caller_id, rec, require_message(t, SEND_LIMIT), session)
                for t in texts]

        def wake_link() -> None:
            self.link_for(rec.device_id, wake=True)
        results = []
        for first in range(0, len(msgs), 500):
            results += out.send(msgs[first:first + 500], after=wake_link)
        return [{"message_id": r.message_id, "agent_id": agent_id, "status": r.status}
                for r in results]

    def request(self, agent_id: str, action: str) -> wire.Result:
        """Run a ``read`` or ``stop`` of the peer's dedicated session over a one-shot link."""
        rec = self._outbound(agent_id)
        if rec.status != "active":
            raise ToolError("execution_failed", f"Peer '{agent_id}' is {rec.status}.")
        try:
            token = self.identity.unseal(rec.token_sealed or "")
        except IdentityError:
            raise ToolError("execution_failed", f"Peer '{agent_id}' was paired by another "
                            "device key than this process's; ask a process that has it."
                            ) from None
        link = SenderLink(self.identity, rec.device_id, rec.public_key, token, 1)
        # The rows waiting for a retry may have reached the device with their acks lost:
        # named, a refusal says which it committed (delivered, not failed with the rest).
        named = wire.in_flight_header(self.outbox.waiting(peer_target(rec.device_id),
                                                          wire.IN_FLIGHT_LIMIT))
        try:
            with connect_link(rec.url or "", token, in_flight=named) as ws:
                return self._exchange(ws, link, rec, agent_id, action, named)
        except PeerBusy as exc:  # up, asks to be tried later: nothing to tell the operator
            wait = busy_wait(exc.retry_after)
            why = BUSY_REASONS.get(exc.reason, exc.reason)
            raise ToolError("execution_failed", f"Peer '{agent_id}' is {why}; try again in "
                            f"{wait:g} s.", retry_after=wait) from None
        except PeerUnavailable as exc:
            if exc.status is not None:  # an HTTP refusal: unproven, as on a live link
                self.unproven(rec, f"the peer's address refused the connection ({exc.reason})")
            raise ToolError("execution_failed",
                            f"Peer '{agent_id}' cannot be reached ({exc.reason}).") from None
        except (TimeoutError, ConnectionClosed):
            raise ToolError("execution_failed", f"Peer '{agent_id}' did not answer.") from None

    def _exchange(self, ws: ClientConnection, link: SenderLink, rec: DeviceRecord,
                  agent_id: str, action: str, named: tuple[str, ...]) -> wire.Result:
        link.connected(new_nonce(self.random(NONCE_BYTES)), named)
        req = short(self.ctx.new_id(), 16)
        deadline = time.monotonic() + REQUEST_TIMEOUT
        sent = False
        why = "it refused the request"
        while True:
            for text in link.frames_to_send():
                ws.send(text)
            for e in link.effects():
                if isinstance(e, Answer) and e.frame.req == req:
                    return e.frame
                if isinstance(e, Acked):  # before its refusal fails the device's rows
                    self._committed_there(rec, e.ids)
                if isinstance(e, Retry | Terminal):
                    why = e.reason
                # What the device says of this one counts on any link: a signed refusal
                # closes it here (no later call dials it again), an unproven one is noted.
                if isinstance(e, Terminal):
                    self.refused_by(rec, e)
                elif isinstance(e, Retry) and e.unproven:
                    self.unproven(rec, e.reason)
            if link.state in (LinkState.IDLE, LinkState.CLOSED):
                raise ToolError("execution_failed", f"Peer '{agent_id}': {why}.")
            if link.state is LinkState.OPEN and not sent:
                link.request(wire.Read(req) if action == "read" else wire.Stop(req))
                sent = True
                continue
            left = deadline - time.monotonic()
            try:
                data = ws.recv(left) if left > 0 else None
            except TimeoutError:
                data = None
            if data is None:
                raise ToolError("execution_failed", f"Peer '{agent_id}' did not answer within "
                                f"{REQUEST_TIMEOUT:g} s.")
            link.receive(data)

    def _committed_there(self, rec: DeviceRecord, ids: Sequence[str]) -> None:
        """The device's signed refusal says it committed these waiting rows: delivered. A
        database that refuses leaves them to fail with the rest, as before."""
        try:
            done = self.outbox.ack_waiting(ids, self.ctx.now())
        except WriterClosed:
            raise
        except PersistenceError as exc:
            log.warning("acknowledging %d rows peer %s committed failed: %s", len(ids),
                        rec.device_id, type(exc).__name__)
            return
        for mid in done:
            self.ctx.emit("peer_acked", message_id=mid, device_id=rec.device_id)

    def listing(self, active_only: bool) -> list[dict[str, Any]]:
        """``agent_list`` records of paired devices: ``ready`` or ``paused`` (T1)."""
        out = []
        for rec in self.peers.devices(OUTBOUND):
            if rec.status == "revoked" or (active_only and rec.status != "active"):
                continue
            out.append({"agent_id": peer_target(rec.device_id), "title": rec.name,
                        "kind": "remote", "status": "ready" if rec.status == "active"
                        else "paused", "project_id": None, "parent_agent_id": None,
                        "updated_at": rec.last_seen_at or rec.updated_at})
        return out


def complete_pairing(identity: DeviceIdentity, peers: PeerStore, url: str, code: str,
                     name: str, now: float) -> DeviceRecord:
    """Pair with the device at ``url``: prove our key, pin theirs, keep the token sealed.

    The name and the address are checked first: the other device spends the code (and
    replaces an earlier grant of ours) as it answers, so nothing may fail after that."""
    if not wire.is_device_name(name):  # the pair frame's own rule
        raise ConfigError(f"a device name is at most {wire.DEVICE_NAME_LIMIT} printable "
                          "characters", field="name")
    if is_old_code(code):
        raise ConfigError(OLD_CODE, field="code")
    if not is_code(code):  # a typo, not a network problem
        raise ConfigError("that is not a pairing code: codes are what `kinbox peers invite` "
                          "printed on the other device (kbp2_, the device's 32 hex "
                          "characters, _ and 43 more characters)", field="code")
    if not isinstance(url, str) or not url or len(url) > URL_LIMIT or not url.isprintable():
        raise ConfigError(f"the device's address is 1 to {URL_LIMIT} printable characters",
                          field="url")
    # A typo, not a network problem: refused as the name and the code are. Stored and
    # listed as given, the address must mean one thing to every URL parser.
    problem = address_problem(url)
    if problem is not None:
        raise ConfigError("the device's address is http(s)://host:port with at most a "
                          f"path, read alike by every URL parser; it has {problem}",
                          field="url")
    try:
        endpoint(url, "/peers/pair")
    except ValueError as exc:
        raise ConfigError(str(exc), field="url") from None
    invite = parse_code(code)
    held = peers.device(invite.device_id, OUTBOUND)
    if held is not None and not invite.names(held.public_key):
        # The id is 48 bits of the key's hash: a key can be ground to match it. Pairing
        # replaced the earlier device's grant, and its messages went to this one.
        raise ConfigError(f"that code names device {invite.device_id}, which is paired here "
                          "with another key (kinbox peers list): a device that made its key "
                          "match that id would receive every message for "
                          f"peer:{invite.device_id}; nothing was sent", field="code")
    try:
        paired = pair_with(url, identity, invite, identity.device_id,
                           new_nonce(os.urandom(NONCE_BYTES)))
    except PeerBusy as exc:  # up: nothing about the address is wrong
        message = BUSY.format(detail=exc, why=BUSY_REASONS.get(exc.reason, exc.reason),
                              code=BUSY_CODE.get(exc.reason, BUSY_CODE[Refusal.BUSY.value]),
                              wait=busy_wait(exc.retry_after))
        raise PairingFailed(message, "unavailable", retry=True, status=exc.status) from exc
    except PeerUnavailable as exc:
        raise PairingFailed(UNREACHABLE.format(detail=exc), "unavailable", retry=True,
                            status=exc.status) from exc
    except HandshakeRefused as exc:
        # A refusal names its code; whatever else answered wrote free text (kept in the
        # message, escaped), which no caller should branch on.
        known = exc.reason in Refusal.__members__.values()
        if exc.reason in TAMPERED:  # the code is unspent, or answered again for our key
            raise PairingFailed(NOT_THE_DEVICE.format(detail=exc), exc.reason,
                                retry=True) from exc
        message = SPENT_CODE if exc.reason == Refusal.EXPIRED_INVITE else str(exc)
        raise PairingFailed(message, exc.reason if known else "refused", retry=False) from exc
    except TransportError as exc:  # an answer that broke the protocol
        raise PairingFailed(str(exc), "malformed", retry=False) from exc
    sealed = identity.seal(paired.token, os.urandom(SEAL_NONCE_BYTES))
    return peers.save_outbound(paired.device_id, name or paired.device_id, paired.public_key,
                               url, sealed, frozenset({"agent"}), now)


def new_invite(identity: DeviceIdentity, peers: PeerStore, scopes: frozenset[str],
               ttl: float, now: float) -> str:
    """Store a one-time pairing code for this device (only the hash of the invite key its
    secret seeds, see ``transport.invite_code``) and return the code."""
    code = new_code(identity.public_key, os.urandom(32))
    peers.add_invite(parse_code(code).invite_hash, scopes, now, now + ttl)
    return code
