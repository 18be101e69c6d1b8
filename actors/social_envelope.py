"""A social turn's text (SO1): the envelope naming platform and sender, then the sender's
text, quoted where it could pass for the runtime's own lines, then the attachments. Pure.

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

import json
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .social_rules import SocialEvent

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


def envelope(event: SocialEvent) -> str:
    """The turn's text: an envelope line naming platform and sender, then the message.

    The display name is anyone's to choose, so it is quoted (JSON's escapes): whatever
    it holds, it cannot pass for the sender id or the end of the line; so is an
    attachment's name. The message's lines that could pass for the header or an
    attachment line are quoted behind :data:`QUOTE` (:func:`quoted_body`): the only
    unquoted lines with a square bracket are the runtime's."""
    name = json.dumps(event.sender_name, ensure_ascii=False)
    lines = [f"[{event.platform} message from {name} (sender id {event.sender_id})]"]
    if event.text:
        lines.append(quoted_body(event.text))
    lines += [f"[attachment: {json.dumps(a.name or 'file', ensure_ascii=False)} {a.url}]"
              for a in event.attachments]
    return "\n".join(lines)
