"""kinbox.transport: what crosses a process boundary.

The HTTP API (:func:`create_app`) lives here; it talks to the runtime only
through the :class:`HttpBackend` protocol, so this package never imports
``kinbox.actors`` or ``kinbox.persistence``. The Host check
(:class:`HostGuard`) and the operator token (:class:`OperatorToken`) are
its two gates. Peer links arrive with their issue.
"""

from .host_guard import HostGuard, allowed_name
from .http_app import LOOPBACK_HOSTS, HttpBackend, create_app
from .operator_token import OperatorToken

__all__ = ["LOOPBACK_HOSTS", "HostGuard", "HttpBackend", "OperatorToken", "allowed_name",
           "create_app"]
