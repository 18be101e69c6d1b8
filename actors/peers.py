"""The peer service: this runtime's device identity, its links, and its peer endpoint.

The composition of the peers feature (SPEC §8) inside one runtime:

- sending: ``agent_send("peer:<id>")`` queues a ``suzent_peer`` row and wakes
  that device's :class:`~.peer_link.PeerLink` (one per outbound device,
  started for every paired device at start, so a restart rehydrates);
- receiving: :class:`PeerHttpBackend` is the :class:`~kinbox.transport.PeerBackend`
  the websocket endpoint calls: it commits a delivery as an inbox row whose id
  is derived from the sender's device and message id, in the sender's
  dedicated session ``suzent:<device_id>`` (social project, kind ``remote``),
  and wakes the dispatcher, which runs the turn wherever a brain is;
- pairing, ``agent_read``/``agent_stop`` on ``peer:<id>`` (one-shot links)
  and the ``agent_list`` entries of paired devices.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from ..persistence import (
    IdempotencyConflict,
    NewMessage,
    PersistenceError,
    WriteTimeout,
    set_wise,
)
from ..persistence.peer_outbox import PeerOutbox
from ..persistence.peers import INBOUND, OUTBOUND, DeviceRecord, PeerStore
from ..persistence.writer import WRITE_TIMEOUT
from ..transport import frames as wire
from ..transport import key_file, receiver
from ..transport.errors import (
    BackendRefused,
    FrameError,
    GrantClosed,
    IdentityError,
    PeerUnavailable,
)
from ..transport.grants import GrantView, InviteView, is_code, new_code, secret_hash
from ..transport.handshake import NONCE_BYTES, PairingProof, new_nonce
from ..transport.identity import SEAL_NONCE_BYTES, DeviceIdentity
from ..transport.link import Answer, LinkState, Retry, SenderLink, Terminal
from ..transport.peer_client import connect_link, endpoint, pair_with
from . import stops, transcript_view
from .context import RuntimeContext
from .errors import ConfigError, ToolError
from .ids import short
from .outbox import Writes
from .peer_link import PeerLink, peer_target

log = logging.getLogger("kinbox.peers")

PEER_PREFIX = "peer:"
URL_LIMIT = 1024
"""Characters in a paired device's address (its column)."""
REQUEST_TIMEOUT = 10.0
"""Seconds an ``agent_read``/``agent_stop`` on a peer may take from the open socket to its
answer, whatever else the peer sends meanwhile (pings, frames of no interest): one
deadline for the exchange, not one per frame, or a chatty peer holds the calling turn."""


def is_peer_target(agent_id: str) -> bool:
    """Is this an address of a paired device?"""
    return agent_id.startswith(PEER_PREFIX)


class PeerService:
    """Peers of one started runtime."""

    def __init__(self, ctx: RuntimeContext, data_dir: Path, *, delivering: bool = True) -> None:
        self.ctx = ctx
        self.delivering = delivering
        """False in a send-only runtime: it receives and queues, but runs no outbound link
        (the delivering process's link sends the rows)."""
        self.data_dir = data_dir
        self.identity = key_file.load_or_create(data_dir)
        t, w = ctx.journal.t, ctx.journal.writer
        self.peers = PeerStore(t, w)
        self.outbox = PeerOutbox(t, w)
        self.links: dict[str, PeerLink] = {}
        self._lock = threading.Lock()
        self._unsubscribe: Any = None

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start a link for every outbound device (their rows are their mailboxes)."""
        subscribe = getattr(self.ctx.clock, "subscribe", None)
        if subscribe is not None:  # an injected clock moved: backoffs may have run out
            self._unsubscribe = subscribe(lambda _now: self.wake_all())
        for rec in self.peers.devices(OUTBOUND):
            self.link_for(rec.device_id)

    def stop(self) -> None:
        """Stop every link (before the dispatcher and the writer stop)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        with self._lock:
            links, self.links = list(self.links.values()), {}
        for link in links:
            link.stop()

    def link_for(self, device_id: str) -> PeerLink | None:
        """The device's link, started on first use (None in a send-only runtime)."""
        if not self.delivering:
            return None
        with self._lock:
            link = self.links.get(device_id)
            if link is None:
                link = self.links[device_id] = PeerLink(self, device_id)
                link.start()
        return link

    def wake_all(self) -> None:
        """Every link looks at its rows again."""
        with self._lock:
            links = list(self.links.values())
        for link in links:
            link.wake()

    def random(self, n: int) -> bytes:
        """Randomness for nonces, tokens and seals."""
        return os.urandom(n)

    # -- pairing (the sending side) --------------------------------------------------------

    def pair(self, url: str, code: str, name: str = "") -> DeviceRecord:
        """Redeem a pairing code printed by ``kinbox peers invite`` on the other device."""
        rec = complete_pairing(self.identity, self.peers, url, code, name, self.ctx.now())
        self.link_for(rec.device_id)
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
        msgs = [self._message(caller_id, rec, t, session) for t in texts]

        def wake_link() -> None:
            link = self.link_for(rec.device_id)
            if link is not None:
                link.wake()
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
        try:
            with connect_link(rec.url or "", token) as ws:
                return self._exchange(ws, link, agent_id, action)
        except PeerUnavailable as exc:
            raise ToolError("execution_failed",
                            f"Peer '{agent_id}' cannot be reached ({exc.reason}).") from None
        except (TimeoutError, ConnectionClosed):
            raise ToolError("execution_failed", f"Peer '{agent_id}' did not answer.") from None

    def _exchange(self, ws: ClientConnection, link: SenderLink, agent_id: str,
                  action: str) -> wire.Result:
        link.connected(new_nonce(self.random(NONCE_BYTES)))
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
                if isinstance(e, Retry | Terminal):
                    why = e.reason
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

    def grant_status(self, device_id: str) -> str | None:
        """The inbound grant's status now."""
        rec = self.svc.peers.device(device_id, INBOUND)
        return rec.status if rec else None

    def seen(self, device_id: str) -> None:
        """A device completed a handshake."""
        with _database("noting a device seen"):
            self.svc.peers.touch(device_id, INBOUND, self.ctx.now())

    def commit(self, device_id: str, commits: Sequence[receiver.Commit]) -> list[str | None]:
        """Commit deliveries (and their sessions) in one transaction, then wake the dispatcher."""
        ctx = self.ctx
        social = ctx.store.project_by_slug("social")
        now = ctx.now()
        peers = self.svc.peers

        msgs = [NewMessage(c.inbox_id, c.session, c.text, kind="remote_agent_message",
                           sender=peer_target(device_id),
                           payload={"peer": device_id, "peer_message_id": c.message_id})
                for c in commits]

        def op() -> list[str | None]:
            # In the commit's transaction: a grant closed since the link opened (the
            # watcher polls it) takes nothing more.
            status = self.grant_status(device_id)
            if status != "active":
                raise GrantClosed(status)
            for session in dict.fromkeys(c.session for c in commits):
                peers.ensure_session_now(session, social.id if social else None,
                                         f"Device {device_id}", now)
            try:  # the common case: all new, one INSERT for the batch
                set_wise.enqueue_all(ctx.journal.bulk, [(m, now, None) for m in msgs])
                return [None] * len(msgs)
            except set_wise.OneByOne:
                pass
            out: list[str | None] = []
            for msg in msgs:  # repeats (an ack that was lost) and conflicts, one by one
                try:
                    ctx.journal.enqueue_now(msg, now)
                    out.append(None)
                except IdempotencyConflict:
                    out.append("the message id was already used for other content")
            return out
        outcomes: list[str | None] = ctx.journal.writer.call(op)
        for c, problem in zip(commits, outcomes, strict=True):
            if problem is None:
                ctx.emit("peer_received", message_id=c.inbox_id, device_id=device_id,
                         target=c.session)
        ctx.wake_dispatcher()
        return outcomes

    def answer(self, device_id: str, action: str) -> tuple[str, str]:
        """``read``: the dedicated session's visible transcript; ``stop``: request a stop.
        Like a delivery, neither is done once the grant closed (the link's watcher may not
        have seen it yet)."""
        status = self.grant_status(device_id)
        if status != "active":
            raise GrantClosed(status)
        session_id = receiver.dedicated_session(device_id)
        ctx = self.ctx
        with _database(f"answering a {action}"):
            if action == "stop":
                ok = stops.request_stop(ctx, session_id, peer_target(device_id))
                return ("stop_requested" if ok else "not_active"), ""
            session = ctx.store.session(session_id)
            lines = [transcript_view.Line(e.role, e.text, e.visible)
                     for e in ctx.store.transcript(session_id)]
        status = session.status if session else "idle"
        return status, _fitting_read(status, lines)

    def invite(self, code_hash: str) -> InviteView | None:
        """The pairing invite with this code hash."""
        with _database("reading an invite"):
            rec = self.svc.peers.invite(code_hash)
        return InviteView(rec.code_hash, rec.scopes, rec.expires_at, rec.used) if rec else None

    def redeem(self, code_hash: str, proof: PairingProof, token_hash: str) -> bool:
        """Use the invite, store the grant and create the device's dedicated session, in one
        transaction: a failure on the way leaves the code unspent and no grant behind."""
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


def complete_pairing(identity: DeviceIdentity, peers: PeerStore, url: str, code: str,
                     name: str, now: float) -> DeviceRecord:
    """Pair with the device at ``url``: prove our key, pin theirs, keep the token sealed.

    The name and the address are checked first: the other device spends the code (and
    replaces an earlier grant of ours) as it answers, so nothing may fail after that."""
    if not wire.is_device_name(name):  # the pair frame's own rule
        raise ConfigError(f"a device name is at most {wire.DEVICE_NAME_LIMIT} printable "
                          "characters", field="name")
    if not is_code(code):  # a typo, not a network problem
        raise ConfigError("that is not a pairing code: codes are what `kinbox peers invite` "
                          "printed on the other device (kbp_ and 43 more characters)",
                          field="code")
    if not isinstance(url, str) or not url or len(url) > URL_LIMIT or not url.isprintable():
        raise ConfigError(f"the device's address is 1 to {URL_LIMIT} printable characters",
                          field="url")
    try:  # a typo, not a network problem: refused as the name and the code are
        endpoint(url, "/peers/pair")
    except ValueError as exc:
        raise ConfigError(str(exc), field="url") from None
    if "@" in urlsplit(url).netloc:  # it would be stored, and listed, as it is
        raise ConfigError("the device's address carries no user or password: the pairing "
                          "code and then the device's token authenticate", field="url")
    paired = pair_with(url, identity, code, identity.device_id,
                       new_nonce(os.urandom(NONCE_BYTES)))
    sealed = identity.seal(paired.token, os.urandom(SEAL_NONCE_BYTES))
    return peers.save_outbound(paired.device_id, name or paired.device_id, paired.public_key,
                               url, sealed, frozenset({"agent"}), now)


def new_invite(peers: PeerStore, scopes: frozenset[str], ttl: float, now: float) -> str:
    """Store a one-time pairing code (its hash only) and return the code."""
    code = new_code(os.urandom(32))
    peers.add_invite(secret_hash(code), scopes, now, now + ttl)
    return code


def _fitting_read(status: str, lines: list[transcript_view.Line]) -> str:
    """The transcript as ``read`` shows it, newest messages kept, within what one result
    frame carries: the view's limit counts characters, a frame 64 KiB of JSON (20,000
    emoji or escaped control characters are more), and a result that did not fit ended
    the link with no answer. Each try halves the characters kept."""
    limit = transcript_view.READ_LIMIT
    while True:
        text = transcript_view.render(lines, limit)
        try:
            wire.encode(wire.Result("0" * 64, status, text))  # the longest request id
            return text
        except FrameError as exc:
            if exc.reason != "too_large" or limit // 2 < transcript_view.MIN_READ_LIMIT:
                raise
            limit //= 2

