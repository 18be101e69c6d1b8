"""Turning a finished scenario into a report: text, JSON and a Mermaid diagram.

The report reads the truth from the journal (every message's final state
and attempts) and the story from the scenario's timeline (turns, crashes,
notes, checks). Times are scenario-clock seconds from the start, so the
same seed renders the same report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .scenario import Scenario


def short(message_id: str) -> str:
    """A message id cut to something a person can read in a table."""
    return message_id if len(message_id) <= 16 else message_id[:16] + "…"


def build_report(sc: Scenario, *, error: dict[str, Any] | None = None,
                 interrupted: str | None = None, journal: bool = True) -> dict[str, Any]:
    """Collect the report of a finished (or interrupted) scenario: this run's rows only.

    ``error`` is the script's own exception (type, message, path, line),
    ``interrupted`` the name of the signal that stopped the run. ``journal=False``: the
    database cannot be read (the script failed on it), and the report holds what the run
    kept in memory alone (its timeline and expectations), no rows or session titles.
    """
    timeline = sc.ordered_timeline()
    read = sc.started and journal
    rows = sc.inbox() if read else []
    names = {s.id: s.title for s in sc.runtime.sessions()} if read else {}
    # The row's attempts restart at 0 on a requeue; its history keeps every failure.
    failed = (sc.runtime.context.journal.failure_counts(r["message_id"] for r in rows)
              if rows else {})
    messages = [{
        "seq": r["seq"], "id": r["message_id"], "sender": r["sender_chat_id"],
        "target": r["target_chat_id"], "kind": r["kind"], "state": r["status"],
        "attempts": r["attempts"], "failed_attempts": failed.get(r["message_id"], 0),
        "content": r["content"][:80], "last_error": _last_line(r["last_error"]),
    } for r in rows]
    turns = [{
        "t": e["t"], "life": e["life"], "session": e["session_id"],
        "outcome": "committed" if e["event"] == "turn_committed" else "failed",
        "messages": e.get("message_ids") or [e.get("message_id")],
        "replies": e.get("replies", []), "error": e.get("error"),
    } for e in timeline if e["event"] in ("turn_committed", "turn_failed")]
    states: dict[str, int] = {}
    for m in messages:
        states[m["state"]] = states.get(m["state"], 0) + 1
    return {
        "scenario": sc.name, "seed": sc.seed, "ok": sc.ok and interrupted is None,
        "interrupted": interrupted, "error": error,
        "summary": {"messages": len(messages), "states": states,
                    "turns": sum(1 for t in turns if t["outcome"] == "committed"),
                    "failed_attempts": _failed_attempts(messages, timeline),
                    "lives": sc.generation},
        "sessions": names,
        "messages": messages,
        "turns": turns,
        "timeline": timeline,
        "expectations": [{"what": e.what, "ok": e.ok, "detail": e.detail}
                         for e in sc.expectations],
    }


def _failed_attempts(messages: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> int:
    """Every failed attempt of the run: the journal's, of its rows (a turn's, a peer
    link's send, one a takeover counted), and the timeline's of direct turns (a cron
    run's, a social event's), which are no inbox row."""
    direct = sum(1 for e in timeline if e["event"] == "turn_failed" and e.get("state") == "direct")
    return sum(m["failed_attempts"] for m in messages) + direct


def _last_line(error: str | None) -> str | None:
    """A row keeps a failed attempt's whole traceback; a report shows its last line."""
    if not error:
        return error
    lines = [x for x in error.strip().splitlines() if x.strip()]
    return lines[-1] if lines else error


def _label(names: dict[str, str], session_id: str | None) -> str:
    if session_id is None:
        return "(outside)"
    title = names.get(session_id)
    return f"{title} [{session_id}]" if title else session_id


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text for a terminal."""
    names = report["sessions"]
    head = f"scenario {report['scenario']} (seed {report['seed']})"
    if report.get("interrupted"):
        head += f": INTERRUPTED by {report['interrupted']}"
    out = [head, ""]
    if report.get("error"):
        out.append(f"error: {report['error']['message']}")
        out += [f"  {f['where']} in {f['function']}: {f['line']}"
                for f in report["error"].get("frames", [])]
        out += [f"  note: {n}" for n in report["error"].get("notes", [])]
        out.append("")
    out.append("messages (journal order):")
    for m in report["messages"]:
        out.append(f"  #{m['seq']:<4} {_label(names, m['sender'])} -> {_label(names, m['target'])}"
                   f"  {m['kind']}  {m['state']}  attempts={m['attempts']}{_in_all(m)}"
                   f"  {m['content']!r}")
        if m["last_error"] and m["state"] != "delivered":
            out.append(f"         last error: {m['last_error']}")
    out.append("")
    out.append("turns and events:")
    for e in report["timeline"]:
        line = _event_line(names, e)
        if line:
            out.append(f"  t={e['t']:>8}s life {e['life']}  {line}")
    out.append("")
    s = report["summary"]
    out.append(f"summary: {s['messages']} messages {s['states']}, {s['turns']} turns committed, "
               f"{s['failed_attempts']} failed attempts, {s['lives']} runtime lives")
    out.append("")
    out.append("expectations:")
    if not report["expectations"]:  # Scenario.ok: a run that checks nothing fails
        out.append("  (none: the script called no sc.expect, and a run that checks "
                   "nothing fails)")
    for e in report["expectations"]:
        mark = "PASS" if e["ok"] else "FAIL"
        out.append(f"  [{mark}] {e['what']}" + (f" ({e['detail']})" if e["detail"] else ""))
    out.append("")
    if report.get("interrupted"):
        out.append(f"result: interrupted ({report['interrupted']}): the runtime stopped "
                   "gracefully; what was not delivered waits in the journal")
    else:
        out.append("result: " + ("ok" if report["ok"] else "FAILED"))
    return "\n".join(out)


def _in_all(m: dict[str, Any]) -> str:
    """The failed attempts a requeue took off the row's count, when it did."""
    failed = m.get("failed_attempts", m["attempts"])
    return f" ({failed} failed in all)" if failed != m["attempts"] else ""


def _event_line(names: dict[str, str], e: dict[str, Any]) -> str | None:
    ev = e["event"]
    if ev == "sent":
        again = "" if e.get("created", True) else " (already journaled: not sent again)"
        return (f"sent {short(e['message_id'])} {_label(names, e.get('sender'))} -> "
                f"{_label(names, e.get('target'))} ({e.get('kind', 'message')}){again}")
    if ev == "turn_committed":
        replies = "; ".join(repr(r[:60]) for r in e.get("replies", []))
        return (f"turn of {_label(names, e['session_id'])} committed "
                f"{', '.join(short(i) for i in e['message_ids'])}"
                + (f" replying {replies}" if replies else ""))
    if ev == "turn_failed":
        return (f"turn of {_label(names, e['session_id'])} FAILED on {short(e['message_id'])}: "
                f"{e['error']} -> {e['state']} (attempts {e['attempts']})")
    if ev == "crashed":
        return "runtime CRASHED (killed; nothing in flight committed)"
    if ev == "started":
        return "runtime started" + (" (replaying unacknowledged rows)" if e["life"] > 1 else "")
    if ev == "note":
        return f"note: {e['text']}"
    if ev == "clock":
        return f"clock advanced {e['advance']}s"
    if ev == "requeued":
        return f"operator requeued {short(e['message_id'])}"
    if ev == "heartbeat":
        verdict = "ran" if e["run"] else "skipped"
        return f"heartbeat {verdict}: {e['reason']} ({e['findings']} findings)"
    if ev == "wakeup_scheduled":
        return f"wake-up {e['job_id']} scheduled ({e['kind']})"
    if ev == "peer_acked":
        return f"{short(e['message_id'])} acknowledged by device {e['device_id']}"
    if ev in ("peer_retry", "peer_failed"):
        outcome = "FAILED for good" if ev == "peer_failed" else "will retry"
        return (f"{short(e['message_id'])} to device {e['device_id']}: {e['error']} "
                f"(attempt {e['attempts']}, {outcome})")
    if ev == "acked_by_marker":
        return f"{short(e['message_id'])} acknowledged from its delivery marker (no second turn)"
    if ev == "social_delivery":
        return _delivery_line(names, e)
    if ev == "social_denied":
        return f"{e['platform']} event from {e['sender_id']} denied (not on the allowlist)"
    if ev == "social_refused":
        return (f"{e['platform']} event refused: the social queue is full "
                f"({e['refused']} refused)")
    return None


def _delivery_line(names: dict[str, str], e: dict[str, Any]) -> str | None:
    """A social reply's send: whether its platform got it. None for a turn with nothing to
    post, or one that failed (its own line says so)."""
    status = e["status"]
    if status in ("no_reply", "turn_failed"):
        return None
    where = f"reply of {_label(names, e['session_id'])} via {e['platform']}"
    if status == "sent":
        return f"{where} sent after {e['attempts']} attempt(s)"
    error = _last_line(e.get("error"))
    return (f"{where} NOT sent: {status} after {e['attempts']} attempt(s)"
            + (f" ({error[:100]})" if error else ""))


def _safe(text: str) -> str:
    """Text Mermaid accepts in a message or note (it treats ; and # specially)."""
    return " ".join(text.replace(";", ",").replace("#", "no.").split())


def _unsent_by_first_mention(report: dict[str, Any]) -> dict[int, list[str]]:
    """The messages with no "sent" event (a turn's commit or the scheduler journaled
    them), by the timeline index of the first event naming them (a turn that took
    them, a peer's ack): an arrow is drawn just before it. One no event names (still
    pending) is keyed past the timeline's end. Journal order within a key."""
    sent = {e["message_id"] for e in report["timeline"]
            if e["event"] == "sent" and e.get("created", True)}
    first: dict[str, int] = {}
    for i, e in enumerate(report["timeline"]):
        for mid in e.get("message_ids") or [e.get("message_id")]:
            if mid is not None and mid not in sent:
                first.setdefault(mid, i)
    end = len(report["timeline"])
    at: dict[int, list[str]] = {}
    for m in report["messages"]:
        if m["id"] not in sent:
            at.setdefault(first.get(m["id"], end), []).append(m["id"])
    return at


def render_mermaid(report: dict[str, Any]) -> str:
    """A Mermaid sequence diagram: sessions as participants, messages as arrows."""
    names = report["sessions"]
    # A direct turn's session (a social thread's, a cron job's) may have no message at all.
    ids = sorted({m["sender"] for m in report["messages"] if m["sender"]}
                 | {m["target"] for m in report["messages"]}
                 | {e["session_id"] for e in report["timeline"]
                    if e["event"] in ("turn_committed", "turn_failed")})
    alias = {sid: f"S{i}" for i, sid in enumerate(ids)}
    lines = ["```mermaid", "sequenceDiagram"]
    if any(m["sender"] is None for m in report["messages"]):
        lines.append("    participant OUT as outside")
    for sid in ids:
        title = _safe(names.get(sid, sid).replace('"', "'"))
        lines.append(f'    participant {alias[sid]} as {title}')
    state = {m["id"]: m for m in report["messages"]}
    unsent = _unsent_by_first_mention(report)

    def arrow(m: dict[str, Any]) -> str:
        return (f"    {alias.get(m['sender'], 'OUT')}->>{alias[m['target']]}: "
                f"{_safe(short(m['id']))} {_safe(m['kind'])} "
                f"({m['state']}, {m['failed_attempts']} failed attempts)")
    for i, e in enumerate(report["timeline"]):
        ev = e["event"]
        lines += [arrow(state[mid]) for mid in unsent.pop(i, [])]
        if ev == "sent" and e.get("created", True):
            m = state.get(e["message_id"])
            if m is not None:
                lines.append(arrow(m))
        elif ev == "turn_committed" and e["session_id"] in alias:
            replies = e.get("replies") or ["(no reply)"]
            lines.append(f"    Note over {alias[e['session_id']]}: turn committed: "
                         f"{_safe(replies[-1][:50])}")
        elif ev == "turn_failed" and e["session_id"] in alias:
            lines.append(f"    Note over {alias[e['session_id']]}: attempt failed, "
                         f"{e['state']}")
        elif (ev == "social_delivery" and e["session_id"] in alias
              and e["status"] not in ("sent", "no_reply", "turn_failed")):
            lines.append(f"    Note over {alias[e['session_id']]}: reply NOT sent via "
                         f"{_safe(e['platform'])} ({_safe(e['status'])})")
        elif (ev in ("crashed", "started") and e["life"] > 1) or ev == "crashed":
            span = f"{alias[ids[0]]},{alias[ids[-1]]}" if len(ids) > 1 else alias.get(
                ids[0], "OUT") if ids else "OUT"
            text = "runtime crashed" if ev == "crashed" else "runtime restarted, replaying"
            lines.append(f"    Note over {span}: {text}")
        elif ev == "note" and ids:
            span = f"{alias[ids[0]]},{alias[ids[-1]]}" if len(ids) > 1 else alias[ids[0]]
            lines.append(f"    Note over {span}: {_safe(e['text'])}")
    lines += [arrow(state[mid]) for at in sorted(unsent) for mid in unsent[at]]
    lines.append("```")
    return "\n".join(lines)
