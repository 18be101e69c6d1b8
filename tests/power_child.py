"""A send-only runtime that posts messages and prints each receipt (the power-loss test).

Usage: python power_child.py DB_URL SYNCHRONOUS COUNT
Prints ``ready``, then the id of every message whose ``post`` returned (its
receipt: the caller was told it is committed), then ``done``; then waits to
be killed (or for stdin to close).
"""

from __future__ import annotations

import sys

from kinbox.actors import Runtime


def main() -> None:
    url, synchronous, count = sys.argv[1:]
    with Runtime(db=url, synchronous=synchronous) as rt:
        print("ready", flush=True)
        for k in range(int(count)):
            receipt = rt.post("s00", f"power {k}", message_id=f"p{k:05d}")
            print(receipt.message_id, flush=True)
        print("done", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
