"""The handshake and pairing steps, as pure functions of frames, keys and nonces.

Link handshake (after the upgrade request's bearer token matched a grant)::

    server -> challenge {device_id: S, nonce: Ns}
    client -> hello     {device_id: C, nonce: Nc, signature: sign_C(hello_transcript)}
    server -> welcome   {signature: sign_S(welcome_transcript)}
           | refused {reason: R, signature: sign_S(refused_transcript(R))}
           | committed {ids}, refused {reason: R, signature: sign_S(refused_transcript(R, ids))}

The last form answers an upgrade that named the rows the link carries
(``Kinbox-In-Flight``): ``ids`` are those of them the server has committed, for
a proven hello (none otherwise), so that a sender whose acks a cut link lost
acknowledges them instead of failing rows the peer has.

The client's signature covers both nonces, both device ids and the hash of
the token it presented, so it proves the token's holder owns the device key
the grant was bound to at pairing; the server's covers the same and is
checked against the key the client pinned, so a stranger at the peer's URL
is found out. A token the grant refuses (unknown, paused, revoked) is
refused the same way, signed (``refused``, also sent on a live link when its
grant closes): the sender gives its rows up only on a refusal that proves
the peer sent it, so whoever answers at the peer's address, or relays
between the devices, cannot end a pairing. A hello that fails its proof is
refused unsigned, and retried: a relay could have tampered with it.

Pairing (the code names the inviting device and seeds an invite key, see
:mod:`.invite_code`; the code itself never crosses the wire)::

    server -> challenge {device_id: S, nonce: Ns}      client: S is the code's device?
    client -> pair      {invite_key: I, device_id: C, public_key: K, name, nonce: Nc,
                         signature: sign_K(t), invite_signature: sign_I(t)}
    server -> paired    {device_id: S, public_key: KS, token,
                         signature: sign_KS(paired transcript)}

where ``t`` covers both ids, both nonces and a digest of (I, K, name). The
server finds the invite by the hash of I and checks both signatures, so a
relay can neither put its own key or name in the request nor replay it on
another connection; the client checks that KS has the code's fingerprint and
signed both nonces, the request and the token, so a relay cannot answer in
the server's place. A relay that tampers makes the pairing fail and spends
nothing: the code stays usable by its holder (a lost or spoiled ``paired``
answer is answered again for the same device key, see ``check_invite``).
Nonces come in as arguments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from . import frames as f
from .errors import HandshakeRefused, IdentityError
from .grants import SIGNED_REFUSALS, GrantView, Refusal, check_grant, secret_hash
from .identity import DeviceIdentity, b64e, device_id_for, public_key_bytes, verify
from .invite_code import InviteCode, invite_hash

NONCE_BYTES = 32


def _transcript(step: str, server_id: str, client_id: str, server_nonce: str,
                client_nonce: str, secret_hash_hex: str) -> bytes:
    return "\n".join(("kinbox-peer/1", step, server_id, client_id, server_nonce, client_nonce,
                      secret_hash_hex)).encode("ascii")


def new_nonce(random_bytes: bytes) -> str:
    """A nonce for the wire from ``NONCE_BYTES`` random bytes."""
    if len(random_bytes) != NONCE_BYTES:
        raise ValueError(f"need {NONCE_BYTES} random bytes")
    return b64e(random_bytes)


# -- link --------------------------------------------------------------------------------


def challenge(identity: DeviceIdentity, server_nonce: str) -> f.Challenge:
    """The server's first frame."""
    return f.Challenge(identity.device_id, server_nonce)


def hello(identity: DeviceIdentity, ch: f.Challenge, token: str, client_nonce: str,
          expected_server: str) -> f.Hello:
    """The client's answer; refuses a challenge from another device than the pinned one."""
    if ch.device_id != expected_server:
        raise HandshakeRefused(Refusal.WRONG_DEVICE, "the server is not the paired device")
    data = _transcript("hello", ch.device_id, identity.device_id, ch.nonce, client_nonce,
                       secret_hash(token))
    return f.Hello(identity.device_id, client_nonce, identity.sign(data))


def answer_hello(identity: DeviceIdentity, server_nonce: str, frame: f.Hello,
                 grant: GrantView | None, token: str) -> f.Welcome | f.Refused:
    """Server: the welcome if the client's proof holds against the grant; a refusal signed
    over the same transcript if the grant refuses the token (unknown, paused, revoked);
    HandshakeRefused, which the server answers unsigned, if the proof does not hold
    (another device's token, a bad signature): a relay that tampered with the hello would
    otherwise get a final refusal signed for the client it stands before."""
    refusal = check_grant(grant, token)
    if refusal is not None:
        return refused(identity, server_nonce, frame, token, refusal)
    assert grant is not None
    if frame.device_id != grant.device_id:
        raise HandshakeRefused(Refusal.WRONG_DEVICE, "the token belongs to another device")
    if not proves(identity, server_nonce, frame, grant):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE)
    welcome_data = _transcript("welcome", identity.device_id, frame.device_id, server_nonce,
                               frame.nonce, grant.token_hash)
    return f.Welcome(identity.sign(welcome_data))


def proves(identity: DeviceIdentity, server_nonce: str, frame: f.Hello,
           grant: GrantView) -> bool:
    """Server: does ``frame`` prove the key ``grant`` was bound to at pairing?"""
    data = _transcript("hello", identity.device_id, frame.device_id, server_nonce,
                       frame.nonce, grant.token_hash)
    return frame.device_id == grant.device_id and verify(grant.public_key, frame.signature,
                                                         data)


def _refused_step(reason: str, committed: f.Committed | None) -> str:
    """The refusal's transcript step: with a ``committed`` frame, a digest of its ids too,
    so that neither can be changed, added or dropped on the way without the other."""
    if committed is None:
        return f"refused:{reason}"
    digest = hashlib.sha256("\n".join(committed.ids).encode("ascii")).hexdigest()
    return f"refused:{reason}:committed:{digest}"


def refused(identity: DeviceIdentity, server_nonce: str, frame: f.Hello, token: str,
            reason: Refusal, committed: f.Committed | None = None) -> f.Refused:
    """Server: what the grant says of ``token`` (unknown, paused, revoked), signed for the
    handshake of ``frame``; sent in place of the welcome, or on the live link it opened
    when its grant closes. In a handshake whose upgrade named the rows it carries, it
    covers the ``committed`` frame sent just before it."""
    if reason not in SIGNED_REFUSALS:
        raise ValueError(f"only the grant's refusals are signed, not {reason.value!r}")
    data = _transcript(_refused_step(reason.value, committed), identity.device_id,
                       frame.device_id, server_nonce, frame.nonce, secret_hash(token))
    return f.Refused(reason.value, identity.sign(data))


def check_welcome(identity: DeviceIdentity, ch: f.Challenge, sent: f.Hello, token: str,
                  frame: f.Welcome, pinned_key: str) -> None:
    """Client: raise HandshakeRefused unless the welcome is signed by the pinned key."""
    data = _transcript("welcome", ch.device_id, identity.device_id, ch.nonce, sent.nonce,
                       secret_hash(token))
    if not verify(pinned_key, frame.signature, data):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE, "the server's signature does not match "
                               "the key pinned at pairing")


def check_refused(identity: DeviceIdentity, ch: f.Challenge, sent: f.Hello, token: str,
                  frame: f.Refused, pinned_key: str,
                  committed: f.Committed | None = None) -> Refusal:
    """Client: the refusal's code if the pinned key signed it for this handshake (and the
    ``committed`` frame that came before it, if one did), else HandshakeRefused (anyone at
    the peer's URL can send a refusal; only the peer can sign)."""
    data = _transcript(_refused_step(frame.reason, committed), ch.device_id,
                       identity.device_id, ch.nonce, sent.nonce, secret_hash(token))
    if not verify(pinned_key, frame.signature, data):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE, "a refusal not signed by the key "
                               "pinned at pairing")
    return Refusal(frame.reason)


# -- pairing -----------------------------------------------------------------------------


def _pairing(sent: f.Pair, token: str = "") -> str:
    """What a pairing transcript binds besides ids and nonces: the invite key, the
    client's key and name as sent, and (for ``paired``) the token's hash."""
    parts = (sent.invite_key, sent.public_key, sent.name, secret_hash(token) if token else "")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


def pair(identity: DeviceIdentity, ch: f.Challenge, code: InviteCode, client_nonce: str,
         name: str) -> f.Pair:
    """The client's pairing request for a one-time ``code``: signed by the device key and
    by the code's invite key. HandshakeRefused (``wrong_device``), before anything is
    sent, when the challenge comes from another device than the code names."""
    if ch.device_id != code.device_id:
        raise HandshakeRefused(Refusal.WRONG_DEVICE, f"device {ch.device_id} answered; the "
                               f"code is for device {code.device_id}")
    unsigned = f.Pair(code.invite_key, identity.device_id, identity.public_key, name,
                      client_nonce, "", "")
    data = _transcript("pair", ch.device_id, identity.device_id, ch.nonce, client_nonce,
                       _pairing(unsigned))
    return replace(unsigned, signature=identity.sign(data), invite_signature=code.sign(data))


@dataclass(frozen=True)
class PairingProof:
    """A pairing request whose signatures checked out: the new peer's identity and the
    invite it proved it holds the code of."""

    device_id: str
    public_key: str
    name: str
    invite_hash: str
    """The stored hash of the invite (:func:`.invite_code.invite_hash`)."""


def accept_pair(identity: DeviceIdentity, server_nonce: str, frame: f.Pair) -> PairingProof:
    """Server: check that the pairing device owns the key it presents and holds the code
    of the invite key it names (whether that invite is open is the caller's question).
    A request changed on the way (another key or name put in) fails a signature."""
    try:
        raw = public_key_bytes(frame.public_key)
        stored = invite_hash(frame.invite_key)
    except IdentityError:
        raise HandshakeRefused(Refusal.MALFORMED, "bad public key") from None
    if device_id_for(raw) != frame.device_id:
        raise HandshakeRefused(Refusal.WRONG_DEVICE, "device id does not match the key")
    data = _transcript("pair", identity.device_id, frame.device_id, server_nonce, frame.nonce,
                       _pairing(frame))
    if not verify(frame.public_key, frame.signature, data):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE, "the device key's signature")
    if not verify(frame.invite_key, frame.invite_signature, data):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE, "the pairing code's signature")
    # Kept in one spelling (base64 may pad or not): stored keys are compared as text.
    return PairingProof(frame.device_id, b64e(raw), frame.name, stored)


def paired(identity: DeviceIdentity, server_nonce: str, proof: PairingProof, sent: f.Pair,
           token: str) -> f.Paired:
    """Server: the grant for the new peer, signed over both nonces, the request and the
    token hash."""
    data = _transcript("paired", identity.device_id, proof.device_id, server_nonce,
                       sent.nonce, _pairing(sent, token))
    return f.Paired(identity.device_id, identity.public_key, token, identity.sign(data))


def check_paired(identity: DeviceIdentity, ch: f.Challenge, code: InviteCode, sent: f.Pair,
                 frame: f.Paired) -> None:
    """Client: the paired frame comes from the device the code names (its key has the
    code's fingerprint), signed by that key over this request."""
    try:
        raw = public_key_bytes(frame.public_key)
    except IdentityError:
        raise HandshakeRefused(Refusal.MALFORMED, "bad public key") from None
    if device_id_for(raw) != frame.device_id or frame.device_id != ch.device_id:
        raise HandshakeRefused(Refusal.WRONG_DEVICE, "the key does not match the device id")
    if not code.names(frame.public_key):
        raise HandshakeRefused(Refusal.WRONG_DEVICE, "the answer's key is not the one the "
                               "code names")
    data = _transcript("paired", ch.device_id, identity.device_id, ch.nonce, sent.nonce,
                       _pairing(sent, frame.token))
    if not verify(frame.public_key, frame.signature, data):
        raise HandshakeRefused(Refusal.BAD_SIGNATURE, "the answer's signature")
