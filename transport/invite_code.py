"""Pairing codes: what ``kinbox peers invite`` prints, and what each side derives from it.

A code names the inviting device and carries a secret::

    kbp2_<fingerprint: 32 hex>_<secret: 43 base64url>

The *fingerprint* is the first 32 hex characters (128 bits) of the SHA-256 of
the inviting device's public key; its first 12 are the ``device_id``
(:mod:`.identity`), so a user can match a code against ``kinbox peers
whoami``. The client pins it: a challenge from another device id is refused
before anything is sent, and the ``paired`` answer must carry a key of this
fingerprint and be signed by it. 128 bits, not the 12-hex ``device_id``
alone: 48 bits can be matched by grinding keys, 128 cannot.

The *secret* never crosses the wire. It is the seed of an Ed25519 *invite
key* (HKDF-SHA256); the client signs the pairing transcript with it
(both device ids, both nonces, its own public key, its name) and sends the
invite key's public half. The inviting device stores only the SHA-256 of
that public key (:func:`invite_hash`), finds the invite by it and checks
the signature with the key the request carries.

Why a signature and not an HMAC keyed with a hash the server stores: with an
HMAC the stored value is the key, so a copy of the database (a backup, a
leaked file) could pair during the code's life; here the database holds the
hash of a public key, which signs nothing, and an eavesdropper on a ``ws://``
pairing sees a public key and signatures bound to that connection's nonces.
The server proves itself with its device key, which the fingerprint pins, so
it needs no secret of its own. Pure: randomness comes in as an argument.

Codes of the first format (``kbp_`` and 43 characters, no device named) are
recognised only to be refused with a message to make a new invite
(:func:`is_old_code`): they carried the secret itself on the wire.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import IdentityError
from .grants import INVITE_ID_CHARS, secret_hash, secret_text
from .identity import b64d, b64e, public_key_bytes

CODE_PREFIX = "kbp2_"
FINGERPRINT_CHARS = 32
"""Hex characters of a key's SHA-256 a code names its device by (128 bits)."""

_CODE_RE = re.compile(rf"kbp2_([0-9a-f]{{{FINGERPRINT_CHARS}}})_([A-Za-z0-9_-]{{43}})")
_OLD_CODE_RE = re.compile(r"kbp_[A-Za-z0-9_-]{43}")

_INVITE_KEY_INFO = b"kinbox pairing invite key v2"


def fingerprint(public_key: str) -> str:
    """The fingerprint a code names a device by: its ``device_id`` and 20 more hex
    characters of the same hash. :class:`IdentityError` for a malformed key."""
    return hashlib.sha256(public_key_bytes(public_key)).hexdigest()[:FINGERPRINT_CHARS]


def new_code(device_public_key: str, random_bytes: bytes) -> str:
    """A one-time pairing code for the device of ``device_public_key``, its secret made
    of ``TOKEN_BYTES`` random bytes."""
    return f"{CODE_PREFIX}{fingerprint(device_public_key)}_{secret_text(random_bytes)}"


def is_code(text: str) -> bool:
    """Does ``text`` look like a pairing code?"""
    return isinstance(text, str) and _CODE_RE.fullmatch(text) is not None


def is_old_code(text: str) -> bool:
    """Is ``text`` a code of the first format (no device named, its secret sent as it
    was), which pairs nothing any more?"""
    return isinstance(text, str) and _OLD_CODE_RE.fullmatch(text) is not None


def invite_hash(invite_key: str) -> str:
    """What the inviting device stores of an invite, and finds it by: the SHA-256 (hex)
    of the invite key's raw public bytes. :class:`IdentityError` for a malformed key."""
    return hashlib.sha256(public_key_bytes(invite_key)).hexdigest()


@dataclass(frozen=True)
class InviteCode:
    """A parsed pairing code: the device it names and the invite key its secret seeds."""

    fingerprint: str
    """The inviting device's key fingerprint (:func:`fingerprint`)."""
    _key: Ed25519PrivateKey = field(repr=False, compare=False)

    @property
    def device_id(self) -> str:
        """The inviting device's ``device_id``."""
        return self.fingerprint[:12]

    @property
    def invite_key(self) -> str:
        """The invite key's public half (base64url), sent in the ``pair`` frame."""
        return b64e(
            self._key.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        )

    @property
    def invite_hash(self) -> str:
        """What the inviting device stored of this code (:func:`invite_hash`)."""
        return invite_hash(self.invite_key)

    def names(self, public_key: str) -> bool:
        """Is ``public_key`` the key of the device this code names?"""
        try:
            return fingerprint(public_key) == self.fingerprint
        except IdentityError:
            return False

    def sign(self, data: bytes) -> str:
        """The invite key's base64url signature of ``data``."""
        return b64e(self._key.sign(data))


def parse_code(text: str) -> InviteCode:
    """The code in ``text``; :class:`ValueError` when it is not one (see :func:`is_code`)."""
    m = _CODE_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError("not a pairing code")
    seed = HKDF(hashes.SHA256(), 32, salt=None, info=_INVITE_KEY_INFO).derive(b64d(m.group(2)))
    return InviteCode(m.group(1), Ed25519PrivateKey.from_private_bytes(seed))


def invite_ref(text: str) -> str | None:
    """What ``kinbox peers withdraw`` was given, as the start of a stored invite hash: a
    code (its whole hash; a first-format code's too, so an operator can still withdraw
    one) or an invite id; None for anything else."""
    if is_code(text):
        return parse_code(text).invite_hash
    if is_old_code(text):
        return secret_hash(text)
    if isinstance(text, str) and re.fullmatch(f"[0-9a-f]{{{INVITE_ID_CHARS}}}", text):
        return text
    return None
