"""Pykka actors that share a bounded pool of threads instead of owning one each.

A pykka ``ThreadingActor`` owns a thread for its whole life, so waking a
passivated session costs a thread start, and a workload that cycles through
more sessions than fit in memory starts and joins a thread per message
(measured: 0.85 ms of a 2.7 ms median send -> turn latency). A
:class:`PooledActor` is a full pykka actor (``ActorRef``, ``tell``, ``ask``,
proxies, the registry, ``on_start``/``on_stop``/``on_failure``), but its
mailbox, when mail arrives, puts the actor on the :class:`ActorPool`'s run
queue; a pool thread then handles its messages one at a time, never two at
once, in arrival order. Threads stay at the pool's size however many actors
are alive, and activating an actor costs an object, not a thread.

A message handler that blocks holds a pool thread; the dispatcher bounds
running turns by the pool's size, so a blocked turn never starves another.
For the same reason a handler must not wait on another pooled actor of its
pool (``ask(...).get()``): with every thread waiting, nobody would answer.
Session actors never do; they talk to the dispatcher with ``tell``.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka
from pykka import ActorRegistry, ThreadingFuture

log = logging.getLogger("kinbox.pool")
pykka_log = logging.getLogger("pykka")
"""The records pykka writes for a ``ThreadingActor``, written where and as pykka writes them."""

SLICE = 32
"""Messages an actor handles before it yields its pool thread to other actors."""
STOP_TIMEOUT = 10.0
"""Seconds the stops after a ``BaseException`` wait for each actor before going on."""

_STOP = None


class ActorPool:
    """A fixed set of threads running whichever pooled actors have mail."""

    def __init__(self, workers: int, name: str = "kinbox-actor",
                 on_exit: Callable[[], None] | None = None,
                 stop_timeout: float = STOP_TIMEOUT) -> None:
        if workers < 1:
            raise ValueError(f"an actor pool needs at least one thread, got {workers}")
        self._on_exit = on_exit
        self.name = name
        self.stop_timeout = stop_timeout
        """Seconds a stop-all (see :meth:`PooledActor._stop_all_elsewhere`) waits for each
        actor: one whose handler never returns must not keep the others running."""
        self._ready: queue.SimpleQueue[PooledActor | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def schedule(self, actor: PooledActor) -> None:
        """Queue ``actor`` to run its mail on the next free thread."""
        self._ready.put(actor)

    def stop(self, timeout: float = 10.0) -> None:
        """Let the threads finish what they run, then end them: ``timeout`` seconds for all
        together (a thread held by a turn deaf to its stop is left to end on its own)."""
        for _ in self._threads:
            self._ready.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        try:
            while True:
                actor = self._ready.get()
                if actor is _STOP:
                    return
                try:
                    actor._run_slice()
                except Exception:
                    log.exception("pooled actor %s failed outside its handlers", actor)
        finally:
            if self._on_exit is not None:
                self._on_exit()  # e.g. close this thread's database connection


class _Mailbox:
    """An actor's inbox that schedules the actor on its pool when mail arrives."""

    def __init__(self) -> None:
        self._mail: deque[Any] = deque()
        self._lock = threading.Lock()
        self._scheduled = True  # until the actor has started
        self._closed = False
        self.actor: PooledActor | None = None

    def put(self, envelope: Any) -> None:
        with self._lock:
            if self._closed:
                # The actor's stop was handled and its mail taken (``close``): nothing would
                # run this. A tell raises as pykka's does to a dead actor (its sender still
                # holds what it told); an ask gets the error in its future.
                dead = pykka.ActorDeadError(f"{self.actor} stopped before handling the message")
                if envelope.reply_to is None:
                    raise dead
                envelope.reply_to.set_exception(exc_info=(pykka.ActorDeadError, dead, None))
                return
            self._mail.append(envelope)
            if self._scheduled:
                return
            self._scheduled = True
        assert self.actor is not None
        self.actor._pool.schedule(self.actor)

    def get(self) -> Any:
        with self._lock:
            return self._mail.popleft()

    def empty(self) -> bool:
        return not self._mail

    def close(self) -> list[Any]:
        """Take no more mail; the told messages left (the asked ones stay, for pykka's
        teardown to answer)."""
        with self._lock:
            self._closed = True
            told = [e for e in self._mail if e.reply_to is None]
            self._mail = deque(e for e in self._mail if e.reply_to is not None)
        return told

    def take(self) -> Any:
        """The next envelope, or None after marking the actor unscheduled."""
        with self._lock:
            if self._mail:
                return self._mail.popleft()
            self._scheduled = False
            return None


class PooledActor(pykka.Actor):
    """A pykka actor whose messages run on an :class:`ActorPool` thread."""

    def __init__(self, pool: ActorPool) -> None:
        super().__init__()
        self._pool = pool
        self._set_up = False

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _Mailbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        mailbox: _Mailbox = self.actor_inbox  # type: ignore[assignment]
        mailbox.actor = self
        self._pool.schedule(self)  # on_start runs first, on a pool thread

    def _run_slice(self) -> None:
        mailbox: _Mailbox = self.actor_inbox  # type: ignore[assignment]
        if not self._set_up:
            self._set_up = True
            self._actor_loop_setup()
        for _ in range(SLICE):
            if self.actor_stopped.is_set():
                self._actor_loop_teardown()
                return  # stays "scheduled": a stopped actor never runs again
            envelope = mailbox.take()
            if envelope is None:
                return
            self._handle(envelope)
        if self.actor_stopped.is_set():
            self._actor_loop_teardown()
            return
        self._pool.schedule(self)  # more mail may wait: let other actors have a turn first

    def _actor_loop_teardown(self) -> None:
        # pykka drops the told messages still queued at the stop: a sender that told just
        # before it (its tell found the actor alive) would never learn. Each goes to
        # :meth:`on_undelivered`, and the mailbox refuses mail from here on.
        mailbox: _Mailbox = self.actor_inbox  # type: ignore[assignment]
        for envelope in mailbox.close():
            try:
                self.on_undelivered(envelope.message)
            except Exception:
                log.exception("%s could not hand back a message it stopped before", self)
        super()._actor_loop_teardown()

    def on_undelivered(self, message: Any) -> None:
        """A told ``message`` the actor stopped before handling (default: dropped, as
        pykka drops it)."""

    def _handle(self, envelope: Any) -> None:
        # The body of pykka's own actor loop (``Actor._actor_loop_running``) for one
        # message, log records included, so a pooled actor behaves as a threading one.
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                pykka_log.info("Exception returned from %s to caller:", self,
                               exc_info=sys.exc_info())
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
        except BaseException:
            pykka_log.debug("%r in %s. Stopping all actors.", sys.exc_info()[1], self)
            self._stop()
            self._stop_all_elsewhere()

    def _stop_all_elsewhere(self) -> None:
        """``ActorRegistry.stop_all()``, which pykka calls on a ``BaseException``, off the pool.

        ``stop_all`` waits for each actor to handle its stop message; on a
        pool thread, the actors that only this thread could run (all of
        them, with a one-thread pool) would never stop. A short-lived thread
        waits instead, in pykka's order (last started, first stopped), while
        this thread goes back to the pool and runs those stops. The actors to stop are
        the ones registered now, as ``stop_all`` here would have read them: read later on
        that thread, the registry could already hold actors started after the exception.

        Each stop is waited for at most the pool's ``stop_timeout``: pykka's wait without
        one left every actor after a stuck one (a handler that never returns) running,
        and never said which actor held them up.
        """
        running = list(reversed(ActorRegistry.get_all()))
        timeout = self._pool.stop_timeout

        def stop_them() -> None:
            for ref in running:
                try:
                    ref.stop(block=True, timeout=timeout)
                except pykka.Timeout:
                    log.warning("%s did not stop within %.1f s of the stop of every actor; "
                                "the others are stopped without it", ref, timeout)

        threading.Thread(target=stop_them, name=f"{self._pool.name}-stop-all",
                         daemon=True).start()
