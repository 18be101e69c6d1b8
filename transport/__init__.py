"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) and the peer links between devices. The
HTTP app talks to the runtime only through backend protocols
(:class:`HttpBackend`, :class:`CronBackend`, :class:`SocialBackend`,
:class:`PeerBackend`), so this package never imports ``kinbox.actors`` or
``kinbox.persistence``; the Host check (:class:`HostGuard`) and the operator
token (:class:`OperatorToken`) are its gates. Peers: the device identity
(:class:`DeviceIdentity`, :mod:`.key_file`), grants and tokens
(:mod:`.grants`), the wire frames (:mod:`.frames`), the handshake
(:mod:`.handshake`) and its limits (:class:`HandshakeLimits`), the sans-I/O
link cores (:class:`SenderLink`, :class:`ReceiverLink`) and their websockets
adapters (:class:`PeerEndpoint` for the server, :mod:`.peer_client` for the client).
Its errors derive from :class:`TransportError`.
"""

from .cron_http import RUNS_LIMIT, CronBackend, cron_routes
from .errors import (
    BackendRefused,
    ExposedWithoutToken,
    FrameError,
    GrantClosed,
    HandshakeRefused,
    IdentityError,
    LinkStateError,
    PeerBusy,
    PeerUnavailable,
    SignatureProblem,
    SignatureRejected,
    TransportError,
)
from .handshake_slots import HandshakeLimits
from .host_guard import HostGuard, allowed_name
from .http_app import LOOPBACK_HOSTS, HttpBackend, Refusal, create_app
from .identity import DeviceIdentity
from .link import SenderLink
from .operator_token import OperatorToken
from .peer_ws import PeerBackend, PeerEndpoint
from .receiver import ReceiverLink
from .social_http import SocialBackend, social_routes

__all__ = [
    "LOOPBACK_HOSTS",
    "RUNS_LIMIT",
    "BackendRefused",
    "CronBackend",
    "DeviceIdentity",
    "ExposedWithoutToken",
    "FrameError",
    "GrantClosed",
    "HandshakeLimits",
    "HandshakeRefused",
    "HostGuard",
    "HttpBackend",
    "IdentityError",
    "LinkStateError",
    "OperatorToken",
    "PeerBackend",
    "PeerBusy",
    "PeerEndpoint",
    "PeerUnavailable",
    "ReceiverLink",
    "Refusal",
    "SenderLink",
    "SignatureProblem",
    "SignatureRejected",
    "SocialBackend",
    "TransportError",
    "allowed_name",
    "create_app",
    "cron_routes",
    "social_routes",
]
