"""The peer-link actor: one thread per paired device, whose mailbox is its outbound rows.

The rows addressed to ``peer:<device_id>`` (transport ``suzent_peer``) are
the mailbox (SPEC I7): the dispatcher never claims them; this actor leases a
window of them (:class:`~kinbox.persistence.PeerOutbox`), opens the link,
and feeds the socket and the :class:`~kinbox.transport.SenderLink` core
into each other; :class:`~.peer_effects.LinkEffects` carries out the
core's effects on the journal: ``ack`` after the receiver's ack (which it
sends only after its own commit), a retry with the peer backoff when the
link drops or cannot open, ``failed`` at once for a rejected payload or a
refusing device (but ``delivered`` for the rows its refusal says it committed: their
acks a lost link did not bring back), a release (no attempt counted) of what it holds when it
stops. After a restart it simply finds its rows again. No rule lives here.

A link with no row due sleeps without touching the database until something can have
given it work (:meth:`PeerLink._idle_wait`): a send to the device committed here wakes it
(after the commit), its head row's due time comes (a retry's backoff, a lease running
out: on an injected clock, when the clock reaches it), or the device scan
(:meth:`~.peers.PeerService.tick`) finds a due row another process queued. It claimed
once a second before, for every paired device, for as long as the runtime ran.

The link of a paused or revoked device ends once it has failed the device's rows
(:meth:`~.peers.PeerService.let_go`): a send, rows another process queued or a resume
(the device scan finds those) start one again.

Paused or revoked on this side (``kinbox peers pause|revoke --direction
outbound``), a live link sends nothing more but waits up to
:data:`DRAIN_SECONDS` for the acks of the frames already sent: the receiver
may have committed them, and a row it committed ends ``delivered``, not
failed. Whatever is still unanswered then, and every row not yet sent, fails
with the grant's status (paused or revoked alike, as new sends to it do); a
row failed so may have arrived after all, and a requeue once the grant is
active again is harmless, since the receiver dedupes by message id.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from ..persistence import ClaimedRow, PersistenceError, WindowClaim, WriterClosed
from ..persistence.peers import OUTBOUND, DeviceRecord
from ..persistence.writer import Reply
from ..transport import frames as wire
from ..transport import key_file
from ..transport.errors import IdentityError, PeerBusy, PeerUnavailable
from ..transport.handshake import NONCE_BYTES, new_nonce
from ..transport.link import LinkState, Outgoing, SenderLink
from ..transport.peer_client import connect_link
from .peer_effects import LinkEffects, PendingAcks

if TYPE_CHECKING:
    from .peers import PeerService

log = logging.getLogger("kinbox.peers")

WINDOW = 64
"""Unacknowledged ``deliver`` frames per link."""

LINGER_SECONDS = 5.0
"""How long an open link with nothing to carry stays open for the next message."""
DRY_POLL_SECONDS = 1.0
"""How often an open link whose claims found nothing looks again unwoken (for at most
:data:`LINGER_SECONDS`; closed, it sleeps until woken)."""
DUE_RECHECK_SECONDS = 0.02
"""How soon an idle link whose head is due but whose claim took nothing (another claim of
the device held its lock) claims again: soon, not at the writer's speed."""
GRANT_CHECK_SECONDS = 1.0
"""How often a live link reads whether its grant here is still active."""
DRAIN_SECONDS = 5.0
"""How long a live link whose grant here closed waits for the acks of the frames it sent."""

HANDSHAKE_SECONDS = 10.0
"""How long a peer may take from the upgrade to its welcome. A server that accepts the
socket and then says nothing (or a link that goes silent mid-handshake while its pings
are still answered) would otherwise hold the rows it carries, their leases renewed,
forever; past this the link is lost and its rows go back with a retry."""


def peer_target(device_id: str) -> str:
    """The inbox address of a paired device."""
    return f"peer:{device_id}"


class PeerLink:
    """Carries one device's outbound rows over a websocket link."""

    def __init__(self, svc: PeerService, device_id: str, window: int = WINDOW) -> None:
        self.svc = svc
        self.device_id = device_id
        self.target = peer_target(device_id)
        self.window = window
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kinbox-peer-{device_id}",
                                        daemon=True)
        self.ws: ClientConnection | None = None
        self.effects = LinkEffects(svc, device_id)
        self._unsealable: str | None = None
        """The sealed token this process's key could not open (said once)."""
        self._sleeping = False
        """In :meth:`_idle_wait`: set before it reads the head's due time, so that a clock
        move from then on is judged by :attr:`_due` (:meth:`clock_moved`)."""
        self._due: float | None = None
        """While sleeping, when the device's head row comes due on the runtime's clock
        (None: no open row, or not read yet)."""

    def start(self) -> None:
        """Start the link thread."""
        self._thread.start()

    def wake(self) -> None:
        """Rows may be due (a send committed, the clock moved)."""
        self._wake.set()

    def clock_moved(self, now: float) -> None:
        """The injected clock moved to ``now``: a sleeping link looks again only once its
        head row is due (each move woke every link, which claimed for nothing); any other
        looks again, as before (a live link's retries may have come due)."""
        due = self._due
        if not self._sleeping or (due is not None and due <= now):
            self._wake.set()

    @property
    def asleep(self) -> bool:
        """Idle, waiting to be woken (the device scan looks for rows due for it)."""
        return self._sleeping

    @property
    def woken(self) -> bool:
        """Woken since the link last looked at its rows."""
        return self._wake.is_set()

    def begin_stop(self) -> None:
        """Ask the link to stop, without waiting: its thread leaves the link within a
        read's wait (0.2 s at most) and closes the socket itself, which waits for the
        peer's answer up to the close timeout (2 s), then hands its rows back. Several
        links stopping together so close at once (:meth:`PeerService.stop`), not each
        after the one before. The rows it holds go back unrun (no attempt counted); rows
        it could not hand back (the writer closed first) come back when their lease
        expires."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the stopped link's thread to end; True once it has
        (or when called from that thread, which cannot wait for itself)."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._step():
                    return
            except WriterClosed:
                return
            except Exception:
                log.exception("peer link to %s failed; carrying on", self.device_id)
                self._stop.wait(1.0)

    def _idle_wait(self) -> None:
        """Sleep until woken or the device's head row is due, reading the database once.

        The wake is cleared only after the sleep, before the next claim: a send that
        commits after the claim that found nothing (its wake set after its commit) cuts
        the sleep short, however the two interleave. Timed out on the wall clock, the link
        asks the runtime's clock whether the head is due before it claims (an injected
        clock that did not move leaves it asleep: :meth:`clock_moved` wakes it)."""
        ctx = self.svc.ctx
        self._due, self._sleeping = None, True
        try:
            due = self._due = self.svc.outbox.next_due(self.target)
            while not self._wake.is_set():
                left = None if due is None else due - ctx.now()
                if left is not None and left <= 0:
                    self._wake.wait(DUE_RECHECK_SECONDS)
                    return
                self._wake.wait(left)
        finally:
            self._sleeping, self._due = False, None
            self._wake.clear()

    def _claim(self, after_seq: int, limit: int, waiting_too: bool = False) -> list[ClaimedRow]:
        ctx = self.svc.ctx
        return self._claimed(self.svc.outbox.submit_claim(
            ctx.owner, self.target, after_seq, ctx.now(), lease=ctx.lease_seconds,
            limit=limit, waiting_too=waiting_too).result(30))

    def _claimed(self, window: WindowClaim) -> list[ClaimedRow]:
        """The rows a claim leased, once the takeovers it counted are announced (as the
        failures a link reports are: the dead link could not)."""
        for t in window.taken_over:
            self.effects.announce(t.message_id, t.failed, t.attempts, t.error, taken_over=True)
        return window.rows

    def _step(self) -> bool:
        """One look at the device's rows; False once the link ends (paused or revoked,
        nothing left to fail)."""
        rec = self.svc.peers.device(self.device_id, OUTBOUND)
        if rec is None:
            self._idle_wait()
            return True
        token = self._token(rec) if rec.status == "active" else None
        if rec.status == "active" and token is None:
            self._wake.wait(5.0)  # not this process's rows: look again if it pairs anew
            self._wake.clear()
            return True
        closed = token is None  # paused or revoked
        if closed:  # a send committed after this claim's read wakes the link again
            self._wake.clear()
        # Paused or revoked (here, or by the device's signed refusal): every open row fails
        # now, those waiting for a backoff too (they stayed queued up to an hour).
        rows = self._claim(0, self.window, waiting_too=closed)
        if not rows:
            # Nothing to fail, and nothing to poll for: a revoked grant is never active
            # again (pairing anew makes a new one), and a resume of a paused one is found
            # by the device scan, which starts a link again, as a later send does (the scan
            # finds another process's). One woken meanwhile looks once more.
            if closed and self.svc.let_go(self):
                return False
            self._idle_wait()
            return True
        if token is None:  # the device is paused or revoked: its rows fail at once
            reason = rec.last_error or f"peer device {self.device_id} is {rec.status}"
            recorded = [self.effects.retry(row.message_id, reason, permanent=True)
                        for row in rows]
            if not all(recorded):
                # A row whose failure was refused went back for its backoff, and this
                # claim takes rows waiting for one: asked again at once, it looped at
                # the writer's speed for as long as the database refused the record.
                self._idle_wait()
            return True
        self._session(rec, rows, token)
        return True

    def _token(self, rec: DeviceRecord) -> str | None:
        """The device's bearer token; None when this process's device key did not seal it.

        Processes sharing a database each load the key of their own data folder. One
        without the key that paired cannot speak for this device (the peer pinned that
        key): it leaves the rows alone, for a process that has it, and says so once."""
        try:
            return self.svc.identity.unseal(rec.token_sealed or "")
        except IdentityError:
            if self._unsealable != rec.token_sealed:
                self._unsealable = rec.token_sealed
                log.error("peer %s was paired by another device key than this process's "
                          "(device %s, key in %s): its messages wait for a process that "
                          "has that key; give every process on this database the same "
                          "data folder (--data-dir) or a copy of its %s", self.device_id,
                          self.svc.identity.device_id, self.svc.data_dir,
                          key_file.KEY_FILE_NAME)
            return None

    def _session(self, rec: DeviceRecord, rows: list[ClaimedRow], token: str) -> None:
        svc = self.svc
        link = SenderLink(svc.identity, rec.device_id, rec.public_key, token, self.window,
                          prefetch=self.window)
        link.offer([_outgoing(r) for r in rows])
        named = link.in_flight()
        try:
            with connect_link(rec.url or "", token, in_flight=named) as ws:
                self.ws = ws
                self._carry(ws, link, rec, rows[-1].seq, named)
        except PeerUnavailable as exc:
            if self._stop.is_set():
                link.stopped()
            elif isinstance(exc, PeerBusy):  # up, and asks to be tried later: no failure
                link.busy(exc.retry_after, exc.reason)
            elif exc.status is not None:
                link.refused(exc.reason)
            else:
                link.connection_lost(str(exc))
            self.effects.settle_now(self.effects.apply(link.effects(), rec))
        except ConnectionClosed as exc:
            if self._stop.is_set():  # closed by stop(): no lost link, nothing failed
                link.stopped()
            else:
                link.connection_lost(f"the link closed ({exc.rcvd.code if exc.rcvd else 'no'}"
                                     " close frame)")
            self.effects.settle_now(self.effects.apply(link.effects(), rec))
        finally:
            self.ws = None
            link.stopped()  # what it still holds (a stop, an ended drain) goes back unrun
            self.effects.settle_now(self.effects.apply(link.effects(), rec))

    def _carry(self, ws: ClientConnection, link: SenderLink, rec: DeviceRecord,
               last_seq: int, named: tuple[str, ...]) -> None:
        """Move frames until the link ends, idles out, or the actor stops.

        Acks and claims are submitted to the writer without waiting: the loop
        keeps reading acks and sending frames while the last round commits
        (one claim outstanding at a time, so journal order holds).
        """
        ctx = self.svc.ctx
        renewed = time.monotonic()
        dry_since: float | None = None  # since when claims find nothing to send
        claimed_at = 0.0
        checked = time.monotonic()
        claim: Reply[WindowClaim] | None = None
        stale = False  # acks were submitted after the outstanding claim
        acks: PendingAcks = []
        link.connected(new_nonce(self.svc.random(NONCE_BYTES)), named)
        handshake_ends = time.monotonic() + HANDSHAKE_SECONDS
        drain_ends: float | None = None  # set once the grant here closed
        opened = False
        try:
            while not self._stop.is_set():
                for text in link.frames_to_send():
                    ws.send(text)
                acked = self.effects.apply(link.effects(), rec)
                if acked:
                    acks.append((self.svc.outbox.submit_ack(ctx.owner, acked, ctx.now()), acked))
                    # The next claim may find rows now: a suspect row goes alone, and the
                    # rows behind it wait for its ack (a claim after it in the writer sees
                    # it; one submitted before may not, and its empty answer is stale).
                    dry_since, stale = None, claim is not None
                acks = self.effects.settled(acks, wait=False)
                if link.state in (LinkState.IDLE, LinkState.CLOSED):
                    return
                if not opened and link.state is LinkState.OPEN:  # the peer proved its key
                    opened = True
                    self.effects.opened()
                if link.state is LinkState.HANDSHAKE and time.monotonic() > handshake_ends:
                    link.connection_lost(f"the peer did not finish the handshake within "
                                         f"{HANDSHAKE_SECONDS:g} s")
                    continue  # its effects (the rows back, with a retry) come first
                if claim is not None and claim.done():
                    more, claim = self._claimed(claim.result()), None
                    if more:
                        dry_since, last_seq, stale = None, more[-1].seq, False
                        link.offer([_outgoing(r) for r in more])
                        continue
                    if not stale:
                        dry_since = dry_since or time.monotonic()
                    stale = False
                now = time.monotonic()
                if drain_ends is None and now - checked >= GRANT_CHECK_SECONDS:
                    checked = now
                    if not self._still_active():
                        link.drain()
                        drain_ends = now + DRAIN_SECONDS
                if drain_ends is not None and (link.state is not LinkState.OPEN
                                               or link.drained() or now > drain_ends):
                    return  # what it holds goes back; _step fails it as paused/revoked
                room = link.capacity() if link.state is LinkState.OPEN else 0
                # Dry: claim again when a send wakes the link, or once a DRY_POLL_SECONDS
                # (a retry coming due), not as fast as the writer answers.
                may_claim = (dry_since is None or self._wake.is_set()
                             or now - claimed_at >= DRY_POLL_SECONDS)
                if claim is None and may_claim and (
                        room >= self.window // 2 or (room and not link.held())):
                    self._wake.clear()
                    claimed_at = now
                    claim = self.svc.outbox.submit_claim(ctx.owner, self.target, last_seq,
                                                         ctx.now(), lease=ctx.lease_seconds,
                                                         limit=room)
                if (dry_since is not None and claim is None and not link.held() and not acks
                        and now - dry_since > LINGER_SECONDS):
                    return
                if time.monotonic() - renewed > ctx.lease_seconds / 3:
                    renewed = time.monotonic()
                    ctx.journal.renew(ctx.owner, [self.target], ctx.now() + ctx.lease_seconds,
                                      ctx.now())
                busy = claim is not None or bool(acks)
                self._receive(ws, link, 0.002 if busy else 0.05 if link.held() else 0.2)
        except ConnectionClosed:
            # A send can find the link closed by the peer with frames still unread: the
            # acks of rows it committed and the refusal it sent before closing (its grant
            # closed). They settle those rows, not the lost link's retry (a row retried
            # after its commit failed at the next handshake's refusal: delivered, failed).
            _read_arrived(ws, link)
            raise
        finally:
            self.effects.settled(acks, wait=True)
            if claim is not None:  # leased, never offered: hand back unrun
                try:
                    rows = self._claimed(claim.result(30))
                except PersistenceError:
                    rows = []
                if rows:
                    self.effects.release([r.message_id for r in rows])

    def _still_active(self) -> bool:
        """Is this device's grant here still active? Paused or revoked on this side (``kinbox
        peers pause|revoke --direction outbound``), a live link carries nothing more."""
        rec = self.svc.peers.device(self.device_id, OUTBOUND)
        if rec is not None and rec.status == "active":
            return True
        log.info("closing the link to %s: its grant here is %s", self.device_id,
                 rec.status if rec else "gone")
        return False

    def _receive(self, ws: ClientConnection, link: SenderLink, timeout: float) -> None:
        try:
            link.receive(ws.recv(timeout))
        except TimeoutError:
            return
        _read_arrived(ws, link)


def _read_arrived(ws: ClientConnection, link: SenderLink) -> None:
    """Feed ``link`` the frames already received, while it is open (a closed socket still
    yields those it received before its close, then raises ConnectionClosed)."""
    while link.state is LinkState.OPEN:
        try:
            link.receive(ws.recv(0))
        except (TimeoutError, ConnectionClosed):
            return


def _outgoing(row: ClaimedRow) -> Outgoing:
    session = row.payload.get("session") if row.payload else None
    return Outgoing(row.message_id, row.content, session if isinstance(session, str) else None)


__all__ = ["PeerLink", "peer_target", "wire"]
