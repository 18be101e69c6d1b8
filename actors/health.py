"""Is a runtime fit to serve? The checks behind ``Runtime.health`` and ``/healthz``.

Each check answers within the caller's timeout whatever the database does: the write
check is an operation the writer must commit in time (a timed-out one is withdrawn,
never run late), one statement on the writer's own connection (an empty operation sends
PostgreSQL nothing, and said healthy while that connection was gone), and the read
check runs on a thread of its own, so a
database that hangs (a table locked by a migration, a network that drops packets)
makes it time out, never the caller. Never raises: a failing check says why in its
``error`` and names the exception's type in its ``error_type``.

The read thread stays for the next probe, with its connection, until none has come for
:data:`PROBE_IDLE` seconds: a load balancer asking ``/healthz`` every second would
otherwise open (and a PostgreSQL server fork and authenticate) a connection a second.
A runtime's stop closes that connection with every other (``close_all``); the next
probe connects again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..persistence import GroupCommitWriter
from .context import RuntimeContext
from .errors import RuntimeStateError

log = logging.getLogger("kinbox.runtime")

PROBE_IDLE = 60.0
"""Seconds the read thread (and its connection) waits for a next probe before it ends."""

_Probe = tuple[RuntimeContext, "Future[Any]"] | None
"""A read to answer, or None: the read thread ends (the runtime stops)."""


def _failure(exc: BaseException) -> dict[str, str]:
    """A failed check's ``error`` (type and text) and its ``error_type`` alone: the part
    a caller without the operator token may see (the text may name hosts or paths)."""
    return {"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__}


def _statement(ctx: RuntimeContext | None) -> Callable[[], object]:
    """The writer check's operation: ``SELECT 1`` on the connection the writer commits
    with (nothing when there is no database to ask)."""
    if ctx is None:
        return lambda: None
    db = ctx.store.t.db
    return lambda: db.execute_sql("SELECT 1").fetchone()


class HealthChecks:
    """The checks of one runtime, and the read thread they keep between calls."""

    def __init__(self, idle: float = PROBE_IDLE) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._probe: Future[Any] | None = None
        """The last database read (a new one starts only once it has answered)."""
        self._asks: queue.SimpleQueue[_Probe] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        """The read thread while it waits for probes (None once it has ended)."""
        self._closed = False
        """The runtime stopped (it starts once): no probe comes that a connection kept
        would serve, and a probe's read thread ends with its answer."""

    def report(self, state: str, ctx: RuntimeContext | None,
               writer: GroupCommitWriter | None, send_only: bool,
               timeout: float) -> dict[str, Any]:
        """``{"healthy": bool, "checks": {name: {"ok": ...}}}`` (see ``Runtime.health``)."""
        checks: dict[str, dict[str, Any]] = {"runtime": {"ok": state == "running",
                                                         "state": state}}
        try:
            if ctx is None:
                raise RuntimeStateError("the runtime is not started", state=state)
            self._read(ctx, timeout)
            checks["database"] = {"ok": True}
        except Exception as exc:
            checks["database"] = {"ok": False, **_failure(exc)}
        try:
            if writer is None:
                raise RuntimeStateError("the runtime has no writer", state=state)
            began = time.monotonic()
            writer.call(_statement(ctx), timeout=timeout)
            checks["writer"] = {"ok": True, "commit_ms": round((time.monotonic() - began)
                                                               * 1000, 1)}
        except Exception as exc:
            checks["writer"] = {"ok": False, **_failure(exc),
                                "queued": writer.queued() if writer is not None else 0}
        if send_only:
            checks["dispatcher"] = {"ok": True, "state": "send-only"}
        else:
            alive = ctx is not None and ctx.dispatcher is not None and ctx.dispatcher.is_alive()
            checks["dispatcher"] = {"ok": alive, "state": "running" if alive else "stopped"}
        return {"healthy": all(c["ok"] for c in checks.values()), "checks": checks}

    def _read(self, ctx: RuntimeContext, timeout: float) -> None:
        """A primary-key read (cheap, real) within ``timeout``, on the read thread (a
        daemon: one stuck in the database keeps no process from exiting); while an earlier
        one has not answered, the database is not answering, and no other is started."""
        with self._lock:
            probe = self._probe
            if probe is None or probe.done():
                probe = self._probe = Future()
                self._asks.put((ctx, probe))
                if self._reader is None:
                    idle = 0.0 if self._closed else self.idle
                    self._reader = threading.Thread(target=self._serve, args=(idle,),
                                                    name="kinbox-health", daemon=True)
                    self._reader.start()
        try:
            probe.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer from the database within {timeout} s") from None

    def close(self) -> None:
        """End the read thread and its connection (a stop: it is not waited for, as a read
        stuck in the database ends only with it); a probe after it reads on a thread that
        ends, its connection closed, once it has answered."""
        with self._lock:
            self._closed = True
            if self._reader is not None:
                self._asks.put(None)
                self._reader = None

    def _serve(self, idle: float) -> None:
        """The read thread: answer probes on this thread's connection (kept between
        them) until none comes for ``idle`` seconds."""
        ctx: RuntimeContext | None = None
        while True:
            try:
                ask = self._asks.get(timeout=idle)
            except queue.Empty:
                with self._lock:  # a probe put from here on finds no reader and starts one
                    if self._asks.empty():
                        self._reader = None
                        break
                continue
            if ask is None:
                break
            ctx, answer = ask
            try:
                answer.set_result(ctx.store.session("kinbox-health-probe"))
            except BaseException as exc:
                answer.set_exception(exc)
                _close(ctx)  # a broken connection is not kept for the next probe
        if ctx is not None:
            _close(ctx)


def _close(ctx: RuntimeContext) -> None:
    """Close this thread's connection (not the others'); a close that fails (a connection
    already broken) ends no read thread."""
    try:
        ctx.store.t.db.close()
    except Exception:
        log.debug("closing the health probe's connection failed", exc_info=True)
