"""The brain of a scenario: per-session scripts, behind a gate the script holds.

A scenario's script and its runtime run on different threads. Left alone,
a turn could commit while the script is still sending (or before the note
that explains it), and the timeline would tell a different story on each
run. The :class:`TurnGate` makes the story deterministic and causal: a turn
starts and ends only while the script waits for the runtime (``settle``,
``wait``, ``stop``), like a coroutine handing over control. A turn already
inside the brain keeps running while the script works (steering, a crash
mid-turn); it is only held at its end until the script waits again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .turn import Turn

log = logging.getLogger("kinbox.scenario")

TurnScript = Callable[[Turn], object]

HELD_WARNING_SECONDS = 5.0
"""After this long held at the gate, a turn says why it does not run."""


class TurnGate:
    """Open while the script waits for the runtime; turns pass it to start and to end."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting = 0
        self._for_good = False

    def pass_through(self) -> None:
        """Block until the script waits for the runtime (or the gate is open for good)."""
        with self._cond:
            if self._cond.wait_for(self._is_open, HELD_WARNING_SECONDS):
                return
            # A script waiting on its own (event.wait(), time.sleep) holds every turn back.
            log.warning("a turn has waited %.0f s for the scenario script to let it run: wait "
                        "with sc.settle() or sc.wait(event), not on your own",
                        HELD_WARNING_SECONDS)
            self._cond.wait_for(self._is_open)

    def _is_open(self) -> bool:
        return self._waiting > 0 or self._for_good

    @contextmanager
    def opened(self) -> Iterator[None]:
        """Hold the gate open while the script waits (nested waits are fine)."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waiting -= 1

    def open_for_good(self) -> None:
        """Let every turn through from now on (the run is over or interrupted)."""
        with self._cond:
            self._for_good = True
            self._cond.notify_all()


class ScriptedBrain:
    """A brain that runs a per-session script; sessions without one reply ``ok``."""

    def __init__(self, gate: TurnGate | None = None) -> None:
        self.gate = gate or TurnGate()
        self._scripts: dict[str, TurnScript] = {}
        self._prefixes: list[tuple[str, TurnScript]] = []

    def on(self, session_id: str, script: TurnScript) -> None:
        """Run ``script(turn)`` for turns of ``session_id``."""
        self._scripts[session_id] = script

    def on_prefix(self, prefix: str, script: TurnScript) -> None:
        """Run ``script(turn)`` for sessions whose id starts with ``prefix`` (``subagent-``)."""
        self._prefixes.append((prefix, script))

    def __call__(self, turn: Turn) -> object:
        self.gate.pass_through()
        try:
            script = self._scripts.get(turn.session_id) or next(
                (s for p, s in self._prefixes if turn.session_id.startswith(p)), None)
            if script is None:
                turn.reply("ok")
                return None
            return script(turn)
        finally:
            self.gate.pass_through()  # commit (or fail) only while the script waits


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
