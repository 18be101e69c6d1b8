"""Errors of the transport layer (it cannot import the actors' or persistence's trees).

::

    TransportError
    ├── SignatureRejected   a webhook delivery is unsigned, stale, forged or replayed;
    │                       .reason is a SignatureProblem
    └── BackendRefused      a backend refuses a request; .status (4xx/5xx), .code, .message

The actors layer raises :class:`BackendRefused` from the backends it hands
to the HTTP routes, translating its own errors, so the routes answer with a
precise status without knowing the runtime's error classes.
"""

from __future__ import annotations

import enum


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
    """A backend refused the request: answer ``status`` with ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
