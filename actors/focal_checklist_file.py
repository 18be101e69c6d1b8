"""``heartbeat.md`` on disk: seeded whole or not at all, read whole up to a limit.

The file is the user's checklist, and whatever it holds the heartbeat reads as one.
So a seed cut off half-way (a full disk, a crash mid-write) must leave no part of
itself behind (a half default read as the user's edited checklist, which always
runs), and a read must not take a short read's first piece for the whole file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def seed_whole(path: Path, text: str) -> bool:
    """Write ``text`` as UTF-8 to ``path`` unless a file is there: into a new file beside
    it, synced, then linked to ``path``, which fails when ``path`` exists (a user's file
    made meanwhile is kept, never replaced). True when this wrote it. :class:`OSError`
    when it cannot be written; then nothing of it is left at ``path`` or beside it.

    Where the filesystem has no hard links the new file is renamed into place
    (``os.replace``), after a last look that ``path`` is still free."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network and FUSE mounts)
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_up_to(fd: int, limit: int) -> bytes:
    """The first ``limit`` bytes of the file open at ``fd`` (fewer at its end): read by
    ``os.read`` calls until either, since one may return fewer bytes than asked for
    before the end (a network or FUSE mount's, /proc's a page at a time)."""
    pieces: list[bytes] = []
    left = limit
    while left > 0:
        piece = os.read(fd, left)
        if not piece:  # the end of the file
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)
