"""What every agent-framework adapter does the same way with a turn (pure of any framework).

An adapter (``pydantic_ai_brain``, ``openai_agents_brain``, ``autogen_brain``) runs a
framework's agent loop as an ``async def`` brain. Three things must not differ between
them, so they live here once: the prompt a turn gives the model (its messages, each
naming its speaker, headed by the turn's context where it has one), which outputs are a
reply (only an empty one is not), which earlier conversation it is handed (the session's
newest visible entries, as ``(role, text)`` with each user entry naming its speaker as the
prompt does), how a model's tool call given as JSON text is run
(text that is no JSON is a refusal the model reads, not a crash), and how a stop request
reaches the framework's run (a caller's is cancelled at once, not left to kinbox's
``stop_grace``; the runtime's own stop lets it finish within that grace). No framework is
imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from .errors import ConfigError, ToolError
from .transcript_view import speaker
from .turn import Turn
from .turn_history import history_limit
from .validation import escaped

T = TypeVar("T")


def prompt_of(turn: Turn) -> str:
    """The turn's messages as one prompt, each line naming its speaker."""
    return "\n\n".join(m.as_prompt() for m in turn.messages)


async def prompt_for(turn: Turn) -> str:
    """The turn's prompt, headed by its extra context (Focal's global context, FO3).

    Read on the loop: a Focal turn's context is computed before its brain runs, and every
    other turn's is None without a read (:attr:`.turn.Turn.context`)."""
    context = turn.context
    return prompt_of(turn) if not context else f"{context}\n\n{prompt_of(turn)}"


def history_size(history: object) -> int:
    """An adapter's ``history=`` argument checked where the brain is built (a
    :class:`ConfigError` naming ``history``, not a failed attempt at every turn)."""
    return history_limit(history, "history")


def count_from(value: object, field: str, low: int) -> int:
    """An adapter's count argument (``max_tool_rounds``, ``max_turns``) checked where the
    brain is built: a whole number from ``low``, else a :class:`ConfigError` naming
    ``field``. Taken as given, a string or a number out of range failed every turn's
    attempt (a ``TypeError``, or a limit no run can meet) until its row failed for good."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{field} must be a whole number from {low}, not {value!r}",
                          field=field)
    return value


async def history_for(turn: Turn, history: int) -> list[tuple[str, str]]:
    """The session's conversation before this turn as ``(role, text)``, oldest first, the
    newest ``history`` entries (none read for 0): ``"user"`` entries worded as the prompt
    words a message (``<speaker>: <text>``), ``"assistant"`` entries as replied. Read off
    the event loop (``turn.ahistory``)."""
    if not history:
        return []
    return [
        ("user", f"{speaker(e.role, e.sender_id, e.kind)}: {e.text}")
        if e.role == "user"
        else ("assistant", e.text)
        for e in await turn.ahistory(history)
    ]


def reply_with(turn: Turn, output: object) -> None:
    """The framework's final output as the turn's reply; None and "" are no reply (0, False
    or [] are the agent's answer too). Text is replied as it is; anything else (a
    structured ``output_type``: a pydantic model, a dataclass, a list) as JSON, which a
    parent agent or a product can parse back (``str()`` of a model is ``a=1 b='x'``).
    Text no database holds (a NUL, a lone surrogate: an emoji a model's output cut in half)
    is replied with those characters escaped: the answer is the model's, and refusing it
    failed the attempt, the whole run thrown away to be run again."""
    if output is None or output == "":
        return
    if isinstance(output, str):
        turn.reply(escaped(output))
        return
    # pydantic comes with every framework hosted here; what it cannot serialize is its str.
    from pydantic_core import to_json

    turn.reply(to_json(output, fallback=str).decode())


async def call_tool(turn: Turn, name: str, arguments: str) -> dict[str, Any]:
    """Run a model's call of ``name`` with its arguments as JSON text (what OpenAI-style
    models send): the tool's result, or the refusal as ``{"error", "message"}``."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolError(
            "invalid_argument",
            f"{name}'s arguments are not valid JSON ({exc.msg} at position {exc.pos}).",
        ).to_dict()
    except ValueError:
        # Valid JSON with an integer longer than Python converts (its 4,300 digits limit):
        # a ValueError with no position, which the model should read as a refusal too.
        return ToolError(
            "invalid_argument", f"{name}'s arguments hold a number too long to read."
        ).to_dict()
    except RecursionError:
        # Valid JSON nested deeper than the parser recurses: no tool takes such a value,
        # and the model should read why, not have its turn's attempt fail.
        return ToolError(
            "invalid_argument", f"{name}'s arguments are nested too deeply to read."
        ).to_dict()
    return await turn.tools.call(name, parsed)


def as_text(result: object) -> str:
    """A tool result as the text a model reads (JSON; a value JSON cannot hold, as text)."""
    return json.dumps(result, ensure_ascii=False, default=str)


async def until_stopped(turn: Turn, run: Coroutine[Any, Any, T]) -> tuple[bool, T | None]:
    """Run a framework's agent loop until it ends or a caller asks the turn to stop.

    ``(False, result)`` when it ended; ``(True, None)`` when a caller's stop (``agent_stop``,
    the timeout) came first: the run is cancelled and awaited (its model call and tool
    calls see the cancel), so the turn ends at once and commits what it had replied.
    Waiting for kinbox's ``stop_grace`` instead would leave a model call running that
    nobody will read. The runtime's own stop (a deploy) is no such caller: the run goes on,
    as a plain async brain's does, its answer within the grace committed; past the grace
    the host cancels the brain, and this run with it. A run that ends cancelled with no
    stop (its own CancelledError) raises it: a failed attempt, not a stopped turn."""
    task = asyncio.ensure_future(run)
    stop = asyncio.ensure_future(turn.stopped())
    cancelled = False
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and turn.runtime_stopping:
            return False, await task  # a cancel of this brain cancels the run too
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            cancelled = True
    if cancelled:
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True, None
    # Ended before any stop: a CancelledError of the run's own (nobody asked the turn to
    # stop) is raised, the attempt's failure as a plain brain's is, not a stopped turn.
    return False, task.result()
