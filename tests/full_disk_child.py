"""A send-only process whose disk fills while it sends: posts until a send fails.

Usage: python full_disk_child.py DB_URL SESSION_ID
Once the runtime is up, a file size limit (``RLIMIT_FSIZE``) lets the SQLite files grow
a few pages more and then makes every write past it fail as a full disk would (the
kernel's EFBIG), in the middle of a group commit's ``COMMIT`` (the WAL is written then).
Prints one JSON line: how many sends were acknowledged and the error the next one got.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path

from kinbox.actors import Runtime

ROOM = 16 * 1024
"""Bytes the files may still grow: a few commits' worth."""


def main() -> None:
    url, session_id = sys.argv[1:3]
    path = Path(url[len("sqlite:///"):])
    with Runtime(db=url) as rt:  # no brain: it writes and never claims
        largest = max(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]  # the soft limit alone: it
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest + ROOM, hard))  # can go back
        sent = 0
        try:
            for i in range(10_000):
                rt.post(session_id, "x" * 900, message_id=f"m-{i}")
                sent += 1
        except Exception as exc:  # what a sender sees is the point
            print(json.dumps({"sent": sent, "type": type(exc).__name__,
                              "kind": getattr(exc, "kind", None), "error": str(exc)}),
                  flush=True)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # the stop's writes


if __name__ == "__main__":
    main()
