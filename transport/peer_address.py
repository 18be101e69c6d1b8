"""Which peer addresses pairing takes: those every URL parser reads the same way (a pure
core).

A device's address is stored as given and listed by ``kinbox peers list``; the link dials
what :func:`~.peer_client.endpoint` makes of it with :func:`urllib.parse.urlsplit`.
Parsers disagree on the edges: ``http://me:1234#pw@host`` dials ``me`` port 1234 here (the
rest is a fragment, dropped), while a reader, or a parser that looks for the last ``@``,
sees the login ``me:1234#pw`` to ``host``; WHATWG parsers read a backslash as a slash;
blanks are stripped by one and kept by another; a query is dropped when dialling but kept
in the stored address; a percent-escape in the host is decoded by some. Pairing refuses
them all: an address is ``http(s)://`` or ``ws(s)://``, a host, a port, and a path.
"""

from __future__ import annotations

AMBIGUOUS = {
    "\\": "a backslash (a '/' to some URL parsers)",
    "#": "a fragment ('#...', read as part of a login by some URL parsers)",
    "?": "a query ('?...', dropped when the link dials)",
    "@": "a user or password, or an '@' some URL parsers read as ending one (the pairing "
         "code and then the device's token authenticate)",
}
"""A character no peer address needs, and what it would be read as."""


def address_problem(url: str) -> str | None:
    """Why ``url`` is not a peer address every parser reads alike (None: it is)."""
    if any(c.isspace() for c in url):
        return "a blank (stripped by some URL parsers, kept by others)"
    for char, problem in AMBIGUOUS.items():
        if char in url:
            return problem
    host = url.partition("://")[2].partition("/")[0]
    if "%" in host:
        return "a percent-escape in the host (decoded by some URL parsers, not by others)"
    return None
