"""``kinbox serve``: the runtime and its HTTP API on uvicorn, bound to loopback by default."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..transport import LOOPBACK_HOSTS, create_app
from ..transport.peer_ws import PeerEndpoint
from .focal import Focal
from .peers import PeerHttpBackend
from .runtime import Runtime


class FocalHttpBackend:
    """The :class:`~kinbox.transport.FocalBackend` of a running runtime."""

    def __init__(self, focal: Focal) -> None:
        self.focal = focal

    def focal_status(self) -> dict[str, Any]:
        """``GET /focal``."""
        return self.focal.status()

    def focal_panel(self) -> dict[str, Any]:
        """``GET /focal/panel``."""
        return self.focal.panel()

    def cancel_wakeup(self, job_id: str) -> bool:
        """``DELETE /focal/wakeups/{job_id}``."""
        return bool(self.focal.schedule and self.focal.schedule.cancel(job_id))

    def notifications(self) -> dict[str, Any]:
        """The notification feed."""
        return {"notifications": list(self.focal.notifications), "unread": self.focal.unread}

    def mark_read(self) -> None:
        """Clear the unread count."""
        self.focal.mark_read()


def app_for(rt: Runtime, host: str = "127.0.0.1") -> Any:
    """The HTTP application of a started runtime, answering ``host`` and loopback names."""
    hosts = list(LOOPBACK_HOSTS) if host in LOOPBACK_HOSTS else [host]
    peers = PeerEndpoint(PeerHttpBackend(rt.peers), hosts)
    return create_app(FocalHttpBackend(rt.focal), hosts, peers.routes())


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``."""
    p = sub.add_parser("serve", help="run the runtime and its HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--db", help="database URL (default: $KINBOX_DB, then the data dir file)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Serve until interrupted."""
    import uvicorn

    with Runtime(db=args.db) as rt:
        out.write(f"kinbox serving http://{args.host}:{args.port}/focal\n")
        out.flush()
        uvicorn.run(app_for(rt, args.host), host=args.host, port=args.port, log_level="warning",
                    ws_max_size=1 << 20)
    return 0
