"""The client side of peer links: blocking websockets connections for the link actor.

Thin: :func:`connect_link` opens ``/peers/link`` with the bearer token in
the ``Authorization`` header and turns every way the peer can refuse into
:class:`PeerUnavailable` (an address's refusal, never final: see :mod:`.link`);
:func:`pair_with` runs the pairing steps of :mod:`.handshake` over
``/peers/pair``. The link protocol itself is :class:`~.link.SenderLink`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from . import frames as f
from . import handshake
from .errors import FrameError, HandshakeRefused, PeerBusy, PeerUnavailable
from .grants import HTTP_STATUS, Refusal
from .identity import DeviceIdentity
from .invite_code import InviteCode

OPEN_TIMEOUT = 5.0
KEEPALIVE_SECONDS = 20.0
"""Seconds between keepalive pings on a link, and how long a pong may take."""


def endpoint(url: str, path: str) -> str:
    """The websocket URL of ``path`` on a peer given as ``http(s)://`` or ``ws(s)://``;
    :class:`ValueError` when ``url`` is not such an address (no host, a port that is not
    0..65535, a bracketed host that is no IP address)."""
    problem = ValueError(f"a peer URL looks like http://host:port, got {_without_login(url)!r}")
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- read only to refuse a port that is no number 0..65535
    except ValueError:  # urlsplit and .port refuse with a bare ValueError of their own
        raise problem from None
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise problem
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


def _without_login(url: str) -> str:
    """``url`` as an error may quote it: a user and password before the host are ``***``
    (a malformed address is refused, and quoted, before the one with a login is). Up to
    the last ``@``: a password typed with a ``/``, ``?`` or ``#`` in it (not encoded)
    ends the address's authority early, and was quoted from that character on."""
    return re.sub(r"//.*@", "//***@", url, flags=re.DOTALL)


_BUSY = frozenset((HTTP_STATUS[r], r.value) for r in (Refusal.BUSY, Refusal.TOO_MANY_TRIES))
"""The upgrade refusals of a receiver that is up and asks to be tried again later."""


def _refusal(exc: InvalidStatus) -> PeerUnavailable:
    status = exc.response.status_code
    try:
        reason = str(json.loads(exc.response.body or b"{}").get("error", status))
    except (ValueError, AttributeError):
        reason = str(status)
    # The code of its JSON answer, not text: a kinbox serve out of handshake slots, or
    # refusing this address's handshakes for a while (too many failed ones from it).
    if (status, reason) in _BUSY:
        return PeerBusy(reason, retry_after=_seconds(exc.response.headers.get("Retry-After")),
                        status=status)
    return PeerUnavailable(f.shown(reason), status=status)


def _seconds(value: str | None) -> float | None:
    """A ``Retry-After`` of whole seconds (what a kinbox serve sends), else None."""
    if value is None or not value.strip().isdigit() or len(value.strip()) > 9:
        return None
    return float(value.strip())


def _open(uri: str, headers: dict[str, str] | None, timeout: float) -> ClientConnection:
    try:
        # Keepalive pings: a link that goes silent without a close or a reset (a laptop
        # asleep, a NAT that forgot the flow) is lost within ping_interval + ping_timeout,
        # and its rows go back with a retry, instead of staying leased (renewed) forever.
        # ``legacy=True``: the link owns the connection (it closes it), not a ``with``
        # block, which websockets 17.1 made the default's only undeprecated use.
        return connect(uri, additional_headers=headers, open_timeout=timeout, proxy=None,
                       compression=None, max_size=f.MAX_FRAME_BYTES,
                       ping_interval=KEEPALIVE_SECONDS, ping_timeout=KEEPALIVE_SECONDS,
                       close_timeout=2, legacy=True)
    except InvalidStatus as exc:
        raise _refusal(exc) from None
    except WebSocketException as exc:
        # No websocket upgrade: another service at the address (a wrong port, a stale
        # URL), or a kinbox serve that closed mid-handshake (stopping); a bare
        # "InvalidMessage" told an operator nothing.
        raise PeerUnavailable("cannot connect: the address did not complete a kinbox "
                              "serve's handshake (another service there, or a serve "
                              f"stopping) ({type(exc).__name__})") from None
    except (OSError, TimeoutError) as exc:
        raise PeerUnavailable(f"cannot connect: {type(exc).__name__}") from None


@contextmanager
def connect_link(url: str, token: str, timeout: float = OPEN_TIMEOUT,
                 in_flight: tuple[str, ...] = ()) -> Iterator[ClientConnection]:
    """Open the link websocket (closed on exit); the handshake frames follow on it.
    ``in_flight``: the ids of the rows the link carries (:data:`.frames.IN_FLIGHT_HEADER`),
    from :meth:`.link.SenderLink.in_flight`."""
    headers = {"Authorization": f"Bearer {token}"}
    if in_flight:
        headers[f.IN_FLIGHT_HEADER] = " ".join(in_flight)
    with _open(endpoint(url, "/peers/link"), headers, timeout) as ws:
        yield ws


def pair_with(url: str, identity: DeviceIdentity, code: InviteCode, name: str, nonce: str,
              timeout: float = OPEN_TIMEOUT) -> f.Paired:
    """Redeem ``code`` at the peer; the checked ``paired`` frame (its key and our token).
    HandshakeRefused (``wrong_device``), with nothing sent, when another device than the
    code names answers at ``url``."""
    with _open(endpoint(url, "/peers/pair"), None, timeout) as ws:
        return _pair(ws, identity, code, name, nonce, timeout)


def _pair(ws: ClientConnection, identity: DeviceIdentity, code: InviteCode, name: str,
          nonce: str, timeout: float) -> f.Paired:
    try:
        ch = f.parse(ws.recv(timeout))
        if not isinstance(ch, f.Challenge):
            raise HandshakeRefused("malformed", f"expected challenge, got {ch.TYPE}")
        request = handshake.pair(identity, ch, code, nonce, name)
        ws.send(f.encode(request))
        answer = f.parse(ws.recv(timeout))
        if isinstance(answer, f.Error) and answer.code == "unavailable":
            # The device could not store the pairing (its database failed): the code is
            # not spent, and the same command may be run again.
            raise PeerUnavailable("pairing failed: the device is unavailable now; try again "
                                  "later with the same code")
        if isinstance(answer, f.Error):
            # Whatever answers at the address wrote it: escaped before anyone shows it.
            raise HandshakeRefused(f.shown(answer.message or answer.code))
        if not isinstance(answer, f.Paired):
            raise HandshakeRefused("malformed", f"expected paired, got {answer.TYPE}")
        handshake.check_paired(identity, ch, code, request, answer)
        return answer
    except (TimeoutError, WebSocketException, FrameError) as exc:
        # The other device may have paired us and lost only its answer: it answers the
        # same code from this key again, so the same command may be run again.
        raise PeerUnavailable(f"pairing failed: {type(exc).__name__}; the same command, "
                              "with the same code, may be run again") from None
