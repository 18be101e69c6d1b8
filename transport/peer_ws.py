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
No refusal creates state. Until its handshake ends a connection holds one of the
:mod:`.handshake_slots`: it must end by its deadline (else ``error`` ``timeout``, close
1008 ``handshake timeout``; a handshake whose sends are still not written a moment later,
to a client that reads nothing, is given up and its slot freed), and past the cap of
handshakes in progress an upgrade is refused at once (503 ``busy`` with ``Retry-After``).
A client address with too many failed handshakes (:mod:`.token_tries`: an unknown token,
a hello that proves no grant's key, a pairing code no open invite matches, a protocol
error) is refused at the upgrade of either route for a
while (429 ``too_many_tries`` with ``Retry-After``), before a challenge, a read or a
signature: each failure cost a grant's read and a signed refusal, at any rate a client
liked. A device that proves its grant's key (welcomed, or refused as paused or revoked)
is never counted, nor does its welcome forget others' failures at its address.
A database that fails the grant's read, the pairing's write or a batch's commit is
answered ``unavailable`` (close 1013): the peer tries again later. A welcomed link runs
in :mod:`.inbound_link`: consecutive deliveries are committed in one batch and acknowledged in order
after the commit, and a watcher closes the link (after a signed ``refused``
frame) once its grant is paused or revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from . import frames as f
from . import handshake, receiver
from .errors import BackendRefused, FrameError, HandshakeRefused
from .grants import (
    HTTP_STATUS,
    GrantView,
    InviteView,
    Refusal,
    bearer_token,
    check_invite,
    new_token,
    secret_hash,
)
from .handshake_slots import HandshakeLimits, HandshakeSlots, Slot, remaining
from .host_names import AllowedHosts, host_of
from .identity import DeviceIdentity
from .inbound_link import InboundLink, receive_text, unavailable
from .token_tries import TokenTries, client_of, retry_after

log = logging.getLogger("kinbox.peers")

TIMEOUT_REASON = "handshake timeout"
"""The close reason of a connection whose handshake passed its deadline (code 1008)."""
GOODBYE_SECONDS = 1.0
"""How long past its deadline a handshake may take to write its last frames (the refusal
of a late one): past that it is given up, however far its sends got."""

T = TypeVar("T")


class PeerBackend(Protocol):
    """What the endpoint needs from a runtime. Methods may block (run in threads).

    ``grant_for``, ``seen``, ``answer``, ``invite`` and ``redeem`` raise
    :class:`.errors.BackendRefused` (``unavailable``), having written nothing, when the
    runtime's database fails."""

    identity: DeviceIdentity

    def grant_for(self, token_hash: str) -> GrantView | None:
        """The inbound grant issued with this token hash."""
        ...

    def grant_status(self, device_id: str, token_hash: str) -> str | None:
        """The device's inbound grant's current status while it is still the grant issued
        with ``token_hash``; None once it is gone or a new pairing replaced it (a link
        opened with the old token is then a link of no grant)."""
        ...

    def seen(self, device_id: str) -> None:
        """A device completed a handshake."""
        ...

    def commit(self, device_id: str, token_hash: str,
               commits: Sequence[receiver.Commit]) -> list[str | None]:
        """Commit deliveries in one transaction; per item None, or why it was rejected.
        :class:`.errors.GrantClosed`, with nothing committed, once the grant issued with
        ``token_hash`` is not active (see :meth:`grant_status`);
        :class:`.errors.BackendRefused` (``unavailable``) when the database failed."""
        ...

    def answer(self, device_id: str, token_hash: str, action: str) -> tuple[str, str]:
        """(status, text) of a ``read`` or ``stop`` of the device's dedicated session.
        :class:`.errors.GrantClosed`, with nothing done, once the grant issued with
        ``token_hash`` is not active."""
        ...

    def committed(self, device_id: str, message_ids: Sequence[str]) -> list[str]:
        """Those of ``message_ids`` (the device's own ids) committed here from the device."""
        ...

    def invite(self, code_hash: str) -> InviteView | None:
        """The pairing invite with this code hash."""
        ...

    def redeem(self, code_hash: str, proof: handshake.PairingProof, token_hash: str) -> bool:
        """Use the invite and store the grant with ``token_hash``; False if someone used it
        first, or if the device id has a grant of another key (a key ground to match a
        paired device's 48-bit id), spending nothing. The device that redeemed it, asking
        again before it ever used the grant (the ``paired`` answer was lost), gets True and
        its grant takes ``token_hash``."""
        ...

    def random(self, n: int) -> bytes:
        """``n`` random bytes."""
        ...

    def now(self) -> float:
        """The runtime clock (rate limits run on it)."""
        ...




async def _deny(ws: WebSocket, reason: str, headers: dict[str, str] | None = None,
                level: int = logging.INFO) -> None:
    status = HTTP_STATUS.get(Refusal(reason), 403) if reason in set(Refusal) else 403
    log.log(level, "peer connection refused: %s", reason)
    try:
        await ws.send_denial_response(JSONResponse({"error": reason}, status_code=status,
                                                   headers=headers))
    except RuntimeError:  # the server lacks the denial-response extension
        await ws.close(code=1008, reason=reason)


def _client(ws: WebSocket) -> str:
    """The peer address of ``ws``'s connection (what failed handshakes are counted by)."""
    return ws.client.host if ws.client is not None else ""


def _precheck(ws: WebSocket, allowed: AllowedHosts) -> str | None:
    if not allowed.allows(host_of(ws.headers.get("host", ""))):
        return Refusal.BAD_ORIGIN.value
    if ws.headers.get("origin"):
        return Refusal.BAD_ORIGIN.value  # peers are not browsers; a page may not dial in
    return None


class PeerEndpoint:
    """The two websocket routes of one runtime."""

    def __init__(self, backend: PeerBackend, allowed_hosts: Sequence[str],
                 limits: HandshakeLimits | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 tries: TokenTries | None = None) -> None:
        """``limits`` bound the handshakes (:class:`.HandshakeLimits`' defaults when not
        given); ``tries`` count failed link and pairing handshakes per client address (a
        :class:`.TokenTries` of the default limits when not given); both are timed on
        ``clock`` (monotonic seconds)."""
        self.backend = backend
        self.allowed_hosts = AllowedHosts(allowed_hosts)
        self.slots = HandshakeSlots(limits)
        self.clock = clock
        # Called on the event loop only, so one at a time.
        self.tries = tries if tries is not None else TokenTries()

    def _failed(self, ws: WebSocket) -> None:
        """Count a failed handshake of the client of ``ws``; say so once its lock begins
        (the address, never the token)."""
        client, now = _client(ws), self.clock()
        before = self.tries.wait(client, now)
        wait = self.tries.failed(client, now)
        if wait > 0 and before == 0:
            log.warning("peer handshakes from %s refused for %s s: %d failed within %g s "
                        "(unknown or wrong device tokens, hellos proving no paired key, or "
                        "pairing codes no open invite matches)",
                        client_of(client), retry_after(wait), self.tries.max_failures,
                        self.tries.window)

    async def _refuse_counted(self, ws: WebSocket, what: str,
                              exc: FrameError | HandshakeRefused | TimeoutError) -> None:
        """Refuse a handshake (:func:`_refuse`), counting it as a failed try of its client
        unless it timed out: a timeout read, checked and signed nothing."""
        if not isinstance(exc, TimeoutError):
            self._failed(ws)
        await _refuse(ws, what, exc)

    async def _admit(self, ws: WebSocket) -> Slot | None:
        """A handshake slot for ``ws``; None when its upgrade is refused: its client is
        locked out after failed handshakes (429 with ``Retry-After``, logged at DEBUG: its
        lock was logged once), or every slot is held."""
        wait = self.tries.wait(_client(ws), self.clock())
        if wait > 0:
            await _deny(ws, Refusal.TOO_MANY_TRIES.value, {"Retry-After": retry_after(wait)},
                        logging.DEBUG)
            return None
        slot = self.slots.take(self.clock())
        if isinstance(slot, float):
            await _deny(ws, Refusal.BUSY.value, {"Retry-After": retry_after(slot)})
            return None
        return slot

    async def _by_deadline(self, slot: Slot, handshake: Awaitable[T]) -> T | None:
        """``handshake``'s outcome; None once ``slot``'s deadline and
        :data:`GOODBYE_SECONDS` have passed (it is given up, the connection left to close).
        Its read has the deadline, and so must its sends: a client that leaves what it is
        sent unread (pongs to its pings filling the buffers) kept a challenge, or the
        goodbye at the deadline, waiting to be written for ever, and held its slot."""
        try:
            return await asyncio.wait_for(handshake,
                                          remaining(slot, self.clock()) + GOODBYE_SECONDS)
        except TimeoutError:
            log.info("peer handshake given up at its deadline: the client reads nothing")
            return None

    async def _first_frame(self, ws: WebSocket, slot: Slot) -> f.Frame:
        """The client's first frame, read by ``slot``'s deadline (else TimeoutError)."""
        return f.parse(await receive_text(ws, remaining(slot, self.clock())))

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
        named: tuple[str, ...] | None = None
        if refusal is None and f.IN_FLIGHT_HEADER in ws.headers:
            try:
                named = f.parse_in_flight(ws.headers[f.IN_FLIGHT_HEADER])
            except FrameError:
                refusal = Refusal.MALFORMED.value
        if refusal is not None:
            await _deny(ws, refusal)
            return
        assert token is not None
        slot = await self._admit(ws)
        if slot is None:
            return
        try:
            welcomed = await self._by_deadline(slot, self._welcome(ws, token, slot, named))
        finally:
            self.slots.release(slot)  # an authenticated link holds no handshake slot
        if welcomed is None:
            return
        grant, hello, nonce = welcomed
        try:
            await asyncio.to_thread(b.seen, grant.device_id)
        except BackendRefused as exc:  # "last seen" is bookkeeping: the link carries on
            log.warning("noting that %s was seen failed: %s", grant.device_id, exc.message)
        await InboundLink(ws, b, grant, functools.partial(handshake.refused, b.identity, nonce,
                                                       hello, token)).run()

    async def _welcome(self, ws: WebSocket, token: str, slot: Slot,
                       named: tuple[str, ...] | None) -> tuple[GrantView, f.Hello, str] | None:
        """The handshake of a link: its grant, hello and nonce once welcomed, else None
        (refused, timed out or gone; the connection is closed). ``named``: the ids the
        upgrade said the link carries, answered in a refusal (see :mod:`.handshake`)."""
        b = self.backend
        await ws.accept()
        nonce = handshake.new_nonce(b.random(handshake.NONCE_BYTES))
        try:
            await ws.send_text(f.encode(handshake.challenge(b.identity, nonce)))
            hello = await self._first_frame(ws, slot)
            if not isinstance(hello, f.Hello):
                raise HandshakeRefused(Refusal.MALFORMED, f"expected hello, got {hello.TYPE}")
            # Read now, not at the upgrade: a grant resumed meanwhile is answered as it is.
            grant = await asyncio.to_thread(b.grant_for, secret_hash(token))
            answer = handshake.answer_hello(b.identity, nonce, hello, grant, token)
            committed = None
            # A refused grant's own device (its key proven by the hello) is no failed try.
            proven = isinstance(answer, f.Welcome) or (
                grant is not None and handshake.proves(b.identity, nonce, hello, grant))
            if not proven:
                self._failed(ws)
            if isinstance(answer, f.Refused) and named is not None:
                # Only to the device itself.
                ids = (await asyncio.to_thread(b.committed, hello.device_id, named)
                       if proven and named else [])
                committed = f.Committed(ids)
                answer = handshake.refused(b.identity, nonce, hello, token,
                                           Refusal(answer.reason), committed)
        except (FrameError, HandshakeRefused, TimeoutError) as exc:
            await self._refuse_counted(ws, "peer handshake", exc)
            return None
        except BackendRefused as exc:
            await unavailable(ws, exc, "handshake")
            return None
        except WebSocketDisconnect:
            return None
        if isinstance(answer, f.Refused):
            log.info("peer handshake refused: %s", answer.reason)
            with contextlib.suppress(Exception):
                if committed is not None:
                    await ws.send_text(f.encode(committed))
                await ws.send_text(f.encode(answer))
                await ws.close(code=1008)
            return None
        assert grant is not None
        # Not TokenTries.succeeded: a device's welcome does not forget the failures of
        # whoever else shares its address (a NAT), or that client would never be locked out.
        try:
            await ws.send_text(f.encode(answer))
        except (WebSocketDisconnect, RuntimeError, OSError):
            # The device went before its welcome: no link opened, nothing is noted.
            log.info("peer %s closed before its welcome", grant.device_id)
            return None
        return grant, hello, nonce

    async def pair(self, ws: WebSocket) -> None:
        """Redeem a pairing code: the new peer proves its key, gets a token. A failed
        redemption (no invite for the code, a used or expired one, a broken frame) counts
        against its address as a failed link handshake does, and an address locked out is
        refused at the upgrade: each try cost an invite's read and a signature check."""
        refusal = _precheck(ws, self.allowed_hosts)
        if refusal is not None:
            await _deny(ws, refusal)
            return
        slot = await self._admit(ws)
        if slot is None:
            return
        try:
            await self._by_deadline(slot, self._pair(ws, slot))
        finally:
            self.slots.release(slot)

    async def _pair(self, ws: WebSocket, slot: Slot) -> None:
        b = self.backend
        await ws.accept()
        nonce = handshake.new_nonce(b.random(handshake.NONCE_BYTES))
        try:
            await ws.send_text(f.encode(handshake.challenge(b.identity, nonce)))
            request = await self._first_frame(ws, slot)
            if not isinstance(request, f.Pair):
                raise HandshakeRefused(Refusal.MALFORMED, f"expected pair, got {request.TYPE}")
            proof = handshake.accept_pair(b.identity, nonce, request)
            code_hash = proof.invite_hash
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
            await self._refuse_counted(ws, "pairing", exc)
        except BackendRefused as exc:
            await unavailable(ws, exc, "pairing")
        except WebSocketDisconnect:
            return


async def _refuse(ws: WebSocket, what: str,
                  exc: FrameError | HandshakeRefused | TimeoutError) -> None:
    """Refuse a handshake that broke the protocol or passed its deadline: an ``error``
    frame naming the reason, then close 1008 (with :data:`TIMEOUT_REASON` for a timeout)."""
    timed_out = isinstance(exc, TimeoutError)
    reason = "timeout" if timed_out else str(getattr(exc, "reason", "malformed"))
    log.info("%s refused: %s", what, reason)
    with contextlib.suppress(Exception):
        await ws.send_text(f.encode(f.Error(None, "forbidden", reason)))
        await ws.close(code=1008, reason=TIMEOUT_REASON if timed_out else "")
