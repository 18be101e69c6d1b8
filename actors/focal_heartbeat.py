"""Whether the Focal heartbeat should run (FO6). Pure: time comes in as ``now``.

A user-edited checklist always runs. The default checklist runs only when
there are findings (sessions idle for 30 minutes with open tasks and nothing
waiting on the user; blockers unanswered for 2 hours) whose SHA-256
signature differs from the last successful check-in's.

``heartbeat.md`` is the user's file: whatever bytes it holds (not UTF-8, a
NUL, cut mid-character by a write in progress, megabytes long) become a
checklist a message can carry (:func:`checklist_text`); one with no text is the
default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .inline_text import inline
from .validation import SEND_LIMIT, escaped

STALL_AFTER = 30 * 60.0
REMIND_BLOCKED_AFTER = 2 * 60 * 60.0
CHECKLIST_LIMIT = SEND_LIMIT // 2
"""Characters of ``heartbeat.md`` a check-in carries: half a message's limit, the other
half left to the findings (:func:`check_in`)."""
CHECKLIST_READ = CHECKLIST_LIMIT * 4 + 1
"""Bytes of ``heartbeat.md`` worth reading: UTF-8 takes at most 4 a character, and one
more tells a file that is longer."""

DEFAULT_FOCAL_HEARTBEAT = """# SUZENT heartbeat checklist

- Look for sessions that stalled with open tasks and nudge or ask the user.
- Remind the user of questions that have waited for an answer for hours.
- Stay quiet when nothing changed.
"""


def checklist_text(raw: bytes) -> str:
    """The checklist in ``raw`` (the first :data:`CHECKLIST_READ` bytes of the file):
    bytes that are not UTF-8 become U+FFFD and a NUL is escaped, so the file's text can
    be stored on every backend; cut at :data:`CHECKLIST_LIMIT` characters, saying so.

    A file with no text (empty, or white space only) is no checklist: the default's, as
    with no file. Taken as an edited one, which always runs, it woke Focal every 30
    minutes for a turn on a message with nothing in it."""
    text = escaped(raw.decode("utf-8", errors="replace"))
    if not text.strip():
        return DEFAULT_FOCAL_HEARTBEAT
    if len(text) <= CHECKLIST_LIMIT and len(raw) < CHECKLIST_READ:
        return text
    return text[:CHECKLIST_LIMIT] + f"\n\n(heartbeat.md is cut at {CHECKLIST_LIMIT:,} characters)"


@dataclass(frozen=True)
class WatchedSession:
    """What the heartbeat knows of a session."""

    id: str
    title: str
    last_activity: float
    running: bool
    open_tasks: int
    blocked_on_user_since: tuple[float, ...] = ()


def is_stalled(session: WatchedSession, now: float) -> bool:
    """Idle for :data:`STALL_AFTER` with open tasks, not running and nothing waiting on
    the user: a finding of the heartbeat, and what ``GET /focal`` counts as stalled."""
    return bool(session.open_tasks and not session.running
                and not session.blocked_on_user_since
                and now - session.last_activity >= STALL_AFTER)


def findings(sessions: Sequence[WatchedSession], now: float) -> list[str]:
    """What deserves a check-in, the longest waiting first (what a cut check-in keeps,
    :func:`check_in`), each once; the signature depends only on content."""
    found: dict[str, float] = {}
    for s in sessions:
        if is_stalled(s, now):
            text = f"stalled: {inline(s.title)} ({s.id}) idle with {s.open_tasks} open tasks"
            found[text] = min(found.get(text, s.last_activity), s.last_activity)
        for since in s.blocked_on_user_since:
            if now - since >= REMIND_BLOCKED_AFTER:
                text = f"unanswered: {inline(s.title)} ({s.id}) waits on the user"
                found[text] = min(found.get(text, since), since)
    return sorted(found, key=lambda text: (found[text], text))


def check_in(checklist: str, found: Sequence[str]) -> str:
    """The check-in message: ``checklist`` (at most :data:`CHECKLIST_LIMIT` characters and
    its cut note, :func:`checklist_text`), then ``found`` in order, as many as keep the
    message within :data:`SEND_LIMIT` (:func:`kept_findings`), and a line saying how many
    more were left out.

    Uncapped, hundreds of stalled sessions made a check-in of many times the limit every
    other message keeps to, and a model's context could overflow."""
    if not found:
        return checklist
    kept = kept_findings(checklist, found)
    lines = [_head(checklist), *(_line(f) for f in kept)]
    if len(kept) < len(found):
        lines.append(_left_out(len(found) - len(kept)))
    return "\n".join(lines)


def kept_findings(checklist: str, found: Sequence[str]) -> list[str]:
    """The first of ``found`` that :func:`check_in` carries with ``checklist``: all when
    they fit within :data:`SEND_LIMIT`, else as many as fit beside the line saying how
    many more were left out. The check-in's row keeps these, not all of ``found``: with
    every finding its payload grew past the limit every other payload keeps to."""
    head = _head(checklist)
    lines = [_line(f) for f in found]
    if len(head) + sum(len(line) + 1 for line in lines) <= SEND_LIMIT:
        return list(found)
    room = SEND_LIMIT - len(head) - len(_left_out(len(lines))) - 1
    kept: list[str] = []
    for finding, line in zip(found, lines, strict=True):
        room -= len(line) + 1
        if room < 0:
            break
        kept.append(finding)
    return kept


def _head(checklist: str) -> str:
    return checklist + "\n\nFindings:"


def _line(finding: str) -> str:
    return f"- {finding}"


def _left_out(count: int) -> str:
    return f"({count} more findings left out)"


def signature(found: Sequence[str]) -> str:
    """SHA-256 of the findings."""
    return hashlib.sha256("\n".join(sorted(found)).encode()).hexdigest()


@dataclass(frozen=True)
class HeartbeatDecision:
    """Run or skip, why, and the signature to store after a successful check-in."""

    run: bool
    reason: str
    signature: str | None


def should_run_focal_heartbeat(checklist: str, found: Sequence[str],
                               last_signature: str | None) -> HeartbeatDecision:
    """The decision made in code before any model call."""
    sig = signature(found) if found else None
    if checklist.strip() != DEFAULT_FOCAL_HEARTBEAT.strip():
        return HeartbeatDecision(True, "the checklist was edited by the user", sig)
    if not found:
        return HeartbeatDecision(False, "no findings", None)
    if sig == last_signature:
        return HeartbeatDecision(False, "nothing changed since the last check-in", sig)
    return HeartbeatDecision(True, "new findings", sig)
