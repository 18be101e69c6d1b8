"""Device identity: an Ed25519 key pair, its ``device_id``, signatures and token sealing.

Pure: keys come in as bytes (the key file is :mod:`.key_file`'s business),
nonces come in as arguments. The ``device_id`` is the first 12 hex
characters of the SHA-256 of the raw public key, so anyone holding the
public key can check an id, and an id cannot be claimed without the key.

Public keys travel as unpadded base64url of the 32 raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import IdentityError

DEVICE_ID_LENGTH = 12
"""Hex characters of a ``device_id``."""

SEAL_NONCE_BYTES = 12
"""Random bytes a caller passes to :meth:`DeviceIdentity.seal`."""


def b64e(data: bytes) -> str:
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64d(text: str) -> bytes:
    """Decode unpadded base64url; :class:`ValueError` when it is not."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def device_id_for(public_key: bytes) -> str:
    """The ``device_id`` of a raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_key).hexdigest()[:DEVICE_ID_LENGTH]


def public_key_bytes(encoded: str) -> bytes:
    """The raw public key of its base64url form; :class:`IdentityError` if malformed."""
    try:
        raw = b64d(encoded)
    except ValueError:
        raise IdentityError("public key", "not base64url") from None
    if len(raw) != 32:
        raise IdentityError("public key", f"expected 32 bytes, got {len(raw)}")
    return raw


def verify(public_key: str, signature: str, data: bytes) -> bool:
    """True when ``signature`` (base64url) is the key's signature of ``data``."""
    try:
        key = Ed25519PublicKey.from_public_bytes(public_key_bytes(public_key))
        key.verify(b64d(signature), data)
    except (IdentityError, ValueError, InvalidSignature):
        return False
    return True


class DeviceIdentity:
    """This device's key pair: signs handshakes and seals the tokens it holds for peers."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                     serialization.PublicFormat.Raw)
        self.public_key: str = b64e(raw)
        """The public key, base64url of its 32 raw bytes."""
        self.device_id: str = device_id_for(raw)
        """12 hex characters derived from the public key."""
        secret = private_key.private_bytes(serialization.Encoding.Raw,
                                           serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())
        self._seal_key = HKDF(hashes.SHA256(), 32, salt=None,
                              info=b"kinbox peer token seal v1").derive(secret)

    @classmethod
    def generate(cls) -> DeviceIdentity:
        """A new random identity."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> DeviceIdentity:
        """The identity of a 32-byte Ed25519 private key (a restored or scripted device)."""
        if len(seed) != 32:
            raise IdentityError("device key", f"a seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_pem(cls, pem: bytes) -> DeviceIdentity:
        """Load a PKCS#8 PEM private key; :class:`IdentityError` if it is not Ed25519."""
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError("device key", "not a PEM private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError("device key", "not an Ed25519 key")
        return cls(key)

    def to_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (store it owner-only)."""
        return self._key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    def sign(self, data: bytes) -> str:
        """The base64url signature of ``data``."""
        return b64e(self._key.sign(data))

    def seal(self, secret: str, nonce: bytes) -> str:
        """Encrypt a token this device holds for a peer, so the database never sees it."""
        if len(nonce) != SEAL_NONCE_BYTES:
            raise ValueError(f"nonce must be {SEAL_NONCE_BYTES} bytes")
        sealed = AESGCM(self._seal_key).encrypt(nonce, secret.encode(), self.device_id.encode())
        return b64e(nonce + sealed)

    def unseal(self, sealed: str) -> str:
        """The token :meth:`seal` encrypted; :class:`IdentityError` if it was not ours."""
        try:
            raw = b64d(sealed)
            plain = AESGCM(self._seal_key).decrypt(raw[:SEAL_NONCE_BYTES],
                                                   raw[SEAL_NONCE_BYTES:],
                                                   self.device_id.encode())
        except (ValueError, InvalidTag):
            raise IdentityError("sealed token", "not sealed by this device key") from None
        return plain.decode()
