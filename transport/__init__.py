"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) lives here; it talks to the runtime only
through the :class:`HttpBackend` protocol, so this package never imports
``kinbox.actors`` or ``kinbox.persistence``. The Host check
(:class:`HostGuard`) and the operator token (:class:`OperatorToken`) are
its two gates. Peer links arrive with their issue.
"""

from .cron_http import CronBackend, cron_routes
from .errors import BackendRefused, SignatureProblem, SignatureRejected, TransportError
from .host_guard import HostGuard, allowed_name
from .http_app import LOOPBACK_HOSTS, HttpBackend, Refusal, create_app
from .operator_token import OperatorToken
from .social_http import SocialBackend, social_routes

__all__ = ["LOOPBACK_HOSTS", "BackendRefused", "CronBackend", "HostGuard", "HttpBackend",
           "OperatorToken", "Refusal", "SignatureProblem", "SignatureRejected",
           "SocialBackend", "TransportError", "allowed_name", "create_app", "cron_routes",
           "social_routes"]
