"""A pairing that names a paired device's id with another key is refused.

A ``device_id`` is 48 bits of the hash of a device key (``transport.identity``): a key
whose id matches a given device's is found by grinding keys (2**48 tries, days on a GPU;
vanity-key grinders do exactly this), and the id alone is what others see of a device
(``peer:<id>``, ``suzent:<id>``). Whoever holds any pairing code of this device (one given
to a device the operator trusts less, say) could then pair with such a key, and the
pairing replaced the grant of the device with that id: the real device was cut off and
the new one answered as it, read its session (``read``) and wrote into it. The handshake
itself cannot tell (the id matches the key); a colliding key is simulated here by the
proof the handshake would hand on for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import ConfigError, Runtime
from kinbox.actors.peer_backend import PeerHttpBackend
from kinbox.persistence.peers import OUTBOUND
from kinbox.transport.errors import GrantClosed
from kinbox.transport.grants import new_token, secret_hash
from kinbox.transport.handshake import PairingProof
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code

from .peer_harness import Receiver

pytestmark = pytest.mark.timeout(60)


def test_a_pairing_with_another_key_for_a_paired_device_id_is_refused_and_spends_nothing(
    any_db_url: str, tmp_path: Path
) -> None:
    phone = DeviceIdentity.from_seed(b"\x01" * 32)
    grinder = DeviceIdentity.from_seed(b"\x02" * 32)
    with Runtime(db=any_db_url, data_dir=tmp_path / "data") as rt:
        store, backend = rt.peers.peers, PeerHttpBackend(rt.peers)
        now = rt.clock.now()
        store.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
        store.add_invite("b" * 64, frozenset({"agent"}), now, now + 600)
        phone_token = secret_hash(new_token(b"\x03" * 32))
        assert backend.redeem("a" * 64, PairingProof(phone.device_id, phone.public_key,
                                                     "phone", "a" * 64), phone_token)
        store.touch(phone.device_id, "inbound", now)  # it used its grant

        # Another key whose (ground) id is the phone's, with the other code.
        stolen_token = secret_hash(new_token(b"\x04" * 32))
        forged = PairingProof(phone.device_id, grinder.public_key, "phone", "b" * 64)
        assert not backend.redeem("b" * 64, forged, stolen_token)

        grant = store.device(phone.device_id, "inbound")
        assert grant is not None
        assert (grant.public_key, grant.token_hash, grant.status) == (
            phone.public_key, phone_token, "active")  # the phone keeps its pairing
        with pytest.raises(GrantClosed):  # the grinder reads nothing of the phone's session
            backend.answer(phone.device_id, stolen_token, "read")
        backend.answer(phone.device_id, phone_token, "read")  # the phone still does
        invite = store.invite("b" * 64)
        assert invite is not None and not invite.used  # the code was not spent on it


def test_a_code_naming_the_id_of_a_device_paired_here_with_another_key_dials_nothing(
        receiver: Receiver, tmp_path: Path) -> None:
    """The sending side: a device that ground its key to the id of one this runtime sends
    to hands out its code ("pair with my laptop"); pairing with it replaced the earlier
    device's outbound grant, and every message for ``peer:<id>`` (an agent's, a cron job's)
    went to it from then on. Refused, naming the device, before the other side spends
    anything; the earlier pairing stands."""
    code = receiver.invite()
    taken_id = parse_code(code).device_id
    earlier = DeviceIdentity.from_seed(b"\x05" * 32)  # its id collides with the receiver's
    with Runtime(db=f"sqlite:///{tmp_path / 'phone' / 'phone.db'}",
                 data_dir=tmp_path / "phone" / "data") as rt:
        sealed = rt.peers.identity.seal(new_token(b"\x06" * 32), b"\x07" * 12)
        rt.peers.peers.save_outbound(taken_id, "laptop", earlier.public_key,
                                     "http://127.0.0.1:9", sealed, frozenset({"agent"}),
                                     rt.clock.now())
        with pytest.raises(ConfigError) as info:
            rt.peers.pair(receiver.http, code)
        assert info.value.field == "code"
        assert taken_id in str(info.value)
        kept = rt.peers.peers.device(taken_id, OUTBOUND)
        assert kept is not None
        assert (kept.public_key, kept.token_sealed, kept.url) == (
            earlier.public_key, sealed, "http://127.0.0.1:9")
    assert receiver.query("select count(*) from peer_invites where used_at is not null") \
        == [(0,)]  # nothing was spent there
