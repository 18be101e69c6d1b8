"""Errors of the transport layer (it cannot import the actors' or persistence's trees).

Transport cannot import ``kinbox.persistence`` (where ``KinboxError`` lives),
so it has its own root; the actors layer wraps what reaches users. "The peer
sent garbage" (:class:`FrameError`, :class:`HandshakeRefused`) is kept apart
from "you misused it" (:class:`LinkStateError`)::

    TransportError
    ├── SignatureRejected  a webhook delivery is unsigned, stale, forged or replayed;
    │                      .reason is a SignatureProblem
    ├── BackendRefused     a backend refuses a request; .status (4xx/5xx), .code, .message,
    │                      .field (the request's field it refuses, or None)
    ├── IdentityError      a device key file or public key is unusable
    ├── FrameError         a frame broke the wire format; .reason says how
    ├── HandshakeRefused   a handshake or pairing step failed; .reason says which
    ├── GrantClosed        a live link's grant was paused or revoked; .status
    ├── LinkStateError     a link core was driven out of order (a caller's bug)
    ├── PeerUnavailable    the peer could not be reached or refused the link; .status
    │   └── PeerBusy       it answered 503 ``busy`` (no handshake slot free); .retry_after
    └── ExposedWithoutToken  an app would answer names other machines reach with no
                           operator token; .hosts; also a ValueError

The actors layer raises :class:`BackendRefused` from the backends it hands
to the HTTP routes, translating its own errors, so the routes answer with a
precise status without knowing the runtime's error classes.

An error that quotes what a caller sent (a path, a Host, an id, a field's
name) quotes it through :func:`clipped` or :func:`quoted`: a client's runaway
value must not come back whole in the answer, or into a log line.
"""

from __future__ import annotations

import enum

QUOTE_LIMIT = 80
"""Characters of a caller's value an error message quotes (:func:`clipped`)."""


def clipped(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` for an error message, cut to ``limit`` characters with the length it had
    (``kinbox.actors.validation.quoted`` is the same rule for the actors' errors: the
    pure modules of two layers cannot share one function)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)``, :func:`clipped`."""
    return clipped(repr(value), limit)


class TransportError(Exception):
    """Base class of every error raised by ``kinbox.transport``."""


class SignatureProblem(enum.Enum):
    """Why a webhook signature was refused."""

    MISSING = "unsigned"
    MALFORMED = "malformed_signature"
    STALE = "stale"
    MISMATCH = "bad_signature"
    REPLAYED = "replayed"


class SignatureRejected(TransportError):
    """A webhook delivery failed the signature check; nothing was queued."""

    def __init__(self, reason: SignatureProblem, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class BackendRefused(TransportError):
    """A backend refused the request: answer ``status`` with ``code`` and ``message``, and
    with ``field`` when the refusal is of one field of the request (a client decides on it,
    never on the message)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class IdentityError(TransportError):
    """A device key file or a public key cannot be used."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class FrameError(TransportError):
    """A frame broke the wire format. ``reason`` is a stable code (``too_large``...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"bad frame ({reason})" + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


class HandshakeRefused(TransportError):
    """A handshake or pairing step failed. ``reason`` is a :class:`~.grants.Refusal` value."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"handshake refused ({reason})" + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


class GrantClosed(TransportError):
    """The grant of a live link is no longer active (``status``: ``paused``, ``revoked``,
    or None when it is gone): deliveries are no longer committed for it."""

    def __init__(self, status: str | None) -> None:
        super().__init__(f"the device's grant is {status or 'gone'}")
        self.status = status


class LinkStateError(TransportError):
    """A link core got an input its state does not allow."""

    def __init__(self, state: str, event: str) -> None:
        super().__init__(f"link in state {state!r} cannot handle {event!r}")
        self.state = state
        self.event = event


class ExposedWithoutToken(TransportError, ValueError):
    """An app was asked to answer ``hosts``, names other machines reach, without an operator
    token: its reads hold message bodies and a state change needs only ``X-Kinbox: 1``, so
    anyone who reaches it would read and write. Give a token, or say that something in front
    of the app authenticates every request (``allow_unauthenticated=True``)."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        super().__init__(
            f"the app would answer {', '.join(clipped(h) for h in hosts)} without an operator "
            "token: anyone who reaches it reads and writes; give operator="
            "OperatorToken.from_secret(...), or allow_unauthenticated=True when a proxy in "
            "front of it authenticates every request"
        )
        self.hosts = hosts


class PeerUnavailable(TransportError):
    """The peer could not be reached, or its address refused the upgrade (``status``, the
    HTTP status). Never final by itself: only a refusal the peer signs ends a pairing."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(f"peer unavailable ({reason})")
        self.reason = reason
        self.status = status


class PeerBusy(PeerUnavailable):
    """The peer's address answered 503 ``busy``: a kinbox serve whose handshake slots are
    all taken (see ``handshake_slots``); or 429 ``too_many_tries``: one that refuses this
    address's handshakes for a while, after too many failed ones from it (see
    ``token_tries``; another client at the address, behind the same NAT, may have failed
    them). Healthy, only loaded: no attempt failed, nothing is wrong with the pairing.
    ``retry_after``: the seconds its ``Retry-After`` asked to wait (None when it gave no
    usable one); ``status``: 503 or 429."""

    def __init__(self, reason: str, *, retry_after: float | None, status: int = 503) -> None:
        super().__init__(reason, status=status)
        self.retry_after = retry_after
