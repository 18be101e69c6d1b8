"""The scenario helper: script an agent family, inject faults, check what happened.

A scenario file defines ``run(sc: Scenario)`` and uses only the public API
through ``sc.runtime`` plus these helpers: scripted brains (``sc.on``), an
injected clock (``sc.advance``), faults (``sc.crash`` / ``sc.restart``,
``failing``), notes, and ``sc.expect`` checks.

The same seed on a fresh database gives the same report: ids come from a
seeded source, time from a manual clock, turns run one at a time and only
while the script waits for the runtime (:mod:`.scenario_brain`), and the
timeline is kept in the order the events were heard, which is then the
order they happened. Many runs can share one database: ids also mix in the
scenario's name and the database's state at the start, ``sc.project``
picks a free slug, and ``sc.inbox`` / ``sc.marker_counts`` (and the report)
cover this run's rows only.

Wait for the runtime through ``sc.settle()`` or ``sc.wait(event)``: turns
run only then, so a script that waits on its own (``event.wait()``,
``rt.run_until_idle()``) waits for turns that never start.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..persistence import ProjectRecord
from .clock import ManualClock, check_step
from .errors import ConfigError, RuntimeStateError
from .runtime import Runtime
from .scenario_brain import ScriptedBrain, TurnGate, TurnScript, failing

__all__ = ["NOISE", "SCENARIO_EPOCH", "Expectation", "Scenario", "ScriptedBrain", "TurnScript",
           "Waitable", "failing"]

SCENARIO_EPOCH = 1_767_225_600.0
"""2026-01-01T00:00:00Z: where a scenario's clock starts."""

NOISE = frozenset({"claimed", "stopped", "turn_started"})
"""Runtime events left out of the timeline: they say nothing the turns do not."""


class Waitable(Protocol):
    """What ``sc.wait`` accepts: a ``threading.Event`` or anything with ``wait(timeout)``."""

    def wait(self, timeout: float | None = None) -> bool:
        """True once the awaited thing happened, False after ``timeout``."""
        ...


@dataclass(frozen=True)
class Expectation:
    """One ``expect`` check and its result."""

    what: str
    ok: bool
    detail: str = ""


class Scenario:
    """Drives one scenario run: a runtime per life, a clock, a timeline, expectations."""

    def __init__(self, db_url: str, *, seed: int = 0, name: str = "scenario",
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.db_url = db_url
        self.seed = seed
        self.name = name
        self.clock = ManualClock(SCENARIO_EPOCH)
        self.gate = TurnGate()
        self.brain = ScriptedBrain(self.gate)
        self.timeline: list[dict[str, Any]] = []
        self.expectations: list[Expectation] = []
        self.generation = 0
        self.first_seq = 0
        """Rows of this run have a journal ``seq`` above this (earlier runs' rows do not)."""
        self._rng: random.Random | None = None
        self._rng_lock = threading.Lock()
        self._on_event = on_event
        self._runtime: Runtime | None = None
        self._timeline_lock = threading.Lock()
        self._runtime_options: dict[str, Any] = {}

    # -- lives of the runtime --------------------------------------------------------------

    def _new_id(self) -> str:
        with self._rng_lock:
            if self._rng is None:
                raise RuntimeStateError("scenario ids are drawn once the runtime started",
                                        state="new")
            return f"{self._rng.getrandbits(128):032x}"

    def _record(self, event: str, data: dict[str, Any]) -> None:
        if event in NOISE:
            return
        data = {k: v for k, v in data.items() if k != "owner"}  # differs per process
        with self._timeline_lock:  # the order heard is the order of the timeline
            entry = {"t": round(self.clock.now() - SCENARIO_EPOCH, 3), "life": self.generation,
                     "event": event, **data}
            self.timeline.append(entry)
        if self._on_event is not None:
            self._on_event(event, entry)

    def start(self, **options: Any) -> Runtime:
        """Start the runtime (options go to :class:`Runtime`; brain and clock are ours).

        Turns run one at a time unless ``max_active_sessions`` says otherwise,
        so that the same seed gives the same report; with more, turns that
        run at once appear in the order they were heard, which can vary.

        A runtime of this scenario that still runs is :class:`RuntimeStateError`: a
        second one beside it would deliver too and never be stopped (``sc.restart()``
        starts the next life; after ``sc.stop()`` or ``sc.crash()`` this starts one).
        """
        if self._runtime is not None and self._runtime.state == "running":
            raise RuntimeStateError("the scenario's runtime is already running; sc.restart() "
                                    "stops it and starts the next life", state="running")
        options.setdefault("max_active_sessions", 1)
        self._runtime_options = options
        return self._start()

    def _start(self) -> Runtime:
        self.generation += 1  # before the start: its "started" event is of this life
        try:
            rt = Runtime(db=self.db_url, brain=self.brain, clock=self.clock, ids=self._new_id,
                         **self._runtime_options)
            rt.subscribe(self._record)
            self._runtime = rt.start()
        except BaseException:
            self.generation -= 1  # a runtime that never started was no life of the run
            raise
        if self._rng is None:
            self._seed_ids(rt)
        return rt

    def _seed_ids(self, rt: Runtime) -> None:
        """Mix the name and what the database already holds into the seed: a fresh
        database gives the same ids for the same seed, and no two runs share one."""
        self.first_seq = max((r["seq"] for r in rt.inbox()), default=0)
        held = (self.first_seq, len(rt.sessions()), len(rt.context.store.projects()))
        with self._rng_lock:
            self._rng = random.Random(f"{self.name}/{self.seed}/{held}")

    @property
    def runtime(self) -> Runtime:
        """The runtime of the current life."""
        if self._runtime is None:
            raise RuntimeStateError("the scenario has no runtime yet; call sc.start() first",
                                    state="new")
        return self._runtime

    @property
    def started(self) -> bool:
        """True once ``start`` gave the scenario a runtime."""
        return self._runtime is not None

    def crash(self) -> None:
        """Kill the runtime abruptly: nothing in flight commits, memory is lost."""
        self.runtime.crash()

    def restart(self) -> Runtime:
        """Start a new runtime on the same database (after ``crash`` or ``stop``)."""
        self.stop()
        return self._start()

    def stop(self) -> None:
        """Stop the runtime gracefully (running turns finish and commit)."""
        if self._runtime is not None and self._runtime.state == "running":
            with self.gate.opened():
                self._runtime.stop()

    def finish(self) -> None:
        """End the run: every held turn may go on, and the runtime stops gracefully."""
        self.gate.open_for_good()
        self.stop()

    # -- script helpers --------------------------------------------------------------------

    def on(self, session_id: str, script: TurnScript) -> None:
        """Script the turns of one session (it may not exist yet: a social thread's does
        once its first message arrives).

        :class:`ConfigError` for an id that is no string (a session record, say: it was
        kept and never matched, and the session answered "ok") or a script that cannot be
        called (each of the session's turns failed and was retried, as a broken brain's)."""
        if not isinstance(session_id, str) or not session_id:
            raise ConfigError(f"sc.on: session_id must be a session's id (a string such as "
                              f"bob.id), not {type(session_id).__name__}",
                              field="session_id")
        self.brain.on(session_id, _callable(script))

    def on_children(self, script: TurnScript) -> None:
        """Script every sub-agent's turns (their ids are only known once created)."""
        self.brain.on_prefix("subagent-", _callable(script))

    def advance(self, seconds: float) -> None:
        """Move the scenario clock forward (due retries become claimable).

        :class:`ConfigError` unless ``seconds`` is a step a clock may take
        (:func:`.clock.check_step`), before anything is recorded."""
        check_step(seconds)
        self._record("clock", {"advance": seconds})
        self.clock.advance(seconds)

    def settle(self, timeout: float = 10.0) -> None:
        """Let turns run until nothing is due and no turn runs."""
        with self.gate.opened():
            self.runtime.run_until_idle(timeout)

    def wait(self, waitable: Waitable, timeout: float = 10.0) -> bool:
        """Let turns run until ``waitable`` (a ``threading.Event``) is set; False on timeout.

        Turns run only while the script waits through ``settle`` or ``wait``:
        a bare ``event.wait()`` would wait for a turn that never starts.
        """
        with self.gate.opened():
            return bool(waitable.wait(timeout))

    @contextlib.contextmanager
    def cleanup(self, undo: Callable[..., object], *args: Any,
                **kwargs: Any) -> Iterator[None]:
        """Call ``undo(*args, **kwargs)`` when the block ends, however it ends: the clean-up
        at a scenario's end (pausing its cron job, switching Focal's heartbeat off).

        Not a plain ``finally``: on a runtime the failure took down with it (a database
        gone), the clean-up fails too, and its error replaced the one the run failed with
        (the report named the clean-up's line). Here the block's own error goes on, the
        clean-up's added to it as a note (the report shows it); a clean-up that fails
        after a block that ran through raises its own error."""
        try:
            yield
        except BaseException as exc:
            try:
                undo(*args, **kwargs)
            except Exception as later:  # a second signal's Interrupted goes on, as it would
                name = getattr(undo, "__qualname__", None) or repr(undo)
                exc.add_note(f"the clean-up {name}() failed too: "
                             f"{type(later).__name__}: {str(later).strip()}")
            raise
        undo(*args, **kwargs)

    def note(self, text: str) -> None:
        """Put a note on the timeline (shown in the report and the diagram).

        :class:`ConfigError` for a ``text`` that is no string (a number, say: the text
        report showed it, and the diagram failed on it after the report was printed)."""
        if not isinstance(text, str):
            raise ConfigError(f"sc.note: text must be a string, not {type(text).__name__}",
                              field="text")
        self._record("note", {"text": text})

    def expect(self, condition: object, what: str, detail: str = "") -> bool:
        """Record a check; the run fails if any check is false."""
        ok = bool(condition)
        self.expectations.append(Expectation(what, ok, detail))
        self._record("expect", {"what": what, "ok": ok})
        return ok

    # -- this run's share of the database --------------------------------------------------

    def project(self, slug: str, name: str | None = None) -> ProjectRecord:
        """A new project for this run: ``slug``, or ``slug-2``, ``slug-3``... when earlier
        runs on this database hold it."""
        rt = self.runtime
        candidate, n = slug, 1
        while rt.project(candidate) is not None:
            n += 1
            candidate = f"{slug}-{n}"
        return rt.create_project(candidate, name or slug)

    def inbox(self, state: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
        """This run's inbox rows (``rt.inbox`` without earlier runs' rows), journal order."""
        return [r for r in self.runtime.inbox(state=state, target=target)
                if r["seq"] > self.first_seq]

    def marker_counts(self) -> dict[str, int]:
        """Committed delivery markers of each of this run's messages, 0 for one that
        committed no turn: a check that every count is 1 (``set(...) == {1}``) must fail
        for a message no turn took, and for a run that journaled nothing."""
        counts = self.runtime.marker_counts()
        return {r["message_id"]: counts.get(r["message_id"], 0) for r in self.inbox()}

    def ordered_timeline(self) -> list[dict[str, Any]]:
        """The timeline in the order its events happened (a copy)."""
        with self._timeline_lock:
            return list(self.timeline)

    @property
    def ok(self) -> bool:
        """True when every expectation held (and there was at least one)."""
        return bool(self.expectations) and all(e.ok for e in self.expectations)


def _callable(script: TurnScript) -> TurnScript:
    """``script``, or :class:`ConfigError` when it cannot be called with a turn."""
    if not callable(script):
        raise ConfigError(f"a scenario's script must be a function of the turn, not "
                          f"{type(script).__name__}", field="script")
    return script
