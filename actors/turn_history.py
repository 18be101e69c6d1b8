"""What a turn may read of its session's earlier conversation (``turn.history``), and how
much of it.

A chat's second turn must see its first: the model that answers "and in French?" needs
the question and answer before it. The history is the session's visible transcript as
it is stored (user and assistant entries, each with its sender and kind), the newest
``limit`` of them, oldest first; hidden entries (a social delivery's note) and any role
a model was never shown (:data:`.transcript_view.SHOWN_ROLES`) are left out. It is read
through the store's one transcript read (``store.transcript(..., last=, visible_only=)``,
a LIMIT on the ``(session_id, id)`` index), so its cost is bounded by ``limit``, which is
bounded here. Everything in it was committed before this turn began: a session runs one
turn at a time, a turn's own entries are committed only with it, and a failed attempt
commits nothing, so a retry sees what the first attempt saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..persistence import EntryRecord
from .errors import ConfigError
from .transcript_view import shown

if TYPE_CHECKING:
    from .context import RuntimeContext

HISTORY_MAX = 1000
"""The most entries one read of a turn's history returns: a model's context holds far
fewer, and a read must stay a bounded one however a brain is configured."""

DEFAULT_HISTORY = 20
"""The earlier entries the framework brains hand their model unless told otherwise: ten
exchanges, enough for a chat to follow on, few enough to stay cheap in tokens and reads."""

HistoryRead = Callable[[int], list[EntryRecord]]
"""Reads the newest ``n`` visible entries of the turn's session, oldest first."""


def history_limit(value: object, field: str = "limit") -> int:
    """``value`` as a history's size: a whole number from 0 (none) to :data:`HISTORY_MAX`;
    anything else is a :class:`ConfigError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= HISTORY_MAX:
        raise ConfigError(
            f"{field} must be a whole number from 0 to {HISTORY_MAX}, not {value!r}",
            field=field,
        )
    return value


def history_reader(ctx: RuntimeContext, session_id: str) -> HistoryRead:
    """How a turn of ``session_id`` reads its history (a blocking read: off the event loop)."""

    def read(n: int) -> list[EntryRecord]:
        return shown(ctx.store.transcript(session_id, last=n, visible_only=True))

    return read
