"""The sending side of a peer link as a sans-I/O state machine.

Bytes and events in, frames and effect records out; no sockets, threads or
clocks (the shape of websockets' ``protocol.py``). The adapter feeds it
``connected()``, every received text (``receive``) and ``connection_lost``,
offers it claimed outbound rows (``offer``), and then drains
``frames_to_send()`` onto the socket and ``effects()`` into the journal.

States and legal inputs (anything else raises :class:`LinkStateError` and
leaves the state as it was)::

    IDLE       --connected-->        HANDSHAKE  (waiting for the challenge)
    HANDSHAKE  --challenge-->        HANDSHAKE  (hello sent, waiting for welcome)
    HANDSHAKE  --welcome-->          OPEN       (window flushed)
    HANDSHAKE  --committed-->        HANDSHAKE  (which named rows the peer has)
    HANDSHAKE  --refused (signed)--> CLOSED     (terminal: every leased row fails but
                                                 those the peer said it committed, of
                                                 the ids ``connected`` named: acked)
    HANDSHAKE  --anything else-->    IDLE       (retried: nothing proves who refused)
    OPEN       --ack/error/result--> OPEN
    OPEN       --error naming no id--> IDLE     (leased rows retried: none will be acked)
    OPEN       --refused (signed)--> CLOSED     (the grant closed: every leased row fails)
    any        --connection_lost-->  IDLE       (leased rows retried by the journal)
    any        --busy-->             IDLE       (held rows postponed: no attempt counted)
    any        --stopped-->          IDLE       (held rows released: no attempt counted)

Only the pinned key ends a pairing: a refusal at the upgrade, an unsigned
``forbidden`` error, a challenge from another device, a bad signature or a
``refused`` frame the key did not sign could come from whoever holds the
peer's address now (a stale URL, a stranger on the LAN) or relays between
the devices, so they are retried like a dropped link, flagged ``unproven``
for the operator. A ``503 busy`` at the upgrade (``busy``) is none of these: the
receiver is up and out of handshake slots for now, so the rows wait the time it asked
(:func:`busy_wait`), uncounted and unflagged; and so is a ``429 too_many_tries``, a
receiver that refuses this address's handshakes for a while after too many failed ones
(another client behind the same address may have failed them).

The window: at most ``window`` ``deliver`` frames are unacknowledged at
once. Resume: a row that was sent but not acknowledged when the link
dropped is handed back for a retry; the journal's backoff (2 ... 2048 s,
then 3600 s, 48 attempts: ``inbox_core.PEER``) decides when it comes back,
and the receiver's idempotent ids make the resend harmless.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum

from . import frames as f
from . import handshake
from .errors import FrameError, HandshakeRefused, LinkStateError
from .grants import Refusal
from .handshake_slots import HANDSHAKE_TIMEOUT
from .identity import DeviceIdentity

BUSY_WAIT_LIMIT = 3600.0
"""The longest a busy answer's ``Retry-After`` is obeyed, in seconds (the peer backoff's
cap): anything at the address can answer busy, and a day-long wait asked by one would
hold the device's rows for a day."""


BUSY_REASONS = {
    Refusal.BUSY.value: "busy (no handshake slot free)",
    Refusal.TOO_MANY_TRIES.value: "refusing this address's handshakes for a while (too "
    "many failed ones came from it; another client behind the same address may have made "
    "them)",
}
"""What a receiver that asked to be tried again later is (``the peer is ...``), by its
refusal's code: one wording for the logs, a tool's error and a pairing's."""


def busy_wait(retry_after: float | None) -> float:
    """Seconds a link answered ``503 busy`` waits before it dials again: what the receiver
    asked (its earliest handshake deadline), at least 1 s; without a usable
    ``Retry-After``, a handshake's deadline (a slot is free by then at the latest)."""
    if retry_after is None:
        return HANDSHAKE_TIMEOUT
    return min(max(retry_after, 1.0), BUSY_WAIT_LIMIT)


class LinkState(StrEnum):
    """Where the link is."""

    IDLE = "idle"
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Outgoing:
    """A claimed outbound row to carry."""

    id: str
    text: str
    session: str | None = None


@dataclass(frozen=True)
class Acked:
    """The receiver committed these rows: acknowledge them in the journal."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class Rejected:
    """The receiver refused this row's payload: it fails at once."""

    id: str
    reason: str


@dataclass(frozen=True)
class Retry:
    """The link dropped or could not open: these rows count a failed attempt (there may be
    none: ``reason`` still says why the link ended, for a caller waiting on an answer).

    ``unproven``: something at the peer's address refused us or answered as another
    device without the pinned key's signature; worth telling the operator, who may have
    a stale URL or a stranger on it, but no reason to give the pairing up.
    """

    ids: tuple[str, ...]
    reason: str
    unproven: bool = False


@dataclass(frozen=True)
class Released:
    """The adapter stopped carrying these rows for a reason of its own (its process is
    stopping, the grant closed on this side): they go back unrun, no attempt counted, for
    the next link to send at once. Nothing about them or the peer failed."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class Postponed:
    """The receiver is busy (no handshake slot free): these rows go back unrun, no attempt
    counted, due no sooner than ``wait`` seconds from now, which the link must not dial
    before. Nothing about them or the pairing failed."""

    ids: tuple[str, ...]
    wait: float
    reason: str


@dataclass(frozen=True)
class Terminal:
    """The peer refused us for good (revoked, paused, unknown): rows fail, the link closes.

    ``status`` is what the sender records for the device: ``paused`` when the
    receiver paused our grant (an operator may resume it), else ``revoked``.
    """

    ids: tuple[str, ...]
    reason: str
    status: str = "revoked"


@dataclass(frozen=True)
class Answer:
    """The result of a ``read`` or ``stop`` request."""

    frame: f.Result


Effect = Acked | Postponed | Rejected | Released | Retry | Terminal | Answer


class SenderLink:
    """One outbound link to a paired device."""

    def __init__(self, identity: DeviceIdentity, server_id: str, pinned_key: str, token: str,
                 window: int = 64, prefetch: int = 0) -> None:
        if window < 1 or prefetch < 0:
            raise ValueError("window must be >= 1 and prefetch >= 0")
        self.prefetch = prefetch
        self.identity = identity
        self.server_id = server_id
        self.pinned_key = pinned_key
        self.token = token
        self.window = window
        self.state = LinkState.IDLE
        self._queued: OrderedDict[str, Outgoing] = OrderedDict()
        self._inflight: OrderedDict[str, Outgoing] = OrderedDict()
        self._out: list[str] = []
        self._effects: list[Effect] = []
        self._challenge: f.Challenge | None = None
        self._hello: f.Hello | None = None
        self._nonce = ""
        self._draining = False
        self._named: tuple[str, ...] = ()
        self._committed: f.Committed | None = None

    # -- inputs ----------------------------------------------------------------------------

    def in_flight(self) -> tuple[str, ...]:
        """The ids for the upgrade to name (:data:`.frames.IN_FLIGHT_HEADER`): the rows held
        now, any of which a link lost before may have delivered unacknowledged."""
        return f.in_flight_header(self.held())

    def connected(self, client_nonce: str, named: tuple[str, ...] = ()) -> None:
        """The socket is open, its upgrade having named ``named`` (:meth:`in_flight`); wait
        for the server's challenge."""
        self._require(LinkState.IDLE, "connected")
        self.state = LinkState.HANDSHAKE
        self._nonce = client_nonce
        self._challenge = self._hello = None
        self._named, self._committed = named, None

    def offer(self, rows: list[Outgoing]) -> None:
        """Rows to carry, in journal order; rows already held are ignored."""
        if self.state is LinkState.CLOSED:
            raise LinkStateError(self.state.value, "offer")
        for row in rows:
            if row.id not in self._queued and row.id not in self._inflight:
                self._queued[row.id] = row
        self._flush()

    def drain(self) -> None:
        """Send no more ``deliver`` frames (the grant closed on this side): the rows in
        flight still settle by their acks, errors or the link's loss; the queued ones stay
        held, unsent, for the adapter to hand back."""
        self._draining = True

    def drained(self) -> bool:
        """Draining, and no ``deliver`` frame is waiting for its answer."""
        return self._draining and not self._inflight

    def request(self, frame: f.Read | f.Stop | f.Ping) -> None:
        """Send a ``read``, ``stop`` or ``ping`` on an open link."""
        self._require(LinkState.OPEN, "request")
        self._out.append(f.encode(frame))

    def receive(self, data: bytes | str) -> None:
        """A message arrived from the peer."""
        if self.state not in (LinkState.HANDSHAKE, LinkState.OPEN):
            raise LinkStateError(self.state.value, "receive")
        try:
            frame = f.parse(data)
        except FrameError as exc:
            self._lost(f"the peer sent a bad frame ({exc.reason})")
            return
        if self.state is LinkState.HANDSHAKE:
            self._handshake(frame)
        elif isinstance(frame, f.Refused):  # the grant closed while the link was open
            self._refused(frame)
        elif isinstance(frame, f.Ack):
            self._ack(frame.id)
        elif isinstance(frame, f.Error):
            self._error(frame)
        elif isinstance(frame, f.Result):
            self._effects.append(Answer(frame))
        elif isinstance(frame, f.Ping):
            self._out.append(f.encode(f.Pong(frame.req)))
        # pong and anything else a sender need not act on are ignored

    def refused(self, reason: str) -> None:
        """The upgrade request was refused with ``reason``: retried like a lost link, since
        an HTTP answer proves nothing about who sent it (a peer refuses for good by signing
        a ``refused`` frame in the handshake)."""
        self._lost(f"the peer's address refused the connection ({reason})", unproven=True)

    def busy(self, retry_after: float | None, reason: str = Refusal.BUSY.value) -> None:
        """The upgrade was answered ``503 busy`` or ``429 too_many_tries`` (``reason``;
        ``retry_after``: its ``Retry-After`` seconds, None without one): every held row
        waits :func:`busy_wait`, uncounted."""
        self._out.clear()
        self._effects.append(Postponed(self._settle_all(), busy_wait(retry_after),
                                       f"the peer is {BUSY_REASONS.get(reason, reason)}"))
        if self.state is not LinkState.CLOSED:
            self.state = LinkState.IDLE

    def connection_lost(self, reason: str) -> None:
        """The socket closed or could not be opened."""
        if self.state is not LinkState.CLOSED:
            self._lost(reason)

    def stopped(self) -> None:
        """The adapter stops carrying this link (its process is stopping, or the grant
        closed here and the drain ended), whatever the socket did meanwhile: a socket its
        own stop closed is no lost link. Every row still held goes back unrun."""
        self._out.clear()
        held = self._settle_all()
        if held:
            self._effects.append(Released(held))
        if self.state is not LinkState.CLOSED:
            self.state = LinkState.IDLE

    # -- outputs ---------------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        """Encoded frames to write, in order; draining empties the list."""
        out, self._out = self._out, []
        return out

    def effects(self) -> list[Effect]:
        """What the adapter must do to the journal; draining empties the list."""
        out, self._effects = self._effects, []
        return out

    def capacity(self) -> int:
        """How many more rows the adapter may claim and offer now.

        Up to ``window`` rows in flight plus ``prefetch`` queued behind them, so
        the next frames are at hand the moment acks free the window; none while draining.
        """
        if self._draining:
            return 0
        return max(0, self.window + self.prefetch - len(self._inflight) - len(self._queued))

    def held(self) -> list[str]:
        """Ids of every row offered and not yet settled."""
        return [*self._inflight, *self._queued]

    # -- internals -------------------------------------------------------------------------

    def _require(self, state: LinkState, event: str) -> None:
        if self.state is not state:
            raise LinkStateError(self.state.value, event)

    def _handshake(self, frame: f.Frame) -> None:
        try:
            if isinstance(frame, f.Challenge) and self._challenge is None:
                self._challenge = frame
                self._hello = handshake.hello(self.identity, frame, self.token, self._nonce,
                                              self.server_id)
                self._out.append(f.encode(self._hello))
            elif isinstance(frame, f.Welcome) and self._challenge and self._hello:
                handshake.check_welcome(self.identity, self._challenge, self._hello, self.token,
                                        frame, self.pinned_key)
                self.state = LinkState.OPEN
                self._flush()
            elif (isinstance(frame, f.Committed) and self._hello and self._named
                  and self._committed is None and set(frame.ids) <= set(self._named)):
                self._committed = frame  # believed once the refusal's signature covers it
            elif isinstance(frame, f.Refused) and self._challenge and self._hello:
                self._refused(frame)
            elif isinstance(frame, f.Error):
                self._lost(f"the peer refused the handshake ({frame.code}: "
                           f"{f.shown(frame.message)})", unproven=frame.code == "forbidden")
            else:
                self._lost(f"unexpected {frame.TYPE} frame during the handshake")
        except HandshakeRefused as exc:
            # Whoever answers is not the device we paired with (or cannot prove it): the
            # pairing stands, and the rows wait for the real peer with the backoff.
            self._lost(f"the peer's address did not prove the paired key ({exc.reason}: "
                       f"{exc})", unproven=True)

    def _refused(self, frame: f.Refused) -> None:
        """A refusal: final if the pinned key signed it for this link's handshake."""
        assert self._challenge is not None and self._hello is not None
        committed = self._committed if self.state is LinkState.HANDSHAKE else None
        try:
            why = handshake.check_refused(self.identity, self._challenge, self._hello,
                                          self.token, frame, self.pinned_key, committed)
        except HandshakeRefused as exc:
            self._lost(f"a refusal the paired key did not sign ({exc.reason})", unproven=True)
            return
        if committed is not None and committed.ids:  # delivered before a lost link's acks
            for mid in committed.ids:  # could say so (a read's link holds none of them)
                self._queued.pop(mid, None)
                self._inflight.pop(mid, None)
            self._effects.append(Acked(tuple(committed.ids)))
        self._terminal(f"the peer refused this device ({why.value})",
                       "paused" if why is Refusal.PAUSED else "revoked")

    def _flush(self) -> None:
        if self.state is not LinkState.OPEN or self._draining:
            return
        while self._queued and len(self._inflight) < self.window:
            mid, row = self._queued.popitem(last=False)
            try:
                frame = f.encode(f.Deliver(row.id, row.text, row.session))
            except FrameError as exc:
                self._effects.append(Rejected(mid, f"the message cannot be sent ({exc.reason})"))
                continue
            self._inflight[mid] = row
            self._out.append(frame)

    def _ack(self, mid: str) -> None:
        if self._inflight.pop(mid, None) is not None:
            self._effects.append(Acked((mid,)))
            self._flush()

    def _error(self, frame: f.Error) -> None:
        if frame.id is not None and frame.id in self._inflight:
            self._inflight.pop(frame.id)
            # The peer's words end in the row's last_error, which terminals show: escaped.
            said = f.shown(frame.message)
            if frame.code == "rejected":
                self._effects.append(Rejected(frame.id, said or "rejected by the peer"))
            else:
                self._effects.append(Retry((frame.id,), f"{frame.code}: {said}"))
            self._flush()
        elif frame.id is None:
            # The peer could not take something we sent and says not what (a receiver of
            # another version answering ``bad_frame``): the rows in flight will never be
            # acknowledged on this link, so it is broken, and they go back with a retry.
            self._lost(f"the peer answered {frame.code}: {f.shown(frame.message)}")

    def _settle_all(self) -> tuple[str, ...]:
        ids = (*self._inflight, *self._queued)
        self._inflight.clear()
        self._queued.clear()
        return ids

    def _lost(self, reason: str, *, unproven: bool = False) -> None:
        self._out.clear()  # meant for the socket that is gone, not the next one
        self._effects.append(Retry(self._settle_all(), reason, unproven))
        self.state = LinkState.IDLE

    def _terminal(self, reason: str, status: str = "revoked") -> None:
        self._out.clear()
        self._effects.append(Terminal(self._settle_all(), reason, status))
        self.state = LinkState.CLOSED


__all__ = ["BUSY_REASONS", "BUSY_WAIT_LIMIT", "Acked", "Answer", "LinkState", "Outgoing",
           "Postponed", "Refusal", "Rejected", "Released", "Retry", "SenderLink", "Terminal",
           "busy_wait"]
