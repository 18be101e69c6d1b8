"""What a peer link's events do to the journal: its sender core's effects carried out.

:class:`~kinbox.transport.SenderLink` decides (pure); :class:`~.peer_link.PeerLink` moves
frames; this carries out, row by row, what the core decided about the rows a link holds:
acks committed (and announced once durable), retries with the peer backoff and permanent
failures through the journal's retry (announced as ``peer_retry`` / ``peer_failed``, as
a claim's takeover of a dead link's row is), and releases, which count no attempt.
No rule lives here either.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..persistence import LeaseLost, PersistenceError, WriterClosed
from ..persistence.peers import OUTBOUND, DeviceRecord
from ..persistence.writer import Reply
from ..transport.link import (
    Acked,
    Answer,
    Effect,
    Postponed,
    Rejected,
    Released,
    Retry,
    Terminal,
)

if TYPE_CHECKING:
    from .peers import PeerService

log = logging.getLogger("kinbox.peers")

PendingAcks = list[tuple[Reply[list[str]], list[str]]]
"""Acks submitted to the writer, each with the ids it acks, not yet reported."""


class LinkEffects:
    """The journal side of one device's link."""

    def __init__(self, svc: PeerService, device_id: str) -> None:
        self.svc = svc
        self.device_id = device_id
        self._touched = 0.0

    def opened(self) -> None:
        """The peer proved its key: note the device as seen now."""
        self._touch()

    def _touch(self) -> None:
        """Note the device as seen now (``kinbox peers list``), when the database takes the
        note: it is bookkeeping, and refused, it must not end the link (it ended each one
        at its welcome, so nothing was sent for as long as the note was refused) nor skip
        the hand-back of a claim under way (its rows then waited out their lease)."""
        self._touched = time.monotonic()
        try:
            self.svc.peers.touch(self.device_id, OUTBOUND, self.svc.ctx.now())
        except WriterClosed:
            raise
        except PersistenceError as exc:
            log.warning("noting peer %s as seen failed: %s", self.device_id,
                        type(exc).__name__)

    def settled(self, acks: PendingAcks, wait: bool) -> PendingAcks:
        """Report the committed acks; return those still on their way. Rows whose ack the
        database refused go back unrun, due after a backoff (:meth:`_release_later`): sent
        again, the receiver repeats its ack."""
        ctx = self.svc.ctx
        waiting = []
        for reply, ids in acks:
            if not wait and not reply.done():
                waiting.append((reply, ids))
                continue
            try:
                lost = set(reply.result(30))
            except WriterClosed:
                raise
            except PersistenceError as exc:
                # The receiver has them; left leased, they held the device's rows for a
                # whole lease, then a takeover counted each as a dead link's attempt.
                log.warning("acks of %d peer rows to %s refused (%s): they go back to be "
                            "sent again", len(ids), self.device_id, type(exc).__name__)
                for mid in ids:
                    self._release_later(mid)
                continue
            if lost:  # another worker took them over: theirs to send and settle
                log.warning("acks of %d peer rows to %s refused: their leases were taken "
                            "over", len(lost), self.device_id)
            for mid in ids:
                if mid not in lost:
                    ctx.emit("peer_acked", message_id=mid, device_id=self.device_id)
            if time.monotonic() - self._touched > 1.0:  # "last seen", not per message
                self._touch()
        return waiting

    def settle_now(self, acked: list[str]) -> None:
        if acked:
            self.settled([(self.svc.outbox.submit_ack(self.svc.ctx.owner, acked,
                                                       self.svc.ctx.now()), acked)], wait=True)

    def apply(self, effects: list[Effect], rec: DeviceRecord) -> list[str]:
        """Carry out failures at once; return the acked ids for the caller to commit."""
        acked: list[str] = []
        for e in effects:
            if isinstance(e, Acked):
                acked.extend(e.ids)
            elif isinstance(e, Rejected):
                self.retry(e.id, e.reason, permanent=True)
            elif isinstance(e, Released):
                self.release(list(e.ids))
            elif isinstance(e, Postponed):  # busy, not failing: no attempt, no flag
                log.info("peer %s: %s; its %d rows wait %g s", self.device_id, e.reason,
                         len(e.ids), e.wait)
                self.postpone(list(e.ids), e.wait)
                # Shown, not flagged: something at the address (a proxy in front of
                # the device, all peers behind one address) may keep answering so, and
                # the rows, never failed, would wait unseen.
                self.svc.note(rec, f"{e.reason}; its messages wait, uncounted")
            elif isinstance(e, Retry):
                if e.unproven:  # a stale URL or a stranger on it: the operator should know
                    self.svc.unproven(rec, e.reason)
                for mid in e.ids:
                    self.retry(mid, e.reason, permanent=False)
            elif isinstance(e, Terminal):
                try:
                    closed = self.svc.refused_by(rec, e)
                except WriterClosed:
                    raise
                except PersistenceError as exc:
                    # Unrecorded, the refusal is heard again: the rows go back for a
                    # backoff, not left leased (the device's rows held for a lease).
                    log.warning("recording that peer %s refused this device failed (%s); "
                                "its rows go back to hear it again", self.device_id,
                                type(exc).__name__)
                    for mid in e.ids:
                        self._release_later(mid)
                    continue
                if not closed:
                    # Paired again while this link spoke with the old token: the new
                    # pairing stands, and the rows go again with it.
                    for mid in e.ids:
                        self.retry(mid, f"{e.reason} (an earlier pairing)", permanent=False)
                    continue
                for mid in e.ids:
                    self.retry(mid, e.reason, permanent=True)
            elif isinstance(e, Answer):
                pass  # read/stop answers travel on their own one-shot links (peers.request)
        return acked

    def retry(self, message_id: str, error: str, *, permanent: bool) -> bool:
        """Record a failed attempt of a row this link holds; False when the database refused
        the record (the row is then handed back for its backoff, or was taken over)."""
        ctx = self.svc.ctx
        try:
            out = ctx.journal.retry(ctx.owner, message_id, error, ctx.now(), permanent=permanent)
        except WriterClosed:
            raise
        except LeaseLost as exc:  # taken over: its new owner answers for it
            log.warning("retry of peer row %s refused: %s", message_id, exc)
            return False
        except PersistenceError as exc:
            log.warning("retry of peer row %s refused: %s", message_id, exc)
            self._release_later(message_id)
            return False
        self.announce(message_id, out.state.value == "failed", out.attempts, error)
        return True

    def _release_later(self, message_id: str) -> None:
        """Hand back a row whose failed attempt (or ack) the database would not record,
        uncounted and due after that attempt's backoff
        (:meth:`~kinbox.persistence.Journal.release_later`, as a local row's). Left
        leased, it held its device's rows for a whole lease, then was taken over as if
        the link had died."""
        ctx = self.svc.ctx
        try:
            ctx.journal.release_later(ctx.owner, message_id, ctx.now())
        except WriterClosed:
            raise
        except PersistenceError as exc:  # lost meanwhile, or the database is down
            log.info("could not hand peer row %s back (%s); it comes back by its lease",
                     message_id, exc)

    def announce(self, message_id: str, failed: bool, attempts: int, error: str,
                  taken_over: bool = False) -> None:
        """Tell observers of a failed attempt: reported by this link, or counted by a
        claim that took the row over from a link that died (``taken_over``)."""
        self.svc.ctx.emit("peer_failed" if failed else "peer_retry", message_id=message_id,
                          device_id=self.device_id, attempts=attempts, error=error,
                          taken_over=taken_over)

    def postpone(self, ids: list[str], wait: float) -> None:
        """Hand rows back uncounted, due in ``wait`` seconds: the link's next claim finds
        nothing before then (the head holds back the rows behind it), so it does not dial
        the busy receiver again sooner than it asked. Refused (a lease lost, the database
        down), the rows stay leased here and the link's next claim takes them again at
        once: one dial sooner than asked, nothing lost."""
        if not ids:
            return
        ctx = self.svc.ctx
        now = ctx.now()
        try:
            ctx.journal.release_until(ctx.owner, ids, now, now + wait)
        except WriterClosed:
            raise
        except PersistenceError as exc:  # lost meanwhile, or the database is down
            log.info("could not hand %d peer rows back to wait (%s); the link takes them "
                     "again", len(ids), type(exc).__name__)

    def release(self, ids: list[str]) -> None:
        ctx = self.svc.ctx
        try:
            ctx.journal.release(ctx.owner, ids, ctx.now())
        except PersistenceError:
            pass  # leases expire on their own
