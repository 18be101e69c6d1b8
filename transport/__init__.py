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

import importlib
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from .cron_http import CronBackend, cron_routes
    from .handshake_slots import HandshakeLimits
    from .host_guard import HostGuard
    from .host_names import allowed_name
    from .http_app import LOOPBACK_HOSTS, HttpBackend, Refusal, create_app
    from .identity import DeviceIdentity
    from .link import SenderLink
    from .operator_token import OperatorToken
    from .peer_ws import PeerBackend, PeerEndpoint
    from .receiver import ReceiverLink
    from .social_http import SocialBackend, social_routes

_ON_FIRST_USE = {
    "RUNS_LIMIT": ".page_limits",
    "CronBackend": ".cron_http",
    "cron_routes": ".cron_http",
    "HandshakeLimits": ".handshake_slots",
    "HostGuard": ".host_guard",
    "allowed_name": ".host_names",
    "LOOPBACK_HOSTS": ".http_app",
    "HttpBackend": ".http_app",
    "Refusal": ".http_app",
    "create_app": ".http_app",
    "DeviceIdentity": ".identity",
    "SenderLink": ".link",
    "OperatorToken": ".operator_token",
    "PeerBackend": ".peer_ws",
    "PeerEndpoint": ".peer_ws",
    "ReceiverLink": ".receiver",
    "SocialBackend": ".social_http",
    "social_routes": ".social_http",
}
"""Names imported when first used, as :mod:`kinbox.actors` does: the HTTP app brings
Starlette, the peer links websockets and cryptography, which a ``kinbox`` command that
reads or changes rows (and needs, say, only :mod:`.frames` to print a name) never uses.
The errors are imported at once: they are small, and any caller may catch them."""


def __getattr__(name: str) -> object:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))


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
