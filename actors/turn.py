"""The Brain contract: what a turn sees and what it can do.

A ``Brain`` is any callable ``brain(turn)``; kinbox calls it once per turn,
on the session's actor thread. The turn carries the messages that started
it, the caller-bound agent tools, a cooperative stop flag and a steering
feed of messages that arrive while it runs. What the brain says with
``turn.reply`` is committed together with the delivery markers, so a turn
either happened completely or not at all. An exception from the brain is a
failed delivery: the message is retried with backoff.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..persistence import ClaimedRow, EntryRecord, TurnEntry
from .errors import ConfigError, RuntimeStateError
from .loop_rule import refuse_on_loop
from .running import RUNTIME_STOP, StopFlag
from .turn_history import DEFAULT_HISTORY, HistoryRead, history_limit
from .turn_message import Message as Message
from .turn_message import TurnOutcome as TurnOutcome
from .validation import unstorable

if TYPE_CHECKING:
    from .outbox import Outbox


def is_async_brain(brain: object) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = type(brain).__call__ if callable(brain) else None  # the class's, as Python calls it
    return inspect.iscoroutinefunction(brain) or inspect.iscoroutinefunction(call)


class Brain(Protocol):
    """Runs one turn of a session (the product's LLM loop)."""

    def __call__(self, turn: Turn) -> object:
        """Run the turn; raise to make the delivery fail and be retried."""
        ...


class Turn:
    """One run of a session's brain, started by one or more inbox messages."""

    def __init__(
        self,
        session_id: str,
        messages: list[Message],
        tools: Callable[[], Any],
        stop_event: StopFlag,
        fetch_steering: Callable[[], list[Message]],
        *,
        row: ClaimedRow | None = None,
        started: float = 0.0,
        outbox: Outbox | None = None,
        fetch_row: Callable[[str], Message | None] | None = None,
        fetch_history: HistoryRead | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.session_id = session_id
        self.messages = messages
        self.row = row  # type: ignore[assignment]
        """The claimed inbox row that started the turn."""
        self.started = started
        """When the turn started, on the runtime's clock."""
        self._clock = clock
        self.outbox = outbox
        """What the turn's tool calls wrote: committed with the turn, dropped if it fails."""
        self.steered_ids: list[str] = []
        """Ids of the steering messages taken into this turn (committed or released with
        it): those the brain was handed, not every one fetched for it."""
        self._make_tools = tools
        self._tools: Any = None
        self._stop = stop_event
        self._fetch_steering = fetch_steering
        self._fetch_row = fetch_row
        """Leases one named row of the session into the turn (None: a turn of no inbox
        row, which has nothing to fence such a lease with)."""
        self._fetch_history = fetch_history
        """Reads the session's earlier visible transcript (None: a turn built without a
        store, which has no history)."""
        if outbox is not None:  # how a tool waiting in this turn reaches it (weakly: no cycle)
            outbox.turn = weakref.ref(self)
        self._steered: list[Message] = []
        self._steer_lock = threading.Lock()
        """Held while steering is fetched and while it is closed: a turn ending waits for
        a fetch in flight (an ``asteering`` whose caller was cancelled runs on)."""
        self._log_lock = threading.Lock()
        """Held while the turn closes, while its entries grow and while fetched rows are
        added or handed over (taken inside ``_steer_lock`` where both are), never across
        I/O: a reply is in the commit's entries or refused, and neither it nor
        ``asteering`` on the event loop waits for a steering fetch (a database write)."""
        self._unseen: list[Message] = []
        """Fetched (leased to this turn) and not yet handed to the brain."""
        self._closed: list[Message] | None = None
        self._run_blocking: Callable[[Callable[[], None]], Awaitable[None]] | None = None
        self._on_loop: Callable[[], bool] | None = None
        """Is the caller on the event loop of async brains (None: a sync turn)?"""
        self.replies: list[str] = []
        self._request: Any = None
        self._context: str | None = None
        self._resolve: Callable[[], tuple[Any, str | None]] | None = None
        self._context_read = True
        self._resolve_lock = threading.Lock()
        """Held while the request is read (never on the event loop): read once."""
        # Transcript order is the order things happened: steering lands between replies.
        self._log: list[TurnEntry] = [m.entry() for m in messages]

    def now(self) -> float:
        """The runtime's clock now (a turn built without one: when it started). What an
        HTTP date a model API answered with (``Retry-After``) is measured from: a turn may
        have waited on the model for a while since it started."""
        return self.started if self._clock is None else self._clock()

    @property
    def tools(self) -> Any:
        """The tools bound to this session (built on first use: many turns never call one)."""
        if self._tools is None:
            self._tools = self._make_tools()
        return self._tools

    def resolve_with(
        self, resolve: Callable[[], tuple[Any, str | None]], *, context: bool = True
    ) -> None:
        """Set how the tool request and context are computed (on first use). With
        ``context=False`` the turn has no context (None, known without computing it)."""
        self._resolve = resolve
        self._request = self._context = None
        self._context_read = context

    def on_event_loop(
        self,
        run_blocking: Callable[[Callable[[], None]], Awaitable[None]],
        on_loop: Callable[[], bool],
    ) -> None:
        """This turn's brain is ``async def``: its blocking work runs through
        ``run_blocking`` (awaited on the loop), and ``on_loop()`` tells whether a caller
        is on the loop's thread, where a read would hold every async turn."""
        self._run_blocking = run_blocking
        self._on_loop = on_loop

    def _resolved(self) -> tuple[Any, str | None]:
        if self._resolve is not None:
            self._refuse_on_loop("turn.request", "await turn.arequest()")
            self._resolve_now()
        return self._request, self._context

    def _refuse_on_loop(self, call: str, instead: str) -> None:
        """Refuse a call that would block on the event loop, where it would hold every
        async turn of the runtime until it ended (:mod:`.loop_rule`)."""
        refuse_on_loop(self._on_loop, call, instead)

    def _resolve_now(self) -> None:
        with self._resolve_lock:  # two awaits at once read once
            if self._resolve is not None:
                self._request, self._context = self._resolve()
                self._resolve = None  # last: a reader that sees None sees both values

    @property
    def request(self) -> Any:
        """The tool request this turn runs with (the Focal policy applied on Focal turns).

        In an ``async def`` brain, ``await turn.arequest()``: off Focal turns it reads the
        session, which this attribute refuses to do on the event loop
        (:class:`RuntimeStateError`, ``state="event_loop"``) until that has run."""
        return self._resolved()[0]

    async def arequest(self) -> Any:
        """:attr:`request` for an ``async def`` brain: read on a blocking worker (once),
        so the event loop and every other async turn go on meanwhile."""
        run = self._run_blocking
        if self._resolve is not None and run is not None:
            await run(self._resolve_now)
        return self.request

    def history(self, limit: int = DEFAULT_HISTORY) -> list[EntryRecord]:
        """The session's conversation before this turn: its newest ``limit`` visible user
        and assistant entries, oldest first, as the transcript stores them (``role``,
        ``text``, ``sender_id``, ``kind``); hidden entries never (:mod:`.turn_history`).
        ``limit`` from 0 to :data:`~.turn_history.HISTORY_MAX`, else a
        :class:`ConfigError` (``field="limit"``). In an ``async def`` brain, ``await
        turn.ahistory(limit)``: this read is refused on the event loop
        (:class:`RuntimeStateError`, ``state="event_loop"``)."""
        n = history_limit(limit)
        self._refuse_on_loop("turn.history()", "await turn.ahistory(limit)")
        return self._fetch_history(n) if n and self._fetch_history is not None else []

    async def ahistory(self, limit: int = DEFAULT_HISTORY) -> list[EntryRecord]:
        """:meth:`history` for an ``async def`` brain: read on a blocking worker, so the
        event loop and every other async turn go on meanwhile."""
        n = history_limit(limit)
        run, fetch = self._run_blocking, self._fetch_history
        if run is None:
            return self.history(n)
        if not n or fetch is None:
            return []
        read: list[list[EntryRecord]] = []
        await run(lambda: read.append(fetch(n)))
        return read[0]

    @property
    def context(self) -> str | None:
        """Extra context for the model: the Focal global context on Focal turns (computed
        before their brain runs), None on every other turn (known without a read, so an
        ``async def`` brain reads it as any attribute)."""
        if not self._context_read:
            return None
        return self._resolved()[1]

    @property
    def stop_requested(self) -> bool:
        """True once someone called ``agent_stop`` on this session; end the turn soon."""
        return self._stop.is_set()

    @property
    def runtime_stopping(self) -> bool:
        """True when the stop asked is the runtime's own graceful stop (a deploy), not a
        caller's: the turn may still finish within ``stop_grace``, and its answer commits.
        A brain cancelled past that grace before it replied hands its message back, to
        run at the next start."""
        return self._stop.by == RUNTIME_STOP

    def wait_stop_requested(self, timeout: float) -> bool:
        """Block until a stop is requested or ``timeout`` passes; return the flag.

        In an ``async def`` brain, ``await turn.stopped(timeout)``: this wait would hold
        the event loop, and is refused there (:class:`RuntimeStateError`,
        ``state="event_loop"``).
        """
        self._refuse_on_loop("turn.wait_stop_requested()", "await turn.stopped(timeout)")
        return self._stop.wait(timeout)

    async def stopped(self, timeout: float | None = None) -> bool:
        """Await a stop request (or ``timeout``) without blocking the event loop; the flag."""
        return await self._stop.wait_async(timeout)

    def reply(self, text: str) -> None:
        """Add an assistant message to the session's transcript (committed with the turn).
        ``text`` that is no ``str`` (a model's response object handed over whole) or that
        cannot be stored is a :class:`ConfigError` (``field="text"``), which fails the
        attempt unless the brain handles it."""
        if not isinstance(text, str):
            raise ConfigError(f"reply takes a str, not {type(text).__name__}", field="text")
        problem = unstorable(text)
        if problem is not None:  # refused here, not in the commit: that would retry forever
            raise ConfigError(f"the reply {problem}", field="text")
        # Under the lock the turn's close takes: a reply from another thread of the brain's
        # is either in the commit's entries or refused, never dropped.
        with self._log_lock:
            if self._closed is not None:  # past its brain: the entries are the commit's now
                raise RuntimeStateError(
                    "this turn has ended: a reply after its brain returned is not recorded",
                    state="ended",
                )
            self.replies.append(text)
            self._log.append(TurnEntry("assistant", text, True))

    def steering(self) -> list[Message]:
        """Messages to this session that arrived since the turn started (or last asked).

        They become part of this turn: committed and acknowledged with it. In an
        ``async def`` brain, ``await turn.asteering()``: this call leases the rows (a
        database write), which it refuses to do on the event loop
        (:class:`RuntimeStateError`, ``state="event_loop"``).
        """
        self._refuse_on_loop("turn.steering()", "await turn.asteering()")
        self._fetch()
        return self._take()

    async def asteering(self) -> list[Message]:
        """:meth:`steering` for an ``async def`` brain: waits for the commit, not the loop.

        Cancelled while the messages are fetched (``asyncio.wait_for``, a stop), it leaves
        them for the next call; those no call takes by the turn's end are not part of it
        (they are handed back, for a turn of their own)."""
        run = self._run_blocking
        if run is None:
            return self.steering()
        await run(self._fetch)
        return self._take()

    def _fetch(self) -> None:
        with self._steer_lock:  # held across the write (leasing the rows), off the loop
            if self._closed is None:
                fetched = self._fetch_steering()
                with self._log_lock:
                    self._unseen.extend(fetched)

    def _take(self) -> list[Message]:
        # Only the entries' lock, held for no I/O: on the event loop (``asteering``) the
        # steering lock would wait for another fetch's write (a concurrent call's, a
        # foreground tool's ``take``). Whole before the turn closes, or not at all.
        with self._log_lock:
            fresh, self._unseen = self._unseen, []
            self._join(fresh)
        return fresh

    def _join(self, fresh: list[Message]) -> None:
        """Make leased rows part of the turn (held: both locks): committed and
        acknowledged with it, handed back unrun with a failed attempt."""
        self._steered.extend(fresh)
        self.steered_ids.extend(m.message_id for m in fresh)
        self._log.extend(m.entry() for m in fresh)

    def take(self, message_id: str) -> bool:
        """Take the session's row ``message_id`` into this turn as steering takes rows
        (leased now, then committed and acknowledged with the turn, or handed back unrun
        with a failed attempt), without handing it to the brain: a tool's wait has given
        the brain what it says already (a foreground sub-agent's result). True when the
        row is part of the turn; False when it is not there to take (not yet written,
        delivered, leased elsewhere) or the turn has ended: it then runs a turn of its
        own, as any row does. In an ``async def`` brain, ``await turn.atake(message_id)``:
        this call leases the row (a database write), which it refuses to do on the event
        loop (:class:`RuntimeStateError`, ``state="event_loop"``)."""
        self._refuse_on_loop("turn.take()", "await turn.atake(message_id)")
        with self._steer_lock:
            if self._closed is not None or self._fetch_row is None:
                return False
            with self._log_lock:
                if message_id in self.steered_ids:
                    return True  # the brain's steering() took it first
                held = [m for m in self._unseen if m.message_id == message_id]
                if held:  # fetched already: hand it to the turn, not to the brain
                    self._unseen.remove(held[0])
                    self._join(held)
                    return True
            taken = self._fetch_row(message_id)  # a write: under the steering lock only
            if taken is None:
                return False
            with self._log_lock:
                self._join([taken])
        return True

    async def atake(self, message_id: str) -> bool:
        """:meth:`take` for an ``async def`` brain: the row is leased on a blocking worker,
        so the event loop and every other async turn go on meanwhile."""
        run = self._run_blocking
        if run is None:
            return self.take(message_id)
        taken: list[bool] = []
        await run(lambda: taken.append(self.take(message_id)))
        return taken[0]

    def close_steering(self, wait: bool = True) -> list[Message] | None:
        """End the turn's steering (after its brain): the messages fetched for it that the
        brain was never handed, to hand back; the same answer however often it is asked.
        Waits for a fetch in flight, or with ``wait=False`` answers None instead. From
        here on a reply or a tool write (:meth:`Outbox.end`) is refused."""
        if not self._steer_lock.acquire(blocking=wait):
            return None
        try:
            with self._log_lock:
                if self._closed is None:
                    self._closed, self._unseen = self._unseen, []
                    if self.outbox is not None:
                        self.outbox.end()
                return self._closed
        finally:
            self._steer_lock.release()

    @property
    def all_messages(self) -> list[Message]:
        """The starting messages followed by every steering message taken so far."""
        return [*self.messages, *self._steered]

    def entries(self) -> list[TurnEntry]:
        """The transcript entries this turn commits, in the order they happened."""
        return list(self._log)
