"""The receiving side of peers: :class:`PeerHttpBackend`, what the websocket endpoint calls.

The :class:`~kinbox.transport.PeerBackend` of a running runtime: it commits a
delivery as an inbox row whose id is derived from the sender's device and message
id, in the sender's dedicated session ``suzent:<device_id>`` (social project,
kind ``remote``), and wakes the dispatcher, which runs the turn wherever a brain
is; it redeems pairing codes and answers ``read`` and ``stop``. A database
failure in any of these is the endpoint's ``unavailable`` (the peer tries again
later), never a crash of the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..persistence import (
    IdempotencyConflict,
    NewMessage,
    PersistenceError,
    WriteTimeout,
)
from ..persistence.peers import INBOUND
from ..persistence.writer import WRITE_TIMEOUT
from ..transport import frames as wire
from ..transport import receiver
from ..transport.errors import BackendRefused, FrameError, GrantClosed
from ..transport.grants import GrantView, InviteView
from ..transport.handshake import PairingProof
from . import stops, transcript_read, transcript_view
from .peer_link import peer_target
from .peers import PeerService

log = logging.getLogger("kinbox.peers")


@contextmanager
def _database(what: str) -> Iterator[None]:
    """A database failure while ``what`` as the endpoint's :class:`BackendRefused` (503
    ``unavailable``): it answers the peer "try again later" without knowing this layer's
    errors. What failed wrote nothing: each of these is one read or one transaction, and
    :meth:`PeerHttpBackend.redeem` waits out a batch that may yet commit."""
    try:
        yield
    except PersistenceError as exc:
        raise BackendRefused(503, "unavailable",
                             f"the database failed {what} ({type(exc).__name__})") from exc


class PeerHttpBackend:
    """The :class:`~kinbox.transport.PeerBackend` of a running runtime (the receiving side)."""

    def __init__(self, svc: PeerService) -> None:
        self.svc = svc
        self.ctx = svc.ctx
        self.identity = svc.identity

    def grant_for(self, token_hash: str) -> GrantView | None:
        """The inbound grant issued with this token hash."""
        with _database("reading a grant"):
            rec = self.svc.peers.by_token_hash(token_hash)
        if rec is None or rec.token_hash is None:
            return None
        return GrantView(rec.device_id, rec.public_key, rec.token_hash, rec.scopes, rec.status)

    def grant_status(self, device_id: str, token_hash: str) -> str | None:
        """The inbound grant's status now, while it is the one issued with ``token_hash``
        (None once it is gone or a new pairing replaced it)."""
        rec = self.svc.peers.device(device_id, INBOUND)
        return rec.status if rec and rec.token_hash == token_hash else None

    def committed(self, device_id: str, message_ids: Sequence[str]) -> list[str]:
        """Those of ``message_ids`` committed here from the device (its inbox rows
        ``peer-<device>-<id>`` exist): a refused device acknowledges them, not fails them."""
        journal = self.ctx.journal
        with _database("reading the rows a refused device carries"):
            return [mid for mid in message_ids
                    if journal.hot.existing(receiver.inbox_id(device_id, mid)) is not None]

    def seen(self, device_id: str) -> None:
        """A device completed a handshake."""
        with _database("noting a device seen"):
            self.svc.peers.touch(device_id, INBOUND, self.ctx.now())

    def commit(self, device_id: str, token_hash: str,
               commits: Sequence[receiver.Commit]) -> list[str | None]:
        """Commit deliveries (and their sessions) in one transaction, then wake the dispatcher.

        A database failure is :class:`BackendRefused` (``unavailable``): the endpoint tells
        the sender to try again, and a batch that commits after all (a write that outlived
        its wait) is harmless, since a repeat maps to the same rows and gets the same ack."""
        ctx = self.ctx
        with _database("reading the social project"):
            social = ctx.store.project_by_slug("social")
        now = ctx.now()
        peers = self.svc.peers

        msgs = [NewMessage(c.inbox_id, c.session, c.text, kind="remote_agent_message",
                           sender=peer_target(device_id),
                           payload={"peer": device_id, "peer_message_id": c.message_id})
                for c in commits]

        def op() -> list[tuple[str | None, bool]]:
            """Each delivery's problem (None: committed) and whether its row is new (a
            repeat, its ack lost, is committed already: no new row, no new message)."""
            # In the commit's transaction: a grant closed, or replaced by a new pairing,
            # since the link opened (the watcher polls it) takes nothing more.
            status = self.grant_status(device_id, token_hash)
            if status != "active":
                raise GrantClosed(status)
            for session in dict.fromkeys(c.session for c in commits):
                peers.ensure_session_now(session, social.id if social else None,
                                         f"Device {device_id}", now)
            # Repeats (an ack that was lost) are no new rows; a conflict writes nothing.
            return [("the message id was already used for other content", False)
                    if isinstance(r, IdempotencyConflict) else (None, r.created)
                    for r in ctx.journal.enqueue_each_now(msgs, now)]
        with _database("committing deliveries"):
            outcomes: list[tuple[str | None, bool]] = ctx.journal.writer.call(op)
        for c, (problem, created) in zip(commits, outcomes, strict=True):
            if problem is None:  # as a local send's "sent": a repeat is heard, not as new
                ctx.emit("peer_received", message_id=c.inbox_id, device_id=device_id,
                         target=c.session, created=created)
        ctx.wake_dispatcher()
        return [problem for problem, _ in outcomes]

    def answer(self, device_id: str, token_hash: str, action: str) -> tuple[str, str]:
        """``read``: the dedicated session's visible transcript; ``stop``: request a stop.
        Like a delivery, neither is done once the grant closed (the link's watcher may not
        have seen it yet)."""
        session_id = receiver.dedicated_session(device_id)
        ctx = self.ctx
        with _database(f"answering a {action}"):
            grant = self.grant_status(device_id, token_hash)
            if grant != "active":
                raise GrantClosed(grant)
            if action == "stop":
                ok = stops.request_stop(ctx, session_id, peer_target(device_id))
                return ("stop_requested" if ok else "not_active"), ""
            session = ctx.store.session(session_id)
            lines, older = transcript_read.newest_lines(ctx.store, session_id,
                                                        speakers=False)
        status = session.status if session else "idle"
        return status, _fitting_read(status, lines, older)

    def invite(self, code_hash: str) -> InviteView | None:
        """The pairing invite with this code hash."""
        with _database("reading an invite"):
            rec = self.svc.peers.invite(code_hash)
        return (InviteView(rec.code_hash, rec.scopes, rec.expires_at, rec.used, rec.used_by)
                if rec else None)

    def redeem(self, code_hash: str, proof: PairingProof, token_hash: str) -> bool:
        """Use the invite, store the grant and create the device's dedicated session, in one
        transaction: a failure on the way leaves the code unspent and no grant behind. The
        same device redeeming the code again (the answer was lost) gets its grant with the
        new token (``PeerStore.redeem_now``)."""
        peers = self.svc.peers
        now = self.ctx.now()
        with _database("redeeming an invite"):
            social = self.ctx.store.project_by_slug("social")

            def op() -> bool:
                if not peers.redeem_now(code_hash, now, proof.device_id, proof.name,
                                        proof.public_key, token_hash):
                    return False
                peers.ensure_session_now(receiver.dedicated_session(proof.device_id),
                                         social.id if social else None,
                                         f"Device {proof.name or proof.device_id}", now)
                return True
            reply = self.ctx.journal.writer.submit(op)
            try:
                return bool(reply.result(WRITE_TIMEOUT))
            except WriteTimeout as exc:
                if exc.withdrawn:
                    raise
                # Its batch runs and may yet commit: answered "try again" now, the code
                # could be spent with a grant nobody holds the token of. Its outcome,
                # whichever it is, is what the device gets told.
                return bool(reply.result(None))

    def random(self, n: int) -> bytes:
        """Randomness."""
        return self.svc.random(n)

    def now(self) -> float:
        """The runtime clock."""
        return self.ctx.now()


def _fitting_read(status: str, lines: list[transcript_view.Line], older: int) -> str:
    """The transcript as ``read`` shows it, newest messages kept, within what one result
    frame carries: the view's limit counts characters, a frame 64 KiB of JSON (20,000
    emoji or escaped control characters are more), and a result that did not fit ended
    the link with no answer. Each try halves the characters kept. ``older``: shown
    messages before ``lines`` (:func:`.transcript_read.newest_lines`)."""
    limit = transcript_view.READ_LIMIT
    while True:
        text = transcript_view.render(lines, limit, older)
        try:
            wire.encode(wire.Result("0" * 64, status, text))  # the longest request id
            return text
        except FrameError as exc:
            if exc.reason != "too_large" or limit // 2 < transcript_view.MIN_READ_LIMIT:
                raise
            limit //= 2

