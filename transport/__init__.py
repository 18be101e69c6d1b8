"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) lives here; it talks to the runtime only
through the :class:`FocalBackend` protocol, so this package never imports
``kinbox.actors`` or ``kinbox.persistence``. Peer links arrive with their issue.
"""

from .http_app import LOOPBACK_HOSTS, FocalBackend, create_app

__all__ = ["LOOPBACK_HOSTS", "FocalBackend", "create_app"]
