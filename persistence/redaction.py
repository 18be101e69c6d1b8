"""Passwords out of database URLs and out of what drivers say about them (a pure core).

A database is named two ways, and libpq reads each its own way:

- a URL, ``postgresql://user:password@host/db?password=...&sslpassword=...``, whose
  query parameters run from ``?`` or ``&`` to the next ``&``, whatever they hold (a
  blank as well), their names percent-decoded (``passw%6Frd`` is the password);
- a keyword/value string, ``host=h user=u password=secret``, with blanks allowed
  around each ``=`` and a value either single-quoted (``'two words'``, ``\\'`` a
  quote) or running to the next blank (``two\\ words`` escapes it).

:func:`redact_url` masks every password either way (the one before the ``@`` and every
parameter named ``...password``); text that is neither as written (``postgresql:/me:pw@h``,
a slash left out) keeps nothing between its first ``:`` and its last ``@``, and a ``?``
in a password masks what follows it too.
:func:`redact_text` masks in any other text (a driver's error) each spelling of the
passwords a URL holds: as written, percent-decoded, unquoted and unescaped, and the pieces
an unencoded ``/``, ``?`` or ``#`` cuts it into, which libpq reads as the port or the
database (a short one where it stands alone, not inside a word).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote, unquote_plus

MASK = "***"

_KEY_VALUE = re.compile(r"\s*[^\s=:/@?&#]+\s*=")
"""What starts a keyword/value string (``host=...``): a URL's scheme ends at a ``:``, and a
mistyped one (``postgresql//...``) has a ``/`` before any ``=``."""

_KEYWORD = re.compile(
    r"(?P<key>[^\s=]+)(?P<eq>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.?)*)",
    re.DOTALL)
"""One ``keyword = value`` of a libpq keyword/value string, as libpq's parser reads it."""

_WORD = re.compile(r"\S*")

_PARAMETER = re.compile(r"(?P<key>[^&=]*)=(?P<value>[^&]*)")
"""One ``name=value`` of a URL's query: the value runs to the next ``&``."""


def _is_password(key: str) -> bool:
    # libpq reads ``password`` as the password and ``sslpassword`` as the passphrase of
    # the client's key; a URL's names are percent-decoded first.
    return unquote(key).strip().lower().endswith("password")


def _keyword_values(text: str) -> Iterator[re.Match[str]]:
    """The password values of a keyword/value string (a keyword without an ``=`` is
    skipped, as far as its next blank)."""
    at = 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        found = _KEYWORD.match(text, at)
        if found is None:  # a keyword with no '=': libpq refuses it, nothing to take
            at = _WORD.match(text, at).end()  # type: ignore[union-attr]
            continue
        if _is_password(found["key"]):
            yield found
        at = max(found.end(), at + 1)


def _query_values(query: str, offset: int) -> Iterator[tuple[int, int]]:
    """Where the password values of a URL's query (which starts at ``offset``) are."""
    for found in _PARAMETER.finditer(query):
        if _is_password(found["key"]):
            yield offset + found.start("value"), offset + found.end("value")


def _spans(url: str) -> list[tuple[int, int]]:
    """Where the passwords in ``url`` are, first to last, overlaps joined."""
    if _KEY_VALUE.match(url):
        return [m.span("value") for m in _keyword_values(url)]
    # A URL, or text meant as one: the credentials after '://' (else from the start), up
    # to the last '@' (a password may hold one unencoded); the query from the first '?'
    # after them (the password may hold one too: then both are masked, overlapping).
    start = url.index("://") + 3 if "://" in url else 0
    spans = []
    at = url.rfind("@", start)
    colon = url.find(":", start, max(at, start))
    if colon >= 0:
        spans.append((colon + 1, at))
    query = url.find("?", start)
    if query >= 0:
        spans.extend(_query_values(url[query + 1:], query + 1))
    joined: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if joined and begin <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((begin, end))
    return joined


def redact_url(url: str) -> str:
    """``url`` with every password in it replaced by ``***`` (for errors and logs)."""
    out, done = [], 0
    for begin, end in _spans(url):
        out += [url[done:begin], MASK]
        done = end
    return "".join(out) + url[done:]


def _unescaped(value: str) -> str:
    """A keyword/value string's value as libpq reads it: unquoted, escapes undone."""
    if value.startswith("'"):
        value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
    return re.sub(r"\\(.)", r"\1", value, flags=re.DOTALL)


_URL_BREAKS = re.compile(r"[/?#]")
"""What ends a URL's host part: written unencoded in a password, it splits the password
there, and libpq reads its pieces as the port and the database's name, and quotes them."""


def _passwords(url: str) -> set[str]:
    """Every spelling of the passwords ``url`` holds: as written, percent-decoded,
    unquoted and unescaped, and the pieces a ``/``, ``?`` or ``#`` in it cuts it into."""
    spellings = set()
    for begin, end in _spans(url):
        value = url[begin:end]
        spellings |= {value, unquote(value), unquote_plus(value), value.strip("'"),
                      _unescaped(value), *_URL_BREAKS.split(value)}
    return {v for v in spellings if v}


SHORT_SECRET = 8
"""Below this many characters a password is masked only where it stands as a word of its own
(see :func:`redact_text`); from it on, wherever it appears."""


def redact_text(text: str, url: str) -> str:
    """``text`` (a driver's error about ``url``) with every password of ``url`` in it
    replaced by ``***``: libpq quotes a password it cannot parse (``invalid
    percent-encoded token: "..."``).

    A password shorter than :data:`SHORT_SECRET` is masked where it stands alone: not
    with a letter, digit or ``_`` right before or after it. Wherever a driver or a URL
    prints a password it stands so (``"pg"``, ``:pg@``, ``password=pg``), while inside a
    word it is part of the word: masking there made ``cannot`` read ``c***nnot`` for the
    password ``a``, and the masks spelled the password out (every ``a`` gone). A longer
    password is masked inside words too: text that holds it is the password."""
    for secret in sorted(_passwords(url), key=len, reverse=True):
        if len(secret) >= SHORT_SECRET:
            text = text.replace(secret, MASK)
        else:
            text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", MASK, text)
    return text
