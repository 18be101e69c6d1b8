"""A request's JSON body at the HTTP boundary: capped in size, then parsed, or refused.

Every route that takes a JSON body reads it here, so each refuses the same
way: a ``Content-Length`` or a body past the route's cap is 413 (read no
further than the cap: memory stays bounded whatever a client sends), a body
that has not all come within :data:`BODY_TIMEOUT` seconds of the route's first
read is 408 (a client that drips it, or stops, held the route for ever), a body
whose client went away before its end is 400 (Starlette's ``ClientDisconnect``
escaped the route: an unhandled exception, logged at ERROR, for a dropped
connection), bytes that are not UTF-8 JSON are 400, and JSON nested past what
the parser can follow is 400 too (Python's parser raises ``RecursionError`` there, not a
``ValueError``; a ``"[" * 100000`` body was a 500). Refusals are
:class:`.errors.BackendRefused`, which every route already answers with.

The JSON is strict, as a peer's frames are (:mod:`.frames`): an object that
names a key twice is refused, since parsers disagree on which one counts (a
signed webhook's ``sender_id`` could be one thing to the platform that
checked it and another here); ``NaN`` and ``Infinity`` are Python's, not
JSON; and the bytes must be UTF-8 (Python's parser would also guess UTF-16
and UTF-32).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .errors import BackendRefused

BODY_TIMEOUT = 30.0
"""Seconds a client has to send a whole body, from the route's first read of it."""


def _too_large(cap: int) -> BackendRefused:
    return BackendRefused(413, "too_large", f"the body is limited to {cap} bytes")


async def read_capped(request: Request, cap: int, timeout: float = BODY_TIMEOUT) -> bytes:
    """The body's bytes; :class:`BackendRefused` (413) as soon as it is over ``cap``, (408)
    when it has not all come within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and not (declared.isascii() and declared.isdigit()):
        raise BackendRefused(400, "bad_request",
                             f"Content-Length must be a whole number of bytes, not {declared!r}")
    if declared is not None:
        # Read as a number only when it can be one within the cap: Python reads at most
        # 4,300 digits (a ValueError, a 500, past them).
        digits = declared.lstrip("0") or "0"
        if len(digits) > len(str(cap)) or int(digits) > cap:
            raise _too_large(cap)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise _too_large(cap)
                chunks.append(chunk)
    except TimeoutError:
        raise BackendRefused(408, "request_timeout",
                             f"the body did not all come within {timeout:g} s") from None
    except ClientDisconnect:  # no one hears the answer; it is a refusal all the same
        raise BackendRefused(400, "incomplete_body",
                             "the connection closed before the body ended") from None
    return b"".join(chunks)


class _NotStrict(ValueError):
    """What the parser's hooks raise: the body is JSON to Python only (why, in ``args``)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotStrict(f"the key {key[:64]!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _NotStrict(f"{name} is not a JSON value")


def parse(body: bytes) -> Any:
    """The JSON value of ``body``; :class:`BackendRefused` (400) when it is not strict
    UTF-8 JSON (see the module's docstring)."""
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=_unique,
                          parse_constant=_no_constant)
    except _NotStrict as exc:
        raise BackendRefused(400, "bad_json", f"the body is not JSON: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BackendRefused(400, "bad_json", "the body is not JSON") from None


async def json_object(request: Request, cap: int) -> dict[str, Any]:
    """The body as a JSON object (422 when it is JSON but not an object)."""
    value = parse(await read_capped(request, cap))
    if not isinstance(value, dict):
        raise BackendRefused(422, "invalid_argument", "the body must be a JSON object")
    return value
