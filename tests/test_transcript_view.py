"""What agent_read shows (T2), as a property of the pure view: within its limit for every
limit it takes, the newest messages kept, an over-long newest one's tail behind the
marker; a limit too small for that is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.actors import ConfigError
from kinbox.actors.transcript_view import (
    MIN_READ_LIMIT,
    SHOWN_ROLES,
    TRUNCATED,
    Line,
    omitted_line,
    render,
)

lines = st.lists(st.builds(Line, role=st.sampled_from(["user", "assistant", "tool"]),
                           text=st.text(max_size=120), visible=st.booleans()), max_size=8)


@pytest.mark.timeout(60)
@given(entries=lines, limit=st.integers(MIN_READ_LIMIT, 400))
def test_a_read_keeps_the_newest_messages_within_its_limit(entries: list[Line],
                                                           limit: int) -> None:
    shown = [f"{e.role}: {e.text}" for e in entries if e.visible and e.role in SHOWN_ROLES]
    text = render(entries, limit)
    # The newest messages that fit whole: the longest run of them ending with the newest.
    fitting = next(n for n in range(len(shown), -1, -1)
                   if len("\n\n".join(shown[len(shown) - n:])) <= limit)
    kept = shown[len(shown) - fitting:]
    omitted = len(shown) - max(len(kept), 1 if shown else 0)
    head = omitted_line(omitted) + "\n\n" if omitted else ""
    assert text.startswith(head)
    body = text[len(head):]
    assert len(body) <= limit
    if kept or not shown:
        assert body == "\n\n".join(kept)
    else:  # the newest message alone is over the limit: its tail, behind the marker
        newest = shown[-1]
        assert body.startswith(TRUNCATED + "\n") and len(body) == limit
        assert newest.endswith(body[len(TRUNCATED) + 1:])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [MIN_READ_LIMIT, len(TRUNCATED) + 1, len(TRUNCATED), 5])
def test_a_read_limit_too_small_for_the_marker_is_refused_not_overrun(limit: int) -> None:
    """At 28 the whole over-long message came back, below it all but its first few
    characters: a limit that cannot hold the marker and some of the tail is refused."""
    entries = [Line("assistant", "x" * 100 + "THE END", True)]
    if limit < MIN_READ_LIMIT:
        with pytest.raises(ConfigError) as refused:
            render(entries, limit)
        assert refused.value.field == "limit"
    else:
        assert render(entries, limit) == f"{TRUNCATED}\nD"
