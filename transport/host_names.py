"""Host names: which a server may be told to answer, and how a ``Host`` header is read.

The rules of the Host check (:mod:`.host_guard`), pure (no Starlette): the CLI checks
``--allow-host`` with them at parse time, and importing the guard's middleware brought
the HTTP stack into every ``kinbox`` command.

Allowed names are exact (``kinbox.example``) or a subdomain pattern
(``*.example.com``, never a whole top-level domain such as ``*.com``: anyone may
register a name there); ``[::1]`` style IPv6 literals keep their brackets.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

_NAME = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$|^\[[0-9a-f:.]+\]$")


def allowed_name(name: str) -> str:
    """``name`` as the guard compares it (lower case, IPv6 in brackets); ValueError if it
    cannot be a Host (a name, ``*.domain``, an IPv4 or IPv6 literal)."""
    norm = name.strip().lower()
    if ":" in norm and not norm.startswith("["):
        try:  # a bare IPv6 address, else a name or IPv4 address with its port
            ipaddress.IPv6Address(norm)
        except ValueError:
            raise ValueError(f"not a host name: {name!r} (give it without a port)") from None
        norm = f"[{norm}]"
    if not _NAME.match(norm):
        raise ValueError(f"not a host name: {name!r} (expected a name such as "
                         "kinbox.example, *.example.com or an IP)")
    if norm.startswith("*.") and "." not in norm[2:] and norm != "*.localhost":
        # Anyone can register a name under a top-level domain and point it here: the guard
        # would let every such page through (DNS rebinding). *.localhost resolves here only.
        raise ValueError(f"{name!r} would allow every name under a top-level domain; "
                         "name your own domain (*.example.com)")
    if norm.startswith("["):
        # The brackets hold an IPv6 address, nothing else: an IPv4 address or a name with
        # its port (10.0.0.5:8765) fits the pattern's characters but never matches a Host,
        # whose port is not part of the name compared.
        try:
            ipaddress.IPv6Address(norm[1:-1])
        except ValueError:
            raise ValueError(f"not a host name: {name!r} (give it without a port)") from None
    return norm


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address to bind, or a Host name to answer) is reachable only
    from this machine: ``localhost`` or a loopback address. A name or a pattern is not: it
    may resolve to anything."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a ``Host`` header: ``[::1]:80`` -> ``[::1]``, ``a:80`` -> ``a``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    name, sep, port = header.rpartition(":")
    return name if sep and port.isdigit() else header


class AllowedHosts:
    """The Host names a server answers: the one rule for its HTTP routes and its peer
    websockets alike."""

    def __init__(self, allowed_hosts: Iterable[str]) -> None:
        names = [allowed_name(h) for h in allowed_hosts]
        self.exact = frozenset(n for n in names if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host: str) -> bool:
        """True when ``host`` (already without its port) is one of the allowed names."""
        return host in self.exact or any(host.endswith(s) for s in self.suffixes)
