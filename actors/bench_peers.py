"""``kinbox bench peers``: acked messages per second between two processes on 127.0.0.1.

Three systems, each a sender in this process and a receiver in a child:

- ``raw_ws_one_way``: plain websockets, fire and forget (the ceiling);
- ``raw_ws_windowed_ack``: plain websockets, each message acked by the
  receiver with at most ``window`` unacknowledged (the protocol kinbox runs,
  with no durability);
- ``bare_durable``: the smallest link with kinbox's guarantee (raw sqlite3
  and websockets, bench_peer_bare.py): the yardstick for what kinbox adds;
- ``kinbox_peers``: a kinbox runtime sending to ``kinbox serve``: every
  message committed on the sender before the link sees it, committed on the
  receiver before its ack, and the ack committed on the sender (SQLite,
  ``synchronous=FULL`` on both sides).

Throughput is measured on a backlog (every message available at the start,
as a burst of ``agent_send`` calls makes it); latencies in a closed loop
that keeps ``window`` messages in flight, so they compare with the raw
run's: time from handing a message over (enqueue commit or socket send) to
its ack.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from ..persistence.opened import opened
from ..persistence.peers import PeerStore
from ..transport import frames
from .bench_peer_bare import bare_durable
from .bench_runs import _ms, percentile
from .data_dirs import resolve_data_dir
from .peers import device_identity, new_invite
from .runtime import Runtime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the benchmark receiver exited early")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        threading.Event().wait(0.05)
    raise RuntimeError("the benchmark receiver did not start")


def _payload(i: int) -> str:
    return frames.encode(frames.Deliver(f"msg-{i:08d}", f"benchmark message {i}", None))


def raw(n: int, window: int | None) -> dict[str, Any]:
    """Plain websockets: one-way (``window`` None) or windowed acks."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kinbox.actors.bench_peer_child", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        path = "/count" if window is None else "/ack"
        with connect(f"ws://127.0.0.1:{port}{path}", proxy=None, compression=None) as ws:
            latencies: list[float] = []
            started = time.perf_counter()
            if window is None:
                for i in range(n):
                    ws.send(_payload(i))
                ws.send("END")
                assert int(ws.recv(60)) == n
            else:
                sent_at: dict[str, float] = {}
                next_i = 0
                while len(latencies) < n:
                    while next_i < n and len(sent_at) < window:
                        sent_at[f"msg-{next_i:08d}"] = time.perf_counter()
                        ws.send(_payload(next_i))
                        next_i += 1
                    ack = json.loads(ws.recv(60))
                    latencies.append(time.perf_counter() - sent_at.pop(ack["id"]))
            elapsed = time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(10)
    return {"messages": n, "elapsed_s": round(elapsed, 3), "msgs_per_s": round(n / elapsed),
            "p50_ms": _ms(percentile(latencies, 0.5)), "p99_ms": _ms(percentile(latencies, 0.99))}


def kinbox(n: int, window: int, workdir: Path) -> dict[str, Any]:
    """A kinbox runtime sending to a ``kinbox serve`` process, durable on both sides."""
    port = _free_port()
    receiver_url = f"sqlite:///{workdir / 'receiver' / 'r.db'}"
    (workdir / "receiver").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-m", "kinbox.actors", "serve", "--db",
                             receiver_url, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    acked_at: dict[str, float] = {}
    done = threading.Condition()

    def observe(event: str, data: dict[str, Any]) -> None:
        if event == "peer_acked":
            with done:
                acked_at[data["message_id"]] = time.perf_counter()
                done.notify_all()

    # The sender delivers (its link sends the rows), so it holds a brain; its own
    # sessions receive nothing here. The receiver is send-only: it commits and acks.
    rt = Runtime(db=f"sqlite:///{workdir / 'sender' / 's.db'}", brain=lambda turn: None)
    rt.subscribe(observe)
    try:
        _wait_port(port, proc)
        rt.start()
        code = _invite(receiver_url)
        rec = rt.peers.pair(f"http://127.0.0.1:{port}", code)
        target = f"peer:{rec.device_id}"
        sender = rt.create_session(None, "bench").id
        # Throughput: a backlog of n messages (committed 500 to a transaction, as a burst
        # of agent sends would be), carried with the link's window, until the last ack.
        started = time.perf_counter()
        for first in range(0, n, 500):
            rt.peers.send_many(sender, target, [f"benchmark message {i}" for i in
                                                range(first, min(n, first + 500))])
        with done:
            done.wait_for(lambda: len(acked_at) >= n, 600)
        elapsed = time.perf_counter() - started
        # Latency: a closed loop keeping ``window`` messages in flight, like the raw run.
        latencies = _closed_loop(rt, sender, target, min(n, 2_000), window, acked_at, done)
    finally:
        rt.stop()  # a no-op unless it is running
        proc.terminate()
        proc.wait(15)
    return {"messages": n, "elapsed_s": round(elapsed, 3), "msgs_per_s": round(n / elapsed),
            "p50_ms": _ms(percentile(latencies, 0.5)), "p99_ms": _ms(percentile(latencies, 0.99))}


def _closed_loop(rt: Runtime, sender: str, target: str, n: int, window: int,
                 acked_at: dict[str, float], done: threading.Condition) -> list[float]:
    """Send ``n`` more messages, at most ``window`` unacknowledged; their ack latencies."""
    sent_at: dict[str, float] = {}
    chunk = max(1, window // 4)
    while len(sent_at) < n:
        with done:
            done.wait_for(lambda: sum(m not in acked_at for m in sent_at) <= window - chunk, 120)
        take = min(chunk, n - len(sent_at))
        now = time.perf_counter()
        for r in rt.peers.send_many(sender, target, ["latency probe"] * take):
            sent_at[r["message_id"]] = now
    with done:
        done.wait_for(lambda: all(m in acked_at for m in sent_at), 120)
    return [acked_at[m] - t for m, t in sent_at.items() if m in acked_at]


def _invite(url: str) -> str:
    identity = device_identity(resolve_data_dir(url, None))  # the serving device's key
    with opened(url) as (tables, writer):
        return new_invite(identity, PeerStore(tables, writer), frozenset({"agent"}), 600,
                          time.time())


def peers(quick: bool, window: int = 64, messages: int | None = None) -> dict[str, Any]:
    """The four systems on the same message count, in one run."""
    n = messages or (2_000 if quick else 20_000)
    workdir = Path(tempfile.mkdtemp(prefix="kinbox-bench-peers-"))
    try:
        bare = bare_durable(n, window, workdir, _free_port(), _wait_port)
        lat = bare.pop("latencies")
        bare.update(p50_ms=_ms(percentile(lat, 0.5)), p99_ms=_ms(percentile(lat, 0.99)))
        results = {"raw_ws_one_way": raw(n, None), "raw_ws_windowed_ack": raw(n, window),
                   "bare_durable": bare, "kinbox_peers": kinbox(n, window, workdir)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    k, w = results["kinbox_peers"]["msgs_per_s"], results["raw_ws_windowed_ack"]["msgs_per_s"]
    b = results["bare_durable"]["msgs_per_s"]
    return {"settings": {"messages": n, "window": window, "receiver": "kinbox serve (SQLite)",
                         "durability": "synchronous=FULL on both sides"},
            "results": results,
            "ratios": {"kinbox_vs_raw_windowed_ack": round(k / w, 3),
                       "kinbox_vs_bare_durable": round(k / b, 3),
                       "bare_durable_vs_raw_windowed_ack": round(b / w, 3),
                       "kinbox_vs_raw_one_way": round(
                           k / results["raw_ws_one_way"]["msgs_per_s"], 3),
                       "target_vs_raw_windowed_ack": 0.5}}
