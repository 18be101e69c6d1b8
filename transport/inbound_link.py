"""One authenticated inbound peer link on the server: a reader, a committer, a grant watcher.

The websocket endpoint (:mod:`.peer_ws`) checks the upgrade and runs the handshake;
once a peer is welcomed, its link runs here until it ends. The rules are the
receiver core's (:mod:`.receiver`); this module moves frames between the socket,
that core and the runtime (:class:`.peer_ws.PeerBackend`, each call in a worker
thread, never on the event loop). Consecutive deliveries are committed in one
batch and acknowledged in order after the commit, at most
:data:`UNCOMMITTED_LIMIT` read ahead of it; a database that fails a commit is
answered ``unavailable`` (close 1013). The watcher re-reads the grant's status
every :data:`STATUS_POLL_SECONDS` and closes the link (after a signed ``refused``
frame) once it is paused or revoked, or replaced by a new pairing of the device (the
link's token then opens nothing: ``unknown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketDisconnect

from . import frames as f
from . import receiver
from .errors import BackendRefused, GrantClosed
from .grants import GrantView, Refusal, status_refusal

if TYPE_CHECKING:
    from .peer_ws import PeerBackend

log = logging.getLogger("kinbox.peers")

UNCOMMITTED_LIMIT = 128
"""Deliveries of one link read and not yet committed. A sender keeps at most its window
(and a prefetch as large) unacknowledged, well under this; one that ignores it is not read
further until the committer catches up, so its frames wait in its own socket buffers, not
in this process's memory."""
STATUS_POLL_SECONDS = 0.25
"""How often a live link re-reads its grant (a revoke closes it within a second)."""

UNAVAILABLE = f.encode(f.Error(None, "unavailable", "this device cannot answer now; try "
                                                    "again later"))
"""What a peer hears when the database failed: no detail of it leaves this device."""


async def unavailable(ws: WebSocket, exc: BackendRefused, what: str) -> None:
    """The runtime could not answer (its database failed): tell the peer to try again
    later (a sender retries with its backoff), close 1013, and keep the details here."""
    log.warning("peer %s answered unavailable: %s", what, exc.message)
    with contextlib.suppress(Exception):
        await ws.send_text(UNAVAILABLE)
        await ws.close(code=1013)


async def receive_text(ws: WebSocket, timeout: float | None = None) -> str | bytes:
    """The next text (or bytes) message; :class:`WebSocketDisconnect` when the peer went."""
    message = await asyncio.wait_for(ws.receive(), timeout)
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    return message.get("text") if message.get("text") is not None else message.get("bytes", b"")


class InboundLink:
    """One authenticated link: a reader, a committer and a grant watcher."""

    def __init__(self, ws: WebSocket, backend: PeerBackend, grant: GrantView,
                 refusal: Callable[[Refusal], f.Refused]) -> None:
        self.ws = ws
        self.refusal = refusal
        """Signs the grant's refusal for this link's handshake (sent when it closes)."""
        self.b = backend
        self.device_id = grant.device_id
        self.token_hash = grant.token_hash
        """The grant this link was opened under: a new pairing of the device replaces it,
        and the link then has no grant, as its token opens none."""
        self.core = receiver.ReceiverLink(grant.device_id, grant.scopes)
        self.commits: asyncio.Queue[receiver.Commit] = asyncio.Queue(UNCOMMITTED_LIMIT)
        self.send_lock = asyncio.Lock()
        self.committing = asyncio.Lock()
        """Held by the committer from a batch's commit until its acks are sent: a grant
        closed meanwhile waits for it, so no committed delivery goes unacknowledged."""
        self.done = asyncio.Event()

    async def send(self, text: str) -> None:
        """Send one frame (the reader and the committer both send: one at a time)."""
        async with self.send_lock:
            await self.ws.send_text(text)

    async def run(self) -> None:
        """Carry the link until the peer goes, the link fails or its grant closes."""
        tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._commit()),
                 asyncio.create_task(self._watch())]
        try:
            await self.done.wait()
        finally:
            for t in tasks:
                t.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            for error in ended:
                # A failure that ended the link (a backend's unexpected error) was dropped
                # here in silence: the sender only saw its link close, and the log nothing.
                if isinstance(error, Exception):
                    log.error("the link from %s ended on an error (%s)", self.device_id,
                              type(error).__name__)
                    log.debug("the link from %s ended on an error", self.device_id,
                              exc_info=error)

    async def _read(self) -> None:
        try:
            while True:
                data = await receive_text(self.ws)
                for action in self.core.receive(data, self.b.now()):
                    if isinstance(action, receiver.Commit):
                        await self.commits.put(action)
                    elif isinstance(action, receiver.Send):
                        await self.send(action.text)
                    elif isinstance(action, receiver.Answer):
                        try:
                            status, text = await asyncio.to_thread(
                                self.b.answer, self.device_id, self.token_hash,
                                action.action)
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
                                                           self.token_hash,
                                                           batch)
                    except GrantClosed as exc:  # nothing of the batch was committed
                        closed: GrantClosed | None = exc
                    except BackendRefused as exc:
                        # Nothing acknowledged: the sender hears "try again later" (not a
                        # dropped link it cannot tell from anything else), and its rows go
                        # back with the backoff; a batch that commits after all is a repeat.
                        async with self.send_lock:
                            await unavailable(self.ws, exc, f"delivery from {self.device_id}")
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
                status = await asyncio.to_thread(self.b.grant_status, self.device_id,
                                                self.token_hash)
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
