"""The pure rule of how many wrong operator tokens a client may present (token_tries)."""

from __future__ import annotations

import pytest

from kinbox.transport.token_tries import TokenTries, retry_after

pytestmark = pytest.mark.timeout(30)


def test_a_client_is_locked_out_after_max_failures_within_the_window() -> None:
    tries = TokenTries(max_failures=3, window=10.0, lockout=60.0)
    assert tries.failed("10.0.0.1", 100.0) == 0.0
    assert tries.failed("10.0.0.1", 101.0) == 0.0
    assert tries.wait("10.0.0.1", 101.0) == 0.0
    assert tries.failed("10.0.0.1", 102.0) == 60.0
    assert tries.wait("10.0.0.1", 130.0) == 32.0
    assert tries.wait("10.0.0.2", 130.0) == 0.0  # per client address
    assert tries.wait("10.0.0.1", 162.0) == 0.0
    # The lock spent the failures: the next lock takes max_failures new ones.
    assert tries.failed("10.0.0.1", 163.0) == 0.0


def test_failures_older_than_the_window_no_longer_count() -> None:
    tries = TokenTries(max_failures=3, window=10.0, lockout=60.0)
    tries.failed("a", 0.0)
    tries.failed("a", 5.0)
    assert tries.failed("a", 10.0) == 0.0  # the one at 0.0 left the window
    assert tries.failed("a", 14.0) == 60.0


def test_a_right_token_forgets_the_failures() -> None:
    tries = TokenTries(max_failures=2, window=10.0, lockout=60.0)
    tries.failed("a", 0.0)
    tries.succeeded("a")
    assert tries.failed("a", 1.0) == 0.0


def test_memory_is_bounded_and_a_locked_client_outlives_idle_ones() -> None:
    tries = TokenTries(max_failures=2, window=10.0, lockout=60.0, max_clients=3)
    tries.failed("locked", 0.0)
    tries.failed("locked", 1.0)
    for n in range(4):  # each out of the window when the next comes
        tries.failed(f"idle-{n}", 20.0 + n * 11.0)
        assert len(tries) <= 3
    assert tries.wait("locked", 55.0) == 6.0  # still locked: the idle ones went first
    for n in range(4):  # then the oldest go, so memory stays bounded
        tries.failed(f"busy-{n}", 56.0)
    assert len(tries) == 3


@pytest.mark.parametrize(("wait", "header"), [(0.2, "1"), (1.0, "1"), (1.5, "2"), (60.0, "60")])
def test_retry_after_is_whole_seconds_and_never_zero(wait: float, header: str) -> None:
    assert retry_after(wait) == header


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenTries(max_failures=0)


def test_ipv6_addresses_of_one_slash_64_are_one_client() -> None:
    """An IPv6 host holds a whole /64 (SLAAC privacy addresses, or any address it adds to
    its interface): counted per address, it presented each wrong token from a new one and
    was never locked out, however many it tried."""
    tries = TokenTries(max_failures=3, window=60.0, lockout=60.0)
    for n in range(3):
        tries.failed(f"2001:db8:1:2::{n + 1:x}", 10.0 + n)
    assert tries.wait("2001:db8:1:2:abcd:ef01:2345:6789", 13.0) == 59.0
    assert tries.wait("2001:db8:1:3::1", 13.0) == 0.0  # another /64: another client


def test_an_ipv4_client_on_a_dual_stack_socket_is_its_own_client() -> None:
    """On a server bound to ``::`` IPv4 clients arrive as ``::ffff:a.b.c.d``: each is its
    own client (not one /64 for all of IPv4, where one guesser locked out everyone), and
    the same one as when it arrives as plain IPv4."""
    tries = TokenTries(max_failures=2, window=60.0, lockout=60.0)
    tries.failed("::ffff:192.0.2.7", 0.0)
    tries.failed("192.0.2.7", 1.0)
    assert tries.wait("::ffff:192.0.2.7", 2.0) == 59.0
    assert tries.wait("::ffff:192.0.2.8", 2.0) == 0.0
