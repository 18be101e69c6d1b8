"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) and the peer links between devices: the
device identity (:class:`DeviceIdentity`, :mod:`.key_file`), grants and
tokens (:mod:`.grants`), the wire frames (:mod:`.frames`), the handshake
(:mod:`.handshake`), the sans-I/O link cores (:class:`SenderLink`,
:class:`ReceiverLink`), and their websockets adapters (:class:`PeerEndpoint`
for the server, :mod:`.peer_client` for the client). Transport talks to the
runtime only through the :class:`FocalBackend` and :class:`PeerBackend`
protocols, so this package never imports ``kinbox.actors`` or
``kinbox.persistence``. Its errors derive from :class:`TransportError`.
"""

from .errors import (
    FrameError,
    HandshakeRefused,
    IdentityError,
    LinkStateError,
    PeerUnavailable,
    TransportError,
)
from .http_app import LOOPBACK_HOSTS, FocalBackend, create_app
from .identity import DeviceIdentity
from .link import SenderLink
from .peer_ws import PeerBackend, PeerEndpoint
from .receiver import ReceiverLink

__all__ = [
    "LOOPBACK_HOSTS",
    "DeviceIdentity",
    "FocalBackend",
    "FrameError",
    "HandshakeRefused",
    "IdentityError",
    "LinkStateError",
    "PeerBackend",
    "PeerEndpoint",
    "PeerUnavailable",
    "ReceiverLink",
    "SenderLink",
    "TransportError",
    "create_app",
]
