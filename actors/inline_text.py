"""Text from users and models placed inside a line the runtime writes (pure).

Session and task titles, a blocked task's reason: Focal reads them inside its global
context, its notices and the heartbeat's findings, each of which is lines of the
runtime's own. A title holding a newline (a sub-agent's title is cut from the model's
description) started a line of its own there, which read as the runtime's: a fake
"- session ..." line in the context, a fake finding in a check-in.
"""

from __future__ import annotations


def inline(text: str) -> str:
    """``text`` as one line: every run of whitespace (newlines, tabs) one space, none at
    either end."""
    return " ".join(text.split())
