"""A request's JSON body at the HTTP boundary: capped in size, then parsed, or refused.

Every route that takes a JSON body reads it here, so each refuses the same
way: a ``Content-Length`` or a body past the route's cap is 413 (read no
further than the cap: memory stays bounded whatever a client sends), bytes
that are not UTF-8 JSON are 400, and JSON nested past what the parser can
follow is 400 too (Python's parser raises ``RecursionError`` there, not a
``ValueError``; a ``"[" * 100000`` body was a 500). Refusals are
:class:`.errors.BackendRefused`, which every route already answers with.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from .errors import BackendRefused


def _too_large(cap: int) -> BackendRefused:
    return BackendRefused(413, "too_large", f"the body is limited to {cap} bytes")


async def read_capped(request: Request, cap: int) -> bytes:
    """The body's bytes; :class:`BackendRefused` (413) as soon as it is over ``cap``."""
    declared = request.headers.get("content-length")
    if declared is not None and not (declared.isascii() and declared.isdigit()):
        raise BackendRefused(400, "bad_request",
                             f"Content-Length must be a whole number of bytes, not {declared!r}")
    if declared is not None and int(declared) > cap:
        raise _too_large(cap)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
    return b"".join(chunks)


def parse(body: bytes) -> Any:
    """The JSON value of ``body``; :class:`BackendRefused` (400) when it is not JSON."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BackendRefused(400, "bad_json", "the body is not JSON") from None


async def json_object(request: Request, cap: int) -> dict[str, Any]:
    """The body as a JSON object (422 when it is JSON but not an object)."""
    value = parse(await read_capped(request, cap))
    if not isinstance(value, dict):
        raise BackendRefused(422, "invalid_argument", "the body must be a JSON object")
    return value
