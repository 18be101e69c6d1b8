"""The peer websocket endpoint: ASGI routes a Starlette app mounts (``/peers/link``,
``/peers/pair``).

A thin adapter: the rules are in :mod:`.grants`, :mod:`.handshake` and
:mod:`.receiver`; this module moves frames between the socket and them, and
reaches the runtime only through the :class:`PeerBackend` protocol (every
backend call may block on the database, so it runs in a worker thread,
never on the event loop).

Before the upgrade is accepted the Host and Origin headers and the form of
the bearer token are checked; a refusal is an HTTP answer with
``{"error": <reason>}``. The grant itself is checked in the handshake, where
a refusal is signed (a sender gives a pairing up only on a signed refusal).
No refusal creates state. A database that fails the grant's read, the
pairing's write or a batch's commit is answered ``unavailable`` (close 1013):
the peer tries again later. Consecutive deliveries are committed in one batch and acknowledged in
order after the commit. A watcher re-reads the grant's
status a few times a second and closes the link (after a signed
``refused`` frame) once it is paused or revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from . import frames as f
from . import handshake, receiver
from .errors import BackendRefused, FrameError, GrantClosed, HandshakeRefused
from .grants import (
    HTTP_STATUS,
    GrantView,
    InviteView,
    Refusal,
    bearer_token,
    check_invite,
    new_token,
    secret_hash,
    status_refusal,
)
from .host_guard import AllowedHosts, host_of
from .identity import DeviceIdentity

log = logging.getLogger("kinbox.peers")

HANDSHAKE_TIMEOUT = 10.0
UNCOMMITTED_LIMIT = 128
"""Deliveries of one link read and not yet committed. A sender keeps at most its window
(and a prefetch as large) unacknowledged, well under this; one that ignores it is not read
further until the committer catches up, so its frames wait in its own socket buffers, not
in this process's memory."""
STATUS_POLL_SECONDS = 0.25
"""How often a live link re-reads its grant (a revoke closes it within a second)."""


class PeerBackend(Protocol):
    """What the endpoint needs from a runtime. Methods may block (run in threads).

    ``grant_for``, ``seen``, ``answer``, ``invite`` and ``redeem`` raise
    :class:`.errors.BackendRefused` (``unavailable``), having written nothing, when the
    runtime's database fails."""

    identity: DeviceIdentity

    def grant_for(self, token_hash: str) -> GrantView | None:
        """The inbound grant issued with this token hash."""
        ...

    def grant_status(self, device_id: str) -> str | None:
        """The inbound grant's current status (None once it is gone)."""
        ...

    def seen(self, device_id: str) -> None:
        """A device completed a handshake."""
        ...

    def commit(self, device_id: str, commits: Sequence[receiver.Commit]) -> list[str | None]:
        """Commit deliveries in one transaction; per item None, or why it was rejected.
        :class:`.errors.GrantClosed`, with nothing committed, once the grant is not active;
        :class:`.errors.BackendRefused` (``unavailable``) when the database failed."""
        ...

    def answer(self, device_id: str, action: str) -> tuple[str, str]:
        """(status, text) of a ``read`` or ``stop`` of the device's dedicated session.
        :class:`.errors.GrantClosed`, with nothing done, once the grant is not active."""
        ...

    def invite(self, code_hash: str) -> InviteView | None:
        """The pairing invite with this code hash."""
        ...

    def redeem(self, code_hash: str, proof: handshake.PairingProof, token_hash: str) -> bool:
        """Use the invite and store the grant with ``token_hash``; False if someone used it
        first. The device that redeemed it, asking again before it ever used the grant
        (the ``paired`` answer was lost), gets True and its grant takes ``token_hash``."""
        ...

    def random(self, n: int) -> bytes:
        """``n`` random bytes."""
        ...

    def now(self) -> float:
        """The runtime clock (rate limits run on it)."""
        ...




async def _deny(ws: WebSocket, reason: str) -> None:
    status = HTTP_STATUS.get(Refusal(reason), 403) if reason in set(Refusal) else 403
    log.info("peer connection refused: %s", reason)
    try:
        await ws.send_denial_response(JSONResponse({"error": reason}, status_code=status))
    except RuntimeError:  # the server lacks the denial-response extension
        await ws.close(code=1008, reason=reason)


def _precheck(ws: WebSocket, allowed: AllowedHosts) -> str | None:
    if not allowed.allows(host_of(ws.headers.get("host", ""))):
        return Refusal.BAD_ORIGIN.value
    if ws.headers.get("origin"):
        return Refusal.BAD_ORIGIN.value  # peers are not browsers; a page may not dial in
    return None


UNAVAILABLE = f.encode(f.Error(None, "unavailable", "this device cannot answer now; try "
                                                    "again later"))
"""What a peer hears when the database failed: no detail of it leaves this device."""


async def _unavailable(ws: WebSocket, exc: BackendRefused, what: str) -> None:
    """The runtime could not answer (its database failed): tell the peer to try again
    later (a sender retries with its backoff), close 1013, and keep the details here."""
    log.warning("peer %s answered unavailable: %s", what, exc.message)
    with contextlib.suppress(Exception):
        await ws.send_text(UNAVAILABLE)
        await ws.close(code=1013)


async def _receive_text(ws: WebSocket, timeout: float | None = None) -> str | bytes:
    message = await asyncio.wait_for(ws.receive(), timeout)
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    return message.get("text") if message.get("text") is not None else message.get("bytes", b"")


class PeerEndpoint:
    """The two websocket routes of one runtime."""

    def __init__(self, backend: PeerBackend, allowed_hosts: Sequence[str]) -> None:
        self.backend = backend
        self.allowed_hosts = AllowedHosts(allowed_hosts)

    def routes(self) -> list[WebSocketRoute]:
        """Routes to mount in the HTTP app."""
        return [WebSocketRoute("/peers/link", self.link), WebSocketRoute("/peers/pair", self.pair)]

    async def link(self, ws: WebSocket) -> None:
        """An inbound peer link: check, handshake, then carry frames.

        A request with no well-formed token (or from a browser or a foreign Host) is
        refused at the upgrade; a token the grants refuse is refused in the handshake,
        signed, so the sender can tell the refusal is this device's (see :mod:`.handshake`).
        """
        b = self.backend
        refusal = _precheck(ws, self.allowed_hosts)
        token, why = bearer_token(ws.headers.get("authorization"),
                                  ws.scope.get("query_string", b"").decode("latin-1"))
        refusal = refusal or (why.value if why else None)
        if refusal is not None:
            await _deny(ws, refusal)
            return
        assert token is not None
        await ws.accept()
        nonce = handshake.new_nonce(b.random(handshake.NONCE_BYTES))
        try:
            await ws.send_text(f.encode(handshake.challenge(b.identity, nonce)))
            hello = f.parse(await _receive_text(ws, HANDSHAKE_TIMEOUT))
            if not isinstance(hello, f.Hello):
                raise HandshakeRefused(Refusal.MALFORMED, f"expected hello, got {hello.TYPE}")
            # Read now, not at the upgrade: a grant resumed meanwhile is answered as it is.
            grant = await asyncio.to_thread(b.grant_for, secret_hash(token))
            answer = handshake.answer_hello(b.identity, nonce, hello, grant, token)
        except (FrameError, HandshakeRefused, TimeoutError) as exc:
            reason = getattr(exc, "reason", "timeout")
            log.info("peer handshake refused: %s", reason)
            with contextlib.suppress(Exception):
                await ws.send_text(f.encode(f.Error(None, "forbidden", str(reason))))
                await ws.close(code=1008)
            return
        except BackendRefused as exc:
            await _unavailable(ws, exc, "handshake")
            return
        except WebSocketDisconnect:
            return
        if isinstance(answer, f.Refused):
            log.info("peer handshake refused: %s", answer.reason)
            with contextlib.suppress(Exception):
                await ws.send_text(f.encode(answer))
                await ws.close(code=1008)
            return
        assert grant is not None
        try:
            await ws.send_text(f.encode(answer))
        except (WebSocketDisconnect, RuntimeError, OSError):
            # The device went before its welcome: no link opened, nothing is noted.
            log.info("peer %s closed before its welcome", grant.device_id)
            return
        try:
            await asyncio.to_thread(b.seen, grant.device_id)
        except BackendRefused as exc:  # "last seen" is bookkeeping: the link carries on
            log.warning("noting that %s was seen failed: %s", grant.device_id, exc.message)
        await _Session(ws, b, grant, functools.partial(handshake.refused, b.identity, nonce,
                                                       hello, token)).run()

    async def pair(self, ws: WebSocket) -> None:
        """Redeem a pairing code: the new peer proves its key, gets a token."""
        b = self.backend
        refusal = _precheck(ws, self.allowed_hosts)
        if refusal is not None:
            await _deny(ws, refusal)
            return
        await ws.accept()
        nonce = handshake.new_nonce(b.random(handshake.NONCE_BYTES))
        try:
            await ws.send_text(f.encode(handshake.challenge(b.identity, nonce)))
            request = f.parse(await _receive_text(ws, HANDSHAKE_TIMEOUT))
            if not isinstance(request, f.Pair):
                raise HandshakeRefused(Refusal.MALFORMED, f"expected pair, got {request.TYPE}")
            proof = handshake.accept_pair(b.identity, nonce, request)
            code_hash = secret_hash(request.code)
            invite = await asyncio.to_thread(b.invite, code_hash)
            bad = check_invite(invite, b.now(), proof.device_id)
            token = new_token(b.random(32))
            if bad is not None or not await asyncio.to_thread(b.redeem, code_hash, proof,
                                                               secret_hash(token)):
                raise HandshakeRefused(Refusal.EXPIRED_INVITE)
            answer = f.encode(handshake.paired(b.identity, nonce, proof, request, token))
            try:
                await ws.send_text(answer)
                await ws.close()
            except (WebSocketDisconnect, RuntimeError, OSError):
                # Committed, and the device may never hear it: the same code from the same
                # key is answered again (a new token for its grant) until it uses the grant.
                log.info("paired device %s, but the connection closed before the answer; "
                         "its retry with the same code gets it", proof.device_id)
                return
            log.info("paired device %s", proof.device_id)
        except (FrameError, HandshakeRefused, TimeoutError) as exc:
            reason = getattr(exc, "reason", "timeout")
            log.info("pairing refused: %s", reason)
            with contextlib.suppress(Exception):
                await ws.send_text(f.encode(f.Error(None, "forbidden", str(reason))))
                await ws.close(code=1008)
        except BackendRefused as exc:
            await _unavailable(ws, exc, "pairing")
        except WebSocketDisconnect:
            return


class _Session:
    """One authenticated link: a reader, a committer and a grant watcher."""

    def __init__(self, ws: WebSocket, backend: PeerBackend, grant: GrantView,
                 refusal: Callable[[Refusal], f.Refused]) -> None:
        self.ws = ws
        self.refusal = refusal
        """Signs the grant's refusal for this link's handshake (sent when it closes)."""
        self.b = backend
        self.device_id = grant.device_id
        self.core = receiver.ReceiverLink(grant.device_id, grant.scopes)
        self.commits: asyncio.Queue[receiver.Commit] = asyncio.Queue(UNCOMMITTED_LIMIT)
        self.send_lock = asyncio.Lock()
        self.committing = asyncio.Lock()
        """Held by the committer from a batch's commit until its acks are sent: a grant
        closed meanwhile waits for it, so no committed delivery goes unacknowledged."""
        self.done = asyncio.Event()

    async def send(self, text: str) -> None:
        async with self.send_lock:
            await self.ws.send_text(text)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._commit()),
                 asyncio.create_task(self._watch())]
        try:
            await self.done.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self) -> None:
        try:
            while True:
                data = await _receive_text(self.ws)
                for action in self.core.receive(data, self.b.now()):
                    if isinstance(action, receiver.Commit):
                        await self.commits.put(action)
                    elif isinstance(action, receiver.Send):
                        await self.send(action.text)
                    elif isinstance(action, receiver.Answer):
                        try:
                            status, text = await asyncio.to_thread(
                                self.b.answer, self.device_id, action.action)
                        except GrantClosed as exc:  # closed before the watcher saw it
                            async with self.committing:
                                await self._close(exc.status)
                            return
                        except BackendRefused as exc:  # the asker may ask again later
                            log.warning("a %s from %s answered unavailable: %s",
                                        action.action, self.device_id, exc.message)
                            await self.send(UNAVAILABLE)
                            continue
                        await self.send(f.encode(f.Result(action.req, status, text)))
                    elif isinstance(action, receiver.Close):
                        await self.ws.close(code=action.code, reason=action.reason)
                        return
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            self.done.set()

    async def _commit(self) -> None:
        try:
            while True:
                batch = [await self.commits.get()]
                while not self.commits.empty():
                    batch.append(self.commits.get_nowait())
                async with self.committing:
                    try:
                        outcomes = await asyncio.to_thread(self.b.commit, self.device_id,
                                                           batch)
                    except GrantClosed as exc:  # nothing of the batch was committed
                        closed: GrantClosed | None = exc
                    except BackendRefused as exc:
                        # Nothing acknowledged: the sender hears "try again later" (not a
                        # dropped link it cannot tell from anything else), and its rows go
                        # back with the backoff; a batch that commits after all is a repeat.
                        async with self.send_lock:
                            await _unavailable(self.ws, exc, f"delivery from {self.device_id}")
                        self.done.set()
                        return
                    else:
                        closed = None
                        for item, problem in zip(batch, outcomes, strict=True):
                            await self.send(item.ack if problem is None else
                                            f.encode(f.Error(item.message_id, "rejected",
                                                             problem)))
                if closed is not None:
                    await self._close(closed.status)
                    return
        except (WebSocketDisconnect, RuntimeError):
            self.done.set()
        except Exception:
            log.exception("committing peer deliveries from %s failed", self.device_id)
            self.done.set()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(STATUS_POLL_SECONDS)
            try:
                status = await asyncio.to_thread(self.b.grant_status, self.device_id)
            except Exception as exc:  # a read that failed (a lock wait): read at the next poll
                log.warning("reading the grant of %s failed: %s", self.device_id,
                            type(exc).__name__)
                continue
            if status != "active":
                async with self.committing:  # a batch committed by now is acknowledged first
                    await self._close(status)
                return

    async def _close(self, status: str | None) -> None:
        """Tell the device its grant closed (signed), close the link, end the session."""
        reason = status_refusal(status) or Refusal.REVOKED  # only a closed grant comes here
        with contextlib.suppress(Exception):
            await self.send(f.encode(self.refusal(reason)))
            await self.ws.close(code=1008, reason="grant " + str(status))
        self.done.set()
