"""The operator token: the secret that state-changing HTTP calls must present.

Only a SHA-256 digest of the secret is kept, and a presented token is
compared digest to digest with :func:`hmac.compare_digest`, so neither the
token nor how much of it matched leaks through memory dumps, logs, reprs or
timing. Where the secret comes from (a file, the environment) is the
caller's business; this module never reads either.
"""

from __future__ import annotations

import hashlib
import hmac

BEARER = "bearer"
#: The fewest characters a token may have: a short one is guessed by trying (a 9-letter
#: word falls to a dictionary; 16 random hex digits are 64 bits).
MIN_LENGTH = 16


class OperatorToken:
    """A token, known only by its digest; :meth:`matches` checks a presented one."""

    __slots__ = ("_digest",)

    def __init__(self, digest: bytes) -> None:
        self._digest = digest

    @classmethod
    def from_secret(cls, secret: str) -> OperatorToken:
        """Keep the digest of ``secret`` (surrounding whitespace dropped).

        :class:`ValueError` (never quoting the secret) when it is empty or holds a
        character other than printable ASCII: a client could not present it. HTTP
        servers read a header's bytes as Latin-1, so a UTF-8 token would never match,
        and a control character cannot be sent in a header at all. Also when it is
        shorter than :data:`MIN_LENGTH`: anyone who reaches the API could guess it.
        """
        secret = secret.strip()
        if not secret:
            raise ValueError("an operator token cannot be empty")
        if not all(" " <= c <= "~" for c in secret):
            raise ValueError(
                "an operator token must be printable ASCII (letters, digits, "
                "punctuation): a client cannot send any other character in "
                "the Authorization header"
            )
        if len(secret) < MIN_LENGTH:
            raise ValueError(
                f"an operator token must be at least {MIN_LENGTH} characters: "
                "a shorter one can be guessed; make one with: "
                "openssl rand -hex 32"
            )
        return cls(_digest(secret))

    def matches(self, presented: str) -> bool:
        """True when ``presented`` is the token (constant-time in its content)."""
        return hmac.compare_digest(self._digest, _digest(presented))

    def allows(self, authorization: str | None) -> bool:
        """True when an ``Authorization`` header value is ``Bearer <the token>`` (one or
        more spaces between them, as HTTP allows; a token never has any around it)."""
        scheme, _, credentials = (authorization or "").partition(" ")
        credentials = credentials.strip()
        return scheme.lower() == BEARER and bool(credentials) and self.matches(credentials)

    def __repr__(self) -> str:
        return "OperatorToken(<sha256 digest>)"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
