"""The scenario helper: script an agent family, inject faults, check what happened.

A scenario file defines ``run(sc: Scenario)`` and uses only the public API
through ``sc.runtime`` plus these helpers: scripted brains (``sc.on``), an
injected clock (``sc.advance``), faults (``sc.crash`` / ``sc.restart``,
``failing``), notes, and ``sc.expect`` checks. Ids come from a seeded
source and time from a manual clock, so the same seed gives the same report.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .clock import ManualClock
from .runtime import Runtime
from .turn import Turn

SCENARIO_EPOCH = 1_767_225_600.0
"""2026-01-01T00:00:00Z: where a scenario's clock starts."""

NOISE = frozenset({"claimed", "stopped", "turn_started"})
"""Runtime events left out of the timeline: their interleaving varies between runs."""

TurnScript = Callable[[Turn], object]


class ScriptedBrain:
    """A brain that runs a per-session script; sessions without one reply ``ok``."""

    def __init__(self) -> None:
        self._scripts: dict[str, TurnScript] = {}
        self._prefixes: list[tuple[str, TurnScript]] = []

    def on(self, session_id: str, script: TurnScript) -> None:
        """Run ``script(turn)`` for turns of ``session_id``."""
        self._scripts[session_id] = script

    def on_prefix(self, prefix: str, script: TurnScript) -> None:
        """Run ``script(turn)`` for sessions whose id starts with ``prefix`` (``subagent-``)."""
        self._prefixes.append((prefix, script))

    def __call__(self, turn: Turn) -> object:
        script = self._scripts.get(turn.session_id) or next(
            (s for p, s in self._prefixes if turn.session_id.startswith(p)), None)
        if script is None:
            turn.reply("ok")
            return None
        return script(turn)


def failing(times: int, then: TurnScript | None = None,
            error: str = "the model provider timed out") -> TurnScript:
    """A script that raises on its first ``times`` turns, then runs ``then`` (or replies ``ok``)."""
    count = [0]
    lock = threading.Lock()

    def script(turn: Turn) -> object:
        with lock:
            count[0] += 1
            n = count[0]
        if n <= times:
            raise RuntimeError(f"{error} (attempt {n})")
        if then is not None:
            return then(turn)
        turn.reply("ok")
        return None
    return script


def _canonical(entry: dict[str, Any]) -> tuple[str, ...]:
    ids = entry.get("message_ids") or [entry.get("message_id") or ""]
    return (str(entry["event"]), str(entry.get("session_id") or entry.get("target") or ""),
            *map(str, ids))


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
        self.brain = ScriptedBrain()
        self.timeline: list[dict[str, Any]] = []
        self.expectations: list[Expectation] = []
        self.generation = 0
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._on_event = on_event
        self._runtime: Runtime | None = None
        self._script_thread = threading.current_thread()
        self._timeline_lock = threading.Lock()
        self._step = 0
        self._order: list[tuple[int, bool, tuple[str, ...], int]] = []
        self._runtime_options: dict[str, Any] = {}

    # -- lives of the runtime --------------------------------------------------------------

    def _new_id(self) -> str:
        with self._rng_lock:
            return f"{self._rng.getrandbits(128):032x}"

    def _record(self, event: str, data: dict[str, Any]) -> None:
        if event in NOISE:
            return
        data = {k: v for k, v in data.items() if k != "owner"}  # differs per process
        entry = {"t": round(self.clock.now() - SCENARIO_EPOCH, 3), "life": self.generation,
                 "event": event, **data}
        with self._timeline_lock:
            scripted = threading.current_thread() is self._script_thread
            self._order.append((self._step, not scripted,
                                () if scripted else _canonical(entry), len(self.timeline)))
            self.timeline.append(entry)
        if self._on_event is not None:
            self._on_event(event, entry)

    def _boundary(self) -> None:
        """Close a step: runtime work recorded so far belongs to the steps before."""
        with self._timeline_lock:
            self._step += 1

    def start(self, **options: Any) -> Runtime:
        """Start the runtime (options go to :class:`Runtime`; brain and clock are ours).

        Turns run one at a time unless ``max_active_sessions`` says otherwise,
        so that the same seed gives the same report; scenarios that need two
        turns running at once (steering) pass a larger number.
        """
        options.setdefault("max_active_sessions", 1)
        self._runtime_options = options
        return self._start()

    def _start(self) -> Runtime:
        self.generation += 1
        rt = Runtime(db=self.db_url, brain=self.brain, clock=self.clock, ids=self._new_id,
                     **self._runtime_options)
        rt.subscribe(self._record)
        self._runtime = rt.start()
        return rt

    @property
    def runtime(self) -> Runtime:
        """The runtime of the current life."""
        if self._runtime is None:
            raise RuntimeError("call sc.start() first")
        return self._runtime

    def crash(self) -> None:
        """Kill the runtime abruptly: nothing in flight commits, memory is lost."""
        self.runtime.crash()
        self._boundary()

    def restart(self) -> Runtime:
        """Start a new runtime on the same database (after ``crash`` or ``stop``)."""
        if self._runtime is not None and self._runtime._state == "running":
            self._runtime.stop()
        self._boundary()
        return self._start()

    def stop(self) -> None:
        """Stop the runtime gracefully."""
        if self._runtime is not None:
            self._runtime.stop()

    # -- script helpers --------------------------------------------------------------------

    def on(self, session_id: str, script: TurnScript) -> None:
        """Script the turns of one session."""
        self.brain.on(session_id, script)

    def on_children(self, script: TurnScript) -> None:
        """Script every sub-agent's turns (their ids are only known once created)."""
        self.brain.on_prefix("subagent-", script)

    def advance(self, seconds: float) -> None:
        """Move the scenario clock forward (due retries become claimable)."""
        self._boundary()
        self._record("clock", {"advance": seconds})
        self.clock.advance(seconds)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until nothing is due and no turn runs."""
        self.runtime.run_until_idle(timeout)
        self._boundary()

    def note(self, text: str) -> None:
        """Put a note on the timeline (shown in the report and the diagram)."""
        self._record("note", {"text": text})

    def expect(self, condition: object, what: str, detail: str = "") -> bool:
        """Record a check; the run fails if any check is false."""
        ok = bool(condition)
        self.expectations.append(Expectation(what, ok, detail))
        self._record("expect", {"what": what, "ok": ok})
        return ok

    def ordered_timeline(self) -> list[dict[str, Any]]:
        """The timeline in a canonical order, so concurrent turns cannot reorder a report.

        Steps end where the script waits for the runtime (settle, crash,
        restart, clock moves). Within a step the script's own events come
        first, as they happened, then what runtime threads did, sorted by
        event, session and message.
        """
        with self._timeline_lock:
            return [self.timeline[i] for *_, i in sorted(self._order)]

    @property
    def ok(self) -> bool:
        """True when every expectation held (and there was at least one)."""
        return bool(self.expectations) and all(e.ok for e in self.expectations)
