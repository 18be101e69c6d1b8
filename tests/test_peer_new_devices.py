"""A device paired while a delivering runtime runs: its links are not only the ones it
knew at its start.

``kinbox peers pair`` is a process of its own, and so is a send-only ``kinbox serve``
(or any runtime without a brain) that queues messages for the device: only a delivering
runtime dials out, and it started a link for each device paired at its start, and for
a device its own agents sent to. Rows another process queued for a device paired later
waited, ``pending``, until that runtime was restarted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import Runtime, SystemClock

from .helpers import quiet_brain, wait_for
from .peer_harness import Receiver, cli

pytestmark = pytest.mark.timeout(120)


def test_rows_another_process_queued_for_a_device_paired_after_the_start_are_sent(
        receiver: Receiver, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a' / 'sender.db'}"
    key = str(tmp_path / "a" / "key")
    worker = Runtime(db=db, brain=quiet_brain, clock=SystemClock(), data_dir=key).start()
    try:
        # The operator pairs with the CLI while the worker runs.
        paired = cli("peers", "pair", receiver.http, receiver.invite(), "--db", db,
                     "--data-dir", key)
        device = paired["device_id"]
        with Runtime(db=db, clock=SystemClock(), data_dir=key) as poster:  # send-only
            assert poster.send_only
            me = poster.create_session(None, "poster").id
            [sent] = poster.peers.send_many(me, f"peer:{device}", ["hello"])
        mid = sent["message_id"]
        wait_for(lambda: worker.context.journal.get(mid)["status"] == "delivered", 20,
                 "the delivering runtime to carry a row queued for a device paired after "
                 "its start")
        me_id = worker.peers.identity.device_id
        assert receiver.peer_rows(me_id) == [f"peer-{me_id}-{mid}"]
    finally:
        worker.stop()
