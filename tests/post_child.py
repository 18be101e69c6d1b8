"""A send-only process for the NOTIFY tests: posts one message and exits.

Usage: python post_child.py DB_URL SESSION_ID TEXT
Prints the message id once the send is committed.
"""

from __future__ import annotations

import sys

from kinbox.actors import Runtime


def main() -> None:
    url, session_id, text = sys.argv[1:4]
    with Runtime(db=url) as rt:  # no brain: it writes and never claims
        print(rt.post(session_id, text).message_id, flush=True)


if __name__ == "__main__":
    main()
