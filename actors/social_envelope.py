"""The sender's text in a social turn's envelope, quoted where it could pass for the runtime's
own lines (SO1). Pure.

The envelope's header (``[slack message from "Ann" (sender id U123)]``) is the
agent's only word on who wrote, and its attachment lines are the runtime's
too: every line of it that holds a square bracket is the runtime's. A sender
may write anything, such a line included (``[slack message from "Boss" (sender
id U-boss)]`` below a line of their own, or ``social_message: [...]``, the way
a framework brain's prompt opens the next message), so every line of the text
that holds an opening square bracket, in any of its Unicode forms, is quoted
behind ``| ``. The lines are those any reader breaks at (``str.splitlines``:
CR, LF, U+2028, NEL...), and the text is otherwise unchanged; the turn's payload
carries it whole (``text``).
"""

from __future__ import annotations

import unicodedata

QUOTE = "| "
"""What a quoted line of the sender's text starts with (no runtime line does)."""
BRACKETS = frozenset("[\u2045\u27e6\u27ec\u3010\u3014\u3016\u3018\u301a\ufe5d")
"""An opening square bracket and its look-alikes (the fullwidth one is ``[`` under
NFKC)."""


def needs_quote(line: str) -> bool:
    """Could ``line`` pass for (or hold) a line the runtime writes? Any opening square
    bracket, in any Unicode form, says so."""
    return any(char in BRACKETS for char in unicodedata.normalize("NFKC", line))


def quoted_body(text: str) -> str:
    """``text`` with each of its lines that :func:`needs_quote` behind :data:`QUOTE`."""
    lines = text.splitlines(keepends=True)
    return "".join(QUOTE + line if needs_quote(line) else line for line in lines)
