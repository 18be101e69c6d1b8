"""Webhook signatures, as the big chat platforms sign their deliveries (pure).

A delivery carries two headers: ``X-Kinbox-Timestamp`` (Unix seconds) and
``X-Kinbox-Signature: v1=<hex>`` (hex digits in either case), the HMAC-SHA256,
under the platform's secret, of ``v1:<timestamp>:`` followed by the raw body (the
scheme Slack uses; GitHub's and Stripe's differ only in naming). A delivery is refused
when a header is missing or malformed, when its timestamp is more than the
replay window (5 minutes) away from now, when the signature does not match
(compared in constant time), or when the same signature was already
accepted within the window (a replay). ``now`` is an argument: no clock here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from typing import Any

from .errors import SignatureProblem, SignatureRejected

TIMESTAMP_HEADER = "x-kinbox-timestamp"
SIGNATURE_HEADER = "x-kinbox-signature"
VERSION = "v1"
SIGNATURE_FORM = re.compile(rf"{VERSION}=[0-9a-fA-F]{{64}}")
"""A signature header's form: the version, then the 64 hex digits of an HMAC-SHA256."""
REPLAY_WINDOW = 300.0
"""Seconds a delivery's timestamp may differ from now (and how long a signature is remembered)."""


def sign(secret: bytes, timestamp: int | str, body: bytes) -> str:
    """The signature header value of ``body`` sent at ``timestamp``."""
    base = f"{VERSION}:{timestamp}:".encode() + body
    return f"{VERSION}=" + hmac.new(secret, base, hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str | None, signature: str | None, body: bytes,
           now: float, window: float = REPLAY_WINDOW) -> int:
    """Check a delivery's headers; the timestamp if good, else :class:`SignatureRejected`."""
    if not timestamp or not signature:
        raise SignatureRejected(SignatureProblem.MISSING,
                                f"the delivery needs the {TIMESTAMP_HEADER} and "
                                f"{SIGNATURE_HEADER} headers")
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise SignatureRejected(SignatureProblem.MALFORMED,
                                f"{TIMESTAMP_HEADER} must be Unix seconds")
    if not SIGNATURE_FORM.fullmatch(signature):
        raise SignatureRejected(SignatureProblem.MALFORMED,
                                f"{SIGNATURE_HEADER} must be {VERSION}=<64 hex digits>")
    ts = int(timestamp)
    if abs(now - ts) > window:
        raise SignatureRejected(SignatureProblem.STALE,
                                f"the delivery's timestamp is more than {int(window)} s from now")
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), _key(signature).encode()):
        raise SignatureRejected(SignatureProblem.MISMATCH, "the signature does not match")
    return ts


def _key(signature: str) -> str:
    """A signature as compared and remembered: hex digits in either case are one value."""
    return signature.lower()


class ReplayGuard:
    """Deliveries seen within the replay window, by signature: one being handled (a second
    delivery of it is refused: it may yet fail, and the platform is to send it again), or
    one accepted, with its receipt (a second delivery is answered that receipt: the
    platform missed the first answer, and a refusal would only have it try again)."""

    def __init__(self, window: float = REPLAY_WINDOW, capacity: int = 100_000) -> None:
        self.window = window
        self.capacity = capacity
        self._seen: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()

    def check(self, signature: str, now: float) -> dict[str, Any] | None:
        """None for a delivery not seen within the window; the receipt of one accepted;
        :class:`SignatureRejected` (``REPLAYED``) for one still being handled."""
        self._forget(now)
        seen = self._seen.get(_key(signature))
        if seen is None:
            return None
        if seen[1] is None:
            raise SignatureRejected(SignatureProblem.REPLAYED,
                                    "this delivery is being handled; send it again later")
        return seen[1]

    def remember(self, signature: str, timestamp: int, now: float) -> None:
        """Remember a delivery being handled until its window ends (:meth:`accepted` or
        :meth:`withdraw` says how its handling ended)."""
        self._forget(now)
        self._seen[_key(signature)] = (float(timestamp), None)

    def accepted(self, signature: str, receipt: dict[str, Any]) -> None:
        """The delivery was accepted: a second delivery of it is answered ``receipt``."""
        key = _key(signature)
        seen = self._seen.get(key)
        if seen is not None:
            self._seen[key] = (seen[0], receipt)

    def withdraw(self, signature: str) -> None:
        """Forget a delivery remembered before its handling refused it (it may come again:
        a full queue's refusal)."""
        self._seen.pop(_key(signature), None)

    def _forget(self, now: float) -> None:
        while self._seen:  # oldest first; also bounded by capacity
            oldest, (ts, _) = next(iter(self._seen.items()))
            if now - ts <= self.window and len(self._seen) < self.capacity:
                return
            del self._seen[oldest]
