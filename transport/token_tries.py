"""How many failed tries one client may make before it must wait: wrong operator tokens
(the HTTP API), failed peer handshakes (``peer_ws``), each counted on its own.

Without a limit, a client that reaches the HTTP API may try tokens as fast as the
server answers, and one that reaches the peer endpoint may keep it reading grants and
signing refusals as fast. After :data:`MAX_FAILURES` failures within :data:`WINDOW`
seconds a client is locked out for :data:`LOCKOUT` seconds: every guarded call it makes
is then refused, even one with the right token (else the lock would still say which
guess was right; and the refusal must cost no read). A success outside a lock forgets
the client's failures.

Pure: time comes in as ``now`` (a monotonic reading); the caller names clients by peer
address and serializes calls. One client is what one machine can present itself as
(:func:`client_of`): an IPv4 address, or an IPv6 /64, since a host holds its whole /64
(privacy addresses, any address it adds) and, counted per address, tried each wrong
token from a fresh one, never locked out. Only addresses are kept, never a token. At most
:data:`MAX_CLIENTS` clients are remembered, so a flood of addresses cannot grow memory
without bound: past it, clients with nothing left to count are dropped first, then the
oldest.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

MAX_FAILURES = 10
WINDOW = 60.0
LOCKOUT = 60.0
MAX_CLIENTS = 4096
IPV6_PREFIX = 64
"""The IPv6 network counted as one client: the /64 a single host is given."""


def client_of(address: str) -> str:
    """The client a peer ``address`` counts as: an IPv4 address as it is (also when an IPv6
    socket shows it as ``::ffff:a.b.c.d``), an IPv6 address as its /64, anything else (a
    Unix socket's name, no address) as it is."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))


@dataclass
class _Client:
    failures: list[float] = field(default_factory=list)
    locked_until: float = 0.0


class TokenTries:
    """Failed tries per client; :meth:`wait` says whether one must wait."""

    def __init__(
        self,
        max_failures: int = MAX_FAILURES,
        window: float = WINDOW,
        lockout: float = LOCKOUT,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        if max_failures < 1 or window <= 0 or lockout <= 0 or max_clients < 1:
            raise ValueError(
                "token tries: max_failures, window, lockout and max_clients must be positive"
            )
        self.max_failures = max_failures
        self.window = window
        self.lockout = lockout
        self.max_clients = max_clients
        self._clients: dict[str, _Client] = {}

    def wait(self, client: str, now: float) -> float:
        """Seconds before ``client`` may present a token again; 0.0 when it may now."""
        entry = self._clients.get(client_of(client))
        return max(0.0, entry.locked_until - now) if entry is not None else 0.0

    def failed(self, client: str, now: float) -> float:
        """Count a failed try (a wrong token) from ``client``; the wait it now has (0.0 for
        none)."""
        client = client_of(client)
        entry = self._clients.pop(client, None) or _Client()
        self._clients[client] = entry  # now the most recent
        entry.failures = [t for t in entry.failures if now - t < self.window] + [now]
        if len(entry.failures) >= self.max_failures:
            entry.failures = []
            entry.locked_until = now + self.lockout
        self._bound(now)
        return self.wait(client, now)

    def __len__(self) -> int:
        """How many clients are remembered (at most ``max_clients``)."""
        return len(self._clients)

    def succeeded(self, client: str) -> None:
        """A try from ``client`` that succeeded (not locked out): its failures are
        forgotten."""
        self._clients.pop(client_of(client), None)

    def _bound(self, now: float) -> None:
        if len(self._clients) <= self.max_clients:
            return
        for name in [
            n
            for n, c in self._clients.items()
            if c.locked_until <= now and all(now - t >= self.window for t in c.failures)
        ]:
            del self._clients[name]
        while len(self._clients) > self.max_clients:
            del self._clients[next(iter(self._clients))]


def retry_after(wait: float) -> str:
    """A ``Retry-After`` header value for ``wait`` seconds: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))
