"""Grants, bearer tokens and pairing invites: the rules, with no storage (the codes
themselves are :mod:`.invite_code`'s).

A *grant* is what a receiving device keeps about a paired sender: the
sender's pinned public key, the SHA-256 of the bearer token it issued (never
the token), scopes and a status. Pure: randomness and time come in as
arguments; the stores keep the rows.

Who may do what::

    scope "agent"  ->  deliver, read, stop, whoami

Status: ``active`` accepts links; ``paused`` and ``revoked`` refuse them and
close a live one (a paused grant can be resumed, a revoked one cannot).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

TOKEN_PREFIX = "kbt_"
TOKEN_BYTES = 32
"""Random bytes in a bearer token (and a pairing code's secret, :mod:`.invite_code`)."""

_TOKEN_RE = re.compile(r"kbt_[A-Za-z0-9_-]{43}")

SCOPES: dict[str, frozenset[str]] = {"agent": frozenset({"deliver", "read", "stop", "whoami"})}
"""What each scope allows."""


class GrantStatus(StrEnum):
    """Whether a grant accepts links."""

    ACTIVE = "active"
    PAUSED = "paused"
    REVOKED = "revoked"


STATUS_CHANGES: dict[tuple[GrantStatus, str], GrantStatus] = {
    (GrantStatus.ACTIVE, "pause"): GrantStatus.PAUSED,
    (GrantStatus.PAUSED, "pause"): GrantStatus.PAUSED,
    (GrantStatus.PAUSED, "resume"): GrantStatus.ACTIVE,
    (GrantStatus.ACTIVE, "resume"): GrantStatus.ACTIVE,
    (GrantStatus.ACTIVE, "revoke"): GrantStatus.REVOKED,
    (GrantStatus.PAUSED, "revoke"): GrantStatus.REVOKED,
    (GrantStatus.REVOKED, "revoke"): GrantStatus.REVOKED,
}
"""Operator actions; a revoked grant stays revoked (pair again for a new one)."""


class Refusal(StrEnum):
    """Why a connection or a pairing was refused; the peer is told this code."""

    NO_TOKEN = "no_token"
    MALFORMED = "malformed"
    TOKEN_IN_QUERY = "token_in_query"
    UNKNOWN = "unknown"
    PAUSED = "paused"
    REVOKED = "revoked"
    WRONG_DEVICE = "wrong_device"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED_INVITE = "expired_invite"
    BAD_ORIGIN = "bad_origin"
    SCOPE = "scope"
    BUSY = "busy"
    """Too many handshakes in progress (:mod:`.handshake_slots`): try again later."""
    TOO_MANY_TRIES = "too_many_tries"
    """Too many failed handshakes from the client's address (:mod:`.token_tries`): try
    again later."""


SIGNED_REFUSALS = frozenset({Refusal.UNKNOWN, Refusal.PAUSED, Refusal.REVOKED})
"""What the grant itself says of a token, which no one between the devices can change: the
server signs these (in the handshake, and on a live link when the grant closes), and a
sender fails its rows at once only for one of these with a valid signature. A refusal of
the client's proof (another device's token, a bad signature) is not signed: a relay that
tampered with the hello would get it signed for the client, so it is retried."""

HTTP_STATUS: dict[Refusal, int] = {
    Refusal.NO_TOKEN: 401, Refusal.MALFORMED: 401, Refusal.TOKEN_IN_QUERY: 400,
    Refusal.UNKNOWN: 401, Refusal.PAUSED: 403, Refusal.REVOKED: 403,
    Refusal.WRONG_DEVICE: 403, Refusal.BAD_SIGNATURE: 403, Refusal.EXPIRED_INVITE: 403,
    Refusal.BAD_ORIGIN: 403, Refusal.SCOPE: 403, Refusal.BUSY: 503,
    Refusal.TOO_MANY_TRIES: 429,
}


def new_token(random_bytes: bytes) -> str:
    """A bearer token made of ``TOKEN_BYTES`` random bytes."""
    return TOKEN_PREFIX + secret_text(random_bytes)


def secret_text(random_bytes: bytes) -> str:
    """``TOKEN_BYTES`` random bytes as the 43 base64url characters of a secret (a token's,
    a pairing code's)."""
    if len(random_bytes) != TOKEN_BYTES:
        raise ValueError(f"need {TOKEN_BYTES} random bytes, got {len(random_bytes)}")
    return base64.urlsafe_b64encode(random_bytes).rstrip(b"=").decode("ascii")


def secret_hash(secret: str) -> str:
    """The SHA-256 (hex) stored in place of a token."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


INVITE_ID_CHARS = 12
"""Hex characters of an invite's stored hash that name it to the operator (``kinbox peers
invites``, ``withdraw``): the code itself is shown once and never stored."""


def invite_id(code_hash: str) -> str:
    """The name an operator sees for the invite stored as ``code_hash``."""
    return code_hash[:INVITE_ID_CHARS]


def is_token(text: str) -> bool:
    """Does ``text`` look like a bearer token?"""
    return isinstance(text, str) and _TOKEN_RE.fullmatch(text) is not None


def parse_scopes(names: Iterable[str]) -> frozenset[str]:
    """Validated scope names; :class:`ValueError` for an unknown one."""
    chosen = frozenset(names)
    unknown = chosen - SCOPES.keys()
    if unknown or not chosen:
        raise ValueError(f"unknown scopes {sorted(unknown)}; known: {sorted(SCOPES)}")
    return chosen


def allows(scopes: Iterable[str], action: str) -> bool:
    """May a grant with ``scopes`` do ``action`` (deliver, read, stop, whoami)?"""
    return any(action in SCOPES.get(s, frozenset()) for s in scopes)


def change_status(current: str, action: str) -> GrantStatus:
    """The status after an operator ``action``; :class:`ValueError` if not allowed."""
    try:
        return STATUS_CHANGES[(GrantStatus(current), action)]
    except (KeyError, ValueError):
        raise ValueError(f"cannot {action} a grant that is {current}") from None


@dataclass(frozen=True)
class GrantView:
    """What the checks read of a stored inbound grant."""

    device_id: str
    public_key: str
    token_hash: str
    scopes: frozenset[str]
    status: str


def bearer_token(authorization: str | None, query: str) -> tuple[str | None, Refusal | None]:
    """The token of an upgrade request's ``Authorization`` header, or why it is refused.

    A token in the query string is refused even next to a valid header:
    query strings end up in access logs and browser history.
    """
    if query and ("token" in query.lower() or TOKEN_PREFIX in query):
        return None, Refusal.TOKEN_IN_QUERY
    if not authorization:
        return None, Refusal.NO_TOKEN
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not is_token(value.strip()):
        return None, Refusal.MALFORMED
    return value.strip(), None


def check_grant(grant: GrantView | None, token: str) -> Refusal | None:
    """Refusal for a presented token against the grant found by its hash, else None."""
    if grant is None or not hmac.compare_digest(grant.token_hash, secret_hash(token)):
        return Refusal.UNKNOWN
    return status_refusal(grant.status)


def status_refusal(status: str | None) -> Refusal | None:
    """What a grant in ``status`` (None: gone) says to its device; None while active."""
    if status is None:
        return Refusal.UNKNOWN
    if status == GrantStatus.REVOKED:
        return Refusal.REVOKED
    if status != GrantStatus.ACTIVE:
        return Refusal.PAUSED
    return None


@dataclass(frozen=True)
class InviteView:
    """What pairing reads of a stored invite."""

    code_hash: str
    scopes: frozenset[str]
    expires_at: float
    used: bool
    used_by: str | None = None
    """The device that redeemed it (None while it is open)."""


def check_invite(invite: InviteView | None, now: float, device_id: str) -> Refusal | None:
    """Refusal for a pairing code presented by ``device_id`` (whose key the request
    proved), else None: unknown, used and expired look alike.

    A code the same device redeemed passes: the answer to its redemption may have been
    lost on the way (a dropped connection after the commit), and its retry is answered
    again. The store gives it the grant only while that grant is as the redemption made
    it (active, never used on a link): see ``PeerStore.redeem_now``. The code's expiry does
    not apply to that retry, since it can pair no one new."""
    if invite is None:
        return Refusal.EXPIRED_INVITE
    if invite.used:
        return None if invite.used_by == device_id else Refusal.EXPIRED_INVITE
    if invite.expires_at <= now:
        return Refusal.EXPIRED_INVITE
    return None


def parse_ttl(text: str) -> float:
    """Seconds of a ``--ttl`` like ``90s``, ``10m``, ``2h``, ``1d`` (at most a week)."""
    # [0-9] in ASCII mode: \d takes any script's digits (Arabic-Indic "10m" was ten minutes).
    m = re.fullmatch(r"\s*([0-9]+)\s*([smhd]?)\s*", text or "", re.ASCII)
    if not m:
        raise ValueError(f"expected a duration like 10m or 2h, got {text!r}")
    seconds = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not 1 <= seconds <= 7 * 86400:
        raise ValueError(f"a pairing code lives 1 s to 7 days, got {text!r}")
    return float(seconds)
