"""``kinbox serve``: the runtime and its HTTP API on uvicorn, bound to loopback by default.

The order is the promise: flags are checked (usage errors, status 2), the
brain is imported, the socket is bound (a port in use is one line, status
1, and nothing opened), the runtime starts, and only then does a line say
``serving http://HOST:PORT/``. Without ``--brain`` the process is
send-only (it serves and writes, and never claims a row) and says so.

Binding anything but loopback is an explicit choice: it needs the Host
names to answer (``--allow-host``) and an operator token
(``--token-file`` or ``$KINBOX_OPERATOR_TOKEN``) that every call but ``GET /``
and ``/healthz`` must present, and it prints a warning. Answering a name that is not
loopback (behind a proxy on this machine) needs the token too.

uvicorn runs on its own thread so that the main thread keeps kinbox's
:class:`~kinbox.actors.interrupts.StopSignals`: the first SIGINT/SIGTERM
stops the server (no new connections, requests in flight finish), then the
runtime, and prints what was done; a second exits at once (130).

The main thread waits for that thread to end, and joins it, so that no thread of
it is still running, or closing the database connection its reads opened, while the
interpreter tears itself down. It waits on an event, never in
``Thread.join(timeout)``: on Python < 3.13 a signal handler that raises inside
``join`` marks the thread stopped while it runs (CPython issue 90882), and the next
``join`` returns at once. The wait is bounded (:data:`HTTP_END_SECONDS`): a request
whose thread waits on a database server that stopped answering (hung, paused) never
ends, and uvicorn's loop, as it closes, joins its default executor's threads (the peer
endpoints' ``asyncio.to_thread``). So the HTTP thread is a daemon, and so are the threads
it starts: anyio's workers for the routes' blocking calls inherit it, and the loop's
default executor is :func:`.daemon_default_executor`'s. The command stops the runtime
and exits without them, as every other kinbox thread lets it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import anyio.to_thread
import uvicorn

from ..transport import (
    LOOPBACK_HOSTS,
    ExposedWithoutToken,
    HandshakeLimits,
    OperatorToken,
    PeerEndpoint,
    create_app,
)
from ..transport.head_deadline import head_deadline
from ..transport.host_names import is_loopback
from ..transport.ws_pongs import bounded_pongs
from .brain_ref import load_brain
from .daemon_pool import daemon_default_executor
from .errors import BrainRefError, ConfigError
from .focal import Focal
from .http_backends import answered, cron_social_routes
from .interrupts import Interrupted, StopSignals
from .peer_backend import PeerHttpBackend
from .runtime import Runtime
from .serve_flags import (
    TOKEN_ENV,
    WILDCARD_ADDRESSES,
    read_token,
    token_file_exposure,
)
from .worker import ended_by_itself, summary

log = logging.getLogger("kinbox.serve")

STARTUP_TIMEOUT = 30.0
"""Seconds uvicorn may take to start serving on the bound socket."""
WS_MAX_SIZE = 1 << 20
"""Bytes a websocket message may have at the server (peer frames are refused far below)."""
GRACE_SECONDS = 10
"""Seconds requests in flight get to finish after the first stop signal."""
HTTP_THREADS = 8
"""Threads the HTTP requests' blocking calls (the runtime's reads and writes) share. Each
thread that reads keeps a database connection of its own (on PostgreSQL a server process):
anyio's default pool has 40, and a burst of slow requests left a send-only server holding
that many connections for good."""
HTTP_END_SECONDS = GRACE_SECONDS + 10
"""Seconds the HTTP thread gets to end after the first stop signal: its requests' grace,
then uvicorn cancels what is left and closes its loop."""


class RuntimeHttpBackend:
    """The :class:`~kinbox.transport.HttpBackend` of a running runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @property
    def focal(self) -> Focal:
        return self.rt.focal

    def focal_status(self) -> dict[str, Any]:
        """``GET /focal``."""
        with answered(self.rt):  # it creates the Focal chat: a stopped runtime's writer refuses
            return self.focal.status()

    def focal_panel(self) -> dict[str, Any]:
        """``GET /focal/panel``."""
        with answered(self.rt):
            return self.focal.panel()

    def cancel_wakeup(self, job_id: str) -> bool:
        """``DELETE /focal/wakeups/{job_id}``."""
        with answered(self.rt):
            return bool(self.focal.schedule and self.focal.schedule.cancel(job_id))

    def notifications(self) -> dict[str, Any]:
        """The notification feed."""
        with answered(self.rt):
            return {"notifications": list(self.focal.notifications), "unread": self.focal.unread}

    def mark_read(self) -> None:
        """Clear the unread count."""
        with answered(self.rt):
            self.focal.mark_read()

    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return self.rt.health()


def app_for(
    rt: Runtime,
    host: str = "127.0.0.1",
    allowed_hosts: Sequence[str] = (),
    operator: OperatorToken | None = None,
    clock: Callable[[], float] = time.monotonic,
    peer_handshakes: HandshakeLimits | None = None,
    *,
    allow_unauthenticated: bool = False,
) -> Any:
    """The HTTP application of a started runtime.

    It answers loopback names, ``allowed_hosts``, and the bind address
    ``host`` itself when that is one address (not ``0.0.0.0``);
    ``operator`` is the token every call but ``GET /`` and ``/healthz`` must present,
    required when it answers a name that is not loopback or ``host`` is not a loopback
    address (a wildcard too: the Host check stops a browser, not a client elsewhere that
    sends ``Host: localhost`` itself): :class:`ConfigError`, ``field`` ``"operator"``,
    unless ``allow_unauthenticated`` says a proxy in front of it authenticates every
    request;
    ``clock`` (monotonic seconds) times the lock-out of a client that presents too many
    wrong tokens or fails too many peer handshakes, and those handshakes' deadlines;
    ``peer_handshakes`` bounds the peer endpoint's handshakes
    (:class:`~kinbox.transport.HandshakeLimits`' defaults when not given).
    """
    hosts = [*LOOPBACK_HOSTS, *allowed_hosts]
    if host not in WILDCARD_ADDRESSES and host not in hosts:
        hosts.append(host)
    if not is_loopback(host) and operator is None:
        if not allow_unauthenticated:
            raise ConfigError(f"host {host!r} is reachable from other machines, which can "
                              "send any Host: give an operator token (operator=OperatorToken."
                              "from_secret(...)), or allow_unauthenticated=True when a proxy "
                              "in front of it authenticates every request", field="operator")
        log.warning("the HTTP app is served on %s without an operator token "
                    "(allow_unauthenticated): whatever is in front of it must authenticate "
                    "every request", host)
    peers = PeerEndpoint(PeerHttpBackend(rt.peers), hosts, peer_handshakes, clock)
    try:
        return create_app(
            RuntimeHttpBackend(rt),
            hosts,
            operator,
            peers.routes(),
            guarded_routes=cron_social_routes(rt),
            clock=clock,
            allow_unauthenticated=allow_unauthenticated,
        )
    except ExposedWithoutToken as exc:
        raise ConfigError(str(exc), field="operator") from None


def _checked(args: argparse.Namespace) -> tuple[Any, OperatorToken | None]:
    """The brain and the token, or a usage error (exits 2)."""
    parser: argparse.ArgumentParser = args.parser
    try:
        operator = read_token(args.token_file)
    except ValueError as exc:
        parser.error(str(exc))
    # Read once, kept as a digest: a subprocess a brain or its tools start must not inherit it.
    os.environ.pop(TOKEN_ENV, None)
    if not is_loopback(args.host) and not args.allow_host:
        parser.error(
            f"--host {args.host} is reachable from other machines: name the Host "
            "names to answer with --allow-host NAME (repeatable)"
        )
    why = _exposure(args)
    if why and operator is None:
        parser.error(f"{why}: give an operator token (--token-file PATH or $KINBOX_OPERATOR_TOKEN)")
    try:
        brain = load_brain(args.brain) if args.brain else None
    except BrainRefError as exc:
        parser.error(str(exc))
    return brain, operator


def _exposure(args: argparse.Namespace) -> str | None:
    """Why other machines can reach this server, or None when only this one can."""
    if not is_loopback(args.host):
        return f"--host {args.host} is reachable from other machines"
    names = [h for h in args.allow_host if not is_loopback(h)]
    if names:  # a proxy on this machine forwards requests from elsewhere
        return (
            f"--allow-host {', '.join(names)} answers requests that come from other "
            "machines through a proxy"
        )
    return None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (OSError when the address is taken or wrong)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host.strip("[]"), port), family=family)


def _url(host: str, sock: socket.socket) -> str:
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}/"


class _Server(uvicorn.Server):
    """uvicorn, telling a waiting thread when it has started serving."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.ended = threading.Event()
        """Set when ``run`` returned (or raised), on its own thread."""
        self.end_by: float | None = None
        """The monotonic time after which the HTTP thread is no longer waited for."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        daemon_default_executor(asyncio.get_running_loop(), "kinbox-http-thread")
        # The routes' blocking calls run on anyio's pool (its limiter is this loop's).
        anyio.to_thread.current_default_thread_limiter().total_tokens = HTTP_THREADS
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.ready.set()


def _run_server(server: _Server, sock: socket.socket) -> None:
    """The HTTP thread: serve on ``sock`` until told to stop; ``server.ended`` says it did."""
    try:
        server.run(sockets=[sock])
    finally:
        server.ended.set()


def _stop_http(server: _Server | None, thread: threading.Thread | None) -> None:
    """Stop uvicorn and wait for its thread (requests in flight get ``GRACE_SECONDS``), for
    :data:`HTTP_END_SECONDS` after the first call at most: one still running then is left
    to the process (a request waiting on a database server that stopped answering)."""
    if server is None or thread is None:
        return
    server.should_exit = True
    if thread.ident is None:  # never started
        return
    first = server.end_by is None
    if server.end_by is None:
        server.end_by = time.monotonic() + HTTP_END_SECONDS
    if server.ended.wait(max(0.0, server.end_by - time.monotonic())):
        thread.join()  # its thread state is gone: what it held is released
    elif first:
        log.warning("the HTTP server did not end within %s s (a request waiting on the "
                    "database?): exiting without it", HTTP_END_SECONDS)


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Serve until the first stop signal."""
    brain, operator = _checked(args)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(
            f"kinbox: cannot bind {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    rt = Runtime(db=args.db, brain=brain, data_dir=args.data_dir)
    server: _Server | None = None
    thread: threading.Thread | None = None
    with sock, StopSignals():
        try:
            rt.start()
            server = _Server(
                uvicorn.Config(
                    app_for(rt, args.host, args.allow_host, operator),
                    log_level="warning",
                    lifespan="off",
                    timeout_graceful_shutdown=GRACE_SECONDS,
                    ws_max_size=WS_MAX_SIZE,
                    http=head_deadline(),
                    ws=bounded_pongs(),
                    # The peer heard is the client: uvicorn's default takes X-Forwarded-For
                    # from any loopback connection, which a client behind a proxy that passes
                    # headers on (a TCP forward, a tunnel) writes itself, a new address per
                    # wrong token, never locked out (token_tries keys on it).
                    proxy_headers=False,
                )
            )
            thread = threading.Thread(
                target=_run_server, args=(server, sock), name="kinbox-http", daemon=True
            )
            thread.start()
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while not server.ready.wait(0.05):
                if server.ended.is_set() or time.monotonic() > deadline:
                    print("kinbox: the HTTP server did not start", file=sys.stderr)
                    return 1
            _announce(args, sock, brain is not None, operator is not None, out)
            while not server.ended.is_set() and rt.state == "running":
                server.ended.wait(1.0)  # a signal interrupts this wait (never a join: above)
            if rt.state != "running":  # it lost its database (see Runtime's life lock)
                _stop_http(server, thread)
                return ended_by_itself(rt, "serve", out)
            print("kinbox: the HTTP server stopped by itself", file=sys.stderr)
            return 1
        except Interrupted:
            _stop_http(server, thread)  # stop accepting; requests in flight finish
            if rt.state == "new":
                out.write("kinbox serve stopped before it started\n")
                return 0
            if rt.state != "running":  # it crashed before the signal came: that is the end
                return ended_by_itself(rt, "serve", out)
            rt.stop()
            log.info("stopped serving")
            out.write(f"kinbox serve stopped: HTTP closed, runtime stopped; {summary(rt)}\n")
            return 0
        finally:
            _stop_http(server, thread)  # whatever ended the command: no server outlives it
            rt.stop()


def _announce(
    args: argparse.Namespace, sock: socket.socket, delivering: bool, has_token: bool, out: TextIO
) -> None:
    log.info("serving %s (%s)", _url(args.host, sock), "delivering" if delivering else "send-only")
    out.write(f"kinbox serving {_url(args.host, sock)} (GET / lists the routes)\n")
    if delivering:
        out.write(f"kinbox serve: delivering with brain {args.brain}\n")
    else:
        out.write(
            "kinbox serve: send-only (no --brain): serves and writes, delivers nothing; "
            "run a delivering process beside it (kinbox worker --brain MODULE:ATTR)\n"
        )
    out.flush()
    exposed = token_file_exposure(args.token_file)
    if exposed:
        print(f"kinbox serve: WARNING: {exposed}", file=sys.stderr)
    why = _exposure(args)
    if why:
        print(
            f"kinbox serve: WARNING: {why}; answering Host {', '.join(args.allow_host)} "
            "and loopback names; every call but GET / and /healthz needs the operator token",
            file=sys.stderr,
        )
    elif has_token:
        print(
            "kinbox serve: every call but GET / and /healthz needs the operator token",
            file=sys.stderr,
        )
