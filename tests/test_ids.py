"""Time-ordered ids (``actors/ids``): their shape, their order, their errors."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from kinbox.actors import Runtime
from kinbox.actors.ids import RANDOM_BYTES, new_id, time_ordered_id

MakeRuntime = Callable[..., Runtime]


@pytest.mark.timeout(10)
def test_an_id_is_the_millisecond_then_the_random_bytes_in_hex() -> None:
    assert time_ordered_id(0x0123456789AB, bytes(range(RANDOM_BYTES))) == (
        "0123456789ab" + bytes(range(RANDOM_BYTES)).hex())
    assert re.fullmatch(r"[0-9a-f]{32}", new_id())


@pytest.mark.timeout(10)
def test_ids_of_later_milliseconds_sort_after_earlier_ones_whatever_their_random_part() -> None:
    early = time_ordered_id(1_700_000_000_000, b"\xff" * RANDOM_BYTES)
    late = time_ordered_id(1_700_000_000_001, b"\x00" * RANDOM_BYTES)
    assert early < late


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("millis", "random"), [(-1, bytes(RANDOM_BYTES)),
                                                (1 << 48, bytes(RANDOM_BYTES)),
                                                (0, bytes(RANDOM_BYTES - 1))])
def test_out_of_range_inputs_are_refused(millis: int, random: bytes) -> None:
    with pytest.raises(ValueError):
        time_ordered_id(millis, random)


@pytest.mark.timeout(60)
def test_a_runtime_names_its_messages_in_time_order_and_cuts_short_ids_from_the_tail(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=lambda turn: None)
    project = rt.create_project("p")
    # Many sessions within one millisecond: their short ids come from the random tail.
    sessions = [rt.create_session(project.id, f"S{i}").id for i in range(200)]
    assert len(set(sessions)) == 200
    ids = [rt.post(sessions[0], f"m{i}").message_id for i in range(5)]
    stamps = [int(i.removeprefix("msg-")[:12], 16) for i in ids]
    assert stamps == sorted(stamps)


@pytest.mark.timeout(30)
def test_a_forked_child_draws_other_random_bits_than_its_parent() -> None:
    # The bits come from a seeded generator (no system call per id): a child that kept the
    # parent's state would repeat the parent's next ids.
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without pytest's teardown
        os.close(read)
        os.write(write, "".join(new_id()[12:] for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(new_id()[12:] for _ in range(8))
    assert len(child) == len(parent) == 8 * 2 * RANDOM_BYTES
    assert child != parent
