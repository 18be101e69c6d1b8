"""The raw websockets baseline the peers benchmark compares kinbox with.

Usage: python -m kinbox.actors.bench_peer_child PORT

A plain websockets server with no durability: on ``/ack`` it answers every
message with an ack of its id at once; on ``/count`` it only counts, and
answers ``END`` with the count. Prints "listening" when ready.
"""

from __future__ import annotations

import asyncio
import json
import sys

from websockets.asyncio.server import ServerConnection, serve


async def handler(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request else "/"
    count = 0
    async for message in ws:
        if path == "/ack":
            frame = json.loads(message)
            await ws.send(json.dumps({"v": 1, "type": "ack", "id": frame["id"]}))
        elif message == "END":
            await ws.send(str(count))
        else:
            count += 1


async def main(port: int) -> None:
    async with serve(handler, "127.0.0.1", port, compression=None, max_size=1 << 20):
        print("listening", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
