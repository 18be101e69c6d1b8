"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) lives here; it talks to the runtime only
through the :class:`FocalBackend` protocol, so this package never imports
``kinbox.actors`` or ``kinbox.persistence``. Peer links arrive with their issue.
"""

from .cron_http import CronBackend, cron_routes
from .errors import BackendRefused, SignatureProblem, SignatureRejected, TransportError
from .http_app import LOOPBACK_HOSTS, FocalBackend, Refusal, create_app
from .social_http import SocialBackend, social_routes

__all__ = ["LOOPBACK_HOSTS", "BackendRefused", "CronBackend", "FocalBackend", "Refusal",
           "SignatureProblem", "SignatureRejected", "SocialBackend", "TransportError",
           "create_app", "cron_routes", "social_routes"]
