"""The rules every turn follows, whatever started it: one implementation.

An inbox row (:mod:`.session_actor`, on a pool thread or the async host), a
cron run (:mod:`.cron`) and a social event (:mod:`.social`) run a turn the
same way: the turn hooks run first (the Focal policy, :func:`prepare`), the
brain's result is taken as a reply and an awaitable from a sync call is an
error (:func:`take_result`), and the end is judged the same
(:func:`judge`): an exception is a failure with its traceback, a turn past
``turn_timeout`` is a failure, a turn a caller stopped is neither (it commits
as stopped), and whoever stopped it is named (never the timeout itself). What
a success commits and what a failure does stay with the caller: an inbox turn
acknowledges rows and retries with the inbox backoff, a cron run finishes its
run record, a social turn hands its replies to the channel adapter.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..persistence import ClaimedRow
from .brain_failure import ORDINARY, FailureKind, classify
from .context import RuntimeContext
from .outbox import Outbox
from .running import RUNTIME_STOP, TIMEOUT, StopFlag, overdue
from .turn import Message, Turn, TurnOutcome
from .turn_history import history_reader
from .validation import escaped

log = logging.getLogger("kinbox.turn")


class SyncBrainAwaitable(TypeError):
    """A brain called as a plain function returned an awaitable: it was never run."""

    def __init__(self, result: object) -> None:
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: the error says it all
        super().__init__(
            f"the brain returned an awaitable ({type(result).__name__}) instead of running "
            "the turn; make the brain itself `async def` (or an object whose __call__ is) so "
            "kinbox awaits it on its event loop. Nothing of this attempt was committed."
        )


class TurnCutShort(Exception):
    """The runtime's graceful stop cancelled an async brain past its grace before it
    replied (a model call outlasting a deploy's grace): nothing of the turn commits and its
    message is handed back unacknowledged, no attempt counted, to run at the next start.
    Committed as stopped, it would be acknowledged with no answer and never run again."""


def cut_short(turn: Turn) -> TurnCutShort | None:
    """The one rule for a turn the runtime's stop ended: one that did nothing (no reply, no
    tool write: a send, a task change, a child) is handed back (:class:`TurnCutShort`),
    whether its brain was cancelled past the grace, ended on the stop flag itself
    (``turn.stopped()``, ``wait_stop_requested``: what the Turn API asks of it) or raised
    on its way out (a model call aborted on the flag: a deploy is not the message's
    failure, and a few would fail it); one that did something commits it (run again, its
    writes would be done twice: a child that completed its task would work on it again).
    None: not cut short. A turn past its timeout keeps that name
    (:meth:`.running.RunningTurns.request_stop`): a failed attempt, counted."""
    outbox = turn.outbox
    if not turn.runtime_stopping or turn.replies or (outbox is not None and outbox.has_writes()):
        return None
    return TurnCutShort(
        f"the runtime's stop cut the turn of {turn.session_id} short before "
        "it replied: its message runs at the next start"
    )


@dataclass(frozen=True)
class Judged:
    """How a turn ended."""

    outcome: TurnOutcome
    detail: str | None = None
    """On failure, what to keep as the error: the traceback, or the timeout summary
    (``outcome.error`` is the one-line summary for observers and logs)."""
    kind: FailureKind = ORDINARY
    """On failure, how the brain's exception asks to be retried (:mod:`.brain_failure`)."""


SUCCEEDED = Judged(TurnOutcome(True, None, None))
"""Nearly every turn's judgement (the brain returned, nobody stopped it): one immutable
instance for all of them."""


def new_turn(
    ctx: RuntimeContext,
    session_id: str,
    messages: list[Message],
    flag: StopFlag,
    fetch_steering: Callable[[], list[Message]],
    *,
    outbox_id: str,
    started: float,
    fetch_row: Callable[[str], Message | None],
    row: ClaimedRow | None = None,
) -> Turn:
    """A turn of ``session_id`` with the parts every turn has, an inbox turn or a direct
    one: its outbox (named ``outbox_id``), its tools writing into it, and its history."""
    outbox = Outbox(outbox_id)
    return Turn(
        session_id,
        messages,
        turn_tools(ctx, session_id, outbox),
        flag,
        fetch_steering,
        row=row,
        started=started,
        outbox=outbox,
        fetch_row=fetch_row,
        fetch_history=history_reader(ctx, session_id),
        clock=ctx.now,
    )


def turn_tools(ctx: RuntimeContext, session_id: str, outbox: Outbox) -> Callable[[], Any]:
    """How a turn builds its tools on first use: bound to the session, writing into the
    turn's outbox, awaitable when the brain is async."""
    host = ctx.async_host
    if host is not None:
        return lambda: host.tools(ctx.tools_for(session_id, outbox))
    return lambda: ctx.tools_for(session_id, outbox)


def prepare(ctx: RuntimeContext, turn: Turn) -> None:
    """Run the turn hooks (the Focal policy) and their work here; an error here fails the
    attempt."""
    for work in hook_work(ctx, turn):
        work()


def hook_work(ctx: RuntimeContext, turn: Turn) -> list[Callable[[], object]]:
    """Run the turn hooks, which never block; what they leave to do before the brain, which
    may (an async host runs it on a blocking worker)."""
    return [work for hook in ctx.turn_hooks if (work := hook(ctx, turn)) is not None]


class BrainResultInvalid(TypeError):
    """A brain returned something that is neither None nor a string (B1): a number, a
    list, a generator whose body never ran. Delivering the message anyway would say it
    was handled when it was not."""

    def __init__(self, result: object) -> None:
        close = getattr(result, "close", None)
        if inspect.isgenerator(result) and callable(close):
            close()
        super().__init__(
            f"the brain returned a {type(result).__name__}, not None or a string: reply with "
            "turn.reply(text) or return the text (a generator function's body never runs "
            "as a brain). Nothing of this attempt was committed."
        )


def take_result(turn: Turn, result: object) -> None:
    """Take what a brain returned: a string is a reply, None is none; an awaitable (from a
    brain called as a plain function) or anything else is an error (B1)."""
    if result is None:  # most brains reply with turn.reply: no awaitable check to pay
        return
    if isinstance(result, str):
        if result:
            turn.reply(result)
        return
    if inspect.isawaitable(result):
        raise SyncBrainAwaitable(result)
    raise BrainResultInvalid(result)


def refused_commit(error: BaseException) -> Judged:
    """A turn whose commit the journal refused: a failed attempt, with the journal's error
    (escaped, as the brain's: it is recorded as the row's error)."""
    return _refused("the turn's commit", error)


def error_text(error: BaseException) -> str:
    """``<type>: <text>`` of a brain's (or the journal's) exception, storable. Its text as
    the traceback module gives it when its ``__str__`` raises: a library's exception that
    cannot say what it is still fails its attempt, where reading its text failed the
    record of the attempt and left the row ``processing`` until its lease ran out."""
    try:
        text = str(error)
    except Exception:
        text = "<exception str() failed>"
    return escaped(f"{type(error).__name__}: {text}")


def error_kind(summary: str) -> str:
    """What a log above DEBUG may quote of a failure's one-line summary (:func:`error_text`):
    its part before the first ``": "``, the exception's type (or kinbox's own words, "the
    journal refused the turn's commit"). Never the text after it: a brain builds its
    exception's text from anything, the message's body or a model's answer quoting it. The
    whole summary goes to the row's ``last_error`` and to the DEBUG log."""
    return summary.partition(": ")[0]


def refused_start(error: BaseException) -> Judged:
    """A taken-over row whose turn's start the journal refused: a failed attempt (its brain
    not run), with the journal's error, as :func:`refused_commit`."""
    return _refused("the turn's start", error)


def _refused(what: str, error: BaseException) -> Judged:
    return Judged(
        TurnOutcome(
            False,
            f"the journal refused {what}: {error_text(error)}",
            None,
        ),
        escaped("".join(traceback.format_exception(error))),
    )


def judge(ctx: RuntimeContext, turn: Turn, error: BaseException | None) -> Judged:
    """The turn's outcome. The turn stays on the running-turn board, past stopping
    (``ctx.turns.settle``): its caller ends it (``ctx.turns.end``) once the commit (or
    the failure record) is durable, so the session's next turn, whoever starts it,
    reads what this one wrote.

    A turn a caller stopped (``agent_stop``, an operator) ended on that stop, whatever the
    brain raised on its way out (a model call aborted on the flag) and however long it
    took: it commits what it replied. As a failed attempt it would be retried, and the
    stop would run the message again. The runtime's own stop and the timeout are no
    callers: their turns are judged as any other."""
    stopped_by = ctx.turns.settle(turn.session_id)
    if stopped_by is not None and stopped_by not in (TIMEOUT, RUNTIME_STOP):
        if error is not None:
            text = error_text(error)
            log.info("turn of %s stopped by %s ended with %s", turn.session_id, stopped_by,
                     error_kind(text))
            log.debug("turn of %s stopped by %s ended with %s", turn.session_id, stopped_by,
                      text)
        return Judged(TurnOutcome(True, None, stopped_by))
    if error is not None:
        # The brain's text, recorded as the row's error: escaped, or its commit would fail.
        summary = error_text(error)
        detail = escaped("".join(traceback.format_exception(error)))
    elif overdue(turn.started, ctx.now(), ctx.turn_timeout):
        summary = detail = (
            f"TurnTimeout: the turn ran {ctx.now() - turn.started:.1f} s, "
            f"past turn_timeout={ctx.turn_timeout} s"
        )
    else:
        return SUCCEEDED if stopped_by is None else Judged(TurnOutcome(True, None, stopped_by))
    return Judged(
        TurnOutcome(False, summary, None if stopped_by == TIMEOUT else stopped_by),
        detail,
        classify(error),
    )
