"""Social events in (SO1): validated, deduplicated, bounded, then routed to their chat.

:meth:`SocialIngress.ingest` validates a raw event (:func:`.social_rules.normalize`)
and queues it, refusing at once past the bound (every accepted event not yet
through its turn) and answering a platform's retry of an event it took (or
that a runtime sharing the database committed) as a duplicate. One consumer
thread takes the queue in order, authorizes each sender by id and routes the
event (:func:`.social_rules.route`): an idle chat starts a turn, the running
turn's sender steers it, anyone else waits for the chat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..persistence import WriterClosed
from . import social_rules as rules
from .social_chats import ChatTurns
from .social_state import RECENT_IDS, Chat

log = logging.getLogger("kinbox.social")


class SocialIngress(ChatTurns):
    """Takes events in and hands them to their chats."""

    def ingest(self, event: Mapping[str, Any], *, platform: str | None = None) -> dict[str, Any]:
        """Validate a raw channel event and queue it; a receipt, or a :class:`SocialError`."""
        if self.turns is None:
            raise rules.SocialUnavailable()
        self.ctx.require_running()
        fresh_id = f"social-{self.ctx.new_id()}"
        normalized = rules.normalize(event, fresh_id, platform)
        sid = rules.session_id_for(normalized.platform, normalized.thread_id)
        with self._lock:
            known = normalized.event_id in self._recent
        # A retry another runtime sharing the database ran already (its turn's marker).
        ran_elsewhere = (not known and normalized.event_id != fresh_id
                         and bool(self.ctx.journal.committed_of([normalized.event_id])))
        with self._lock:
            if ran_elsewhere or normalized.event_id in self._recent:  # a platform's retry
                self.counts["duplicates"] += 1
                return {"accepted": True, "duplicate": True, "event_id": normalized.event_id,
                        "session_id": sid}
            # Again under the lock: a stop may have come since the first look (during the
            # read above), and what is accepted after its hand_over would be lost with a
            # 202. The runtime closes before it hands over, so this look sees it.
            self.ctx.require_running()
            # The bound covers every accepted event not yet through its turn (queued,
            # waiting for its chat, steering, running), so memory stays bounded.
            full = self._handling >= self.bound
            if full:
                self.counts["refused"] += 1
            else:
                self.counts["accepted"] += 1
                self._handling += 1
                self._recent[normalized.event_id] = None
                self._unstarted[normalized.event_id] = normalized
                while len(self._recent) > RECENT_IDS:
                    self._recent.popitem(last=False)
            refused = self.counts["refused"]
        if full:
            log.warning("social ingress queue full (%d): refused an event from %s (%d refused)",
                        self.bound, normalized.platform, refused)
            self.ctx.emit("social_refused", platform=normalized.platform, refused=refused)
            raise rules.SocialQueueFull(self.bound, refused)
        self._queue.put(normalized)
        return {"accepted": True, "duplicate": False, "event_id": normalized.event_id,
                "session_id": sid}

    def statistics(self) -> dict[str, Any]:
        """Counters, the queue's depth and bound."""
        with self._lock:
            return {**self.counts, "queued_now": self._queue.qsize(), "bound": self.bound}

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every accepted event was handled and no social turn runs."""
        if self.turns is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                busy = self._handling > 0
            if not busy and self.turns.is_idle():
                return True
            # Between two turns of a chat the pool is briefly idle: wait on it, then look again.
            self.turns.wait_idle(0.02)
            self._stop.wait(0.005)
        return False

    def _consume(self) -> None:
        while not self._stop.is_set():
            event = self._queue.get()
            if event is None:
                break
            try:
                self._route(event)
            except WriterClosed:
                break
            except Exception:
                log.exception("social event %s could not be handled", event.event_id)
                with self._lock:
                    self._unstarted.pop(event.event_id, None)
                self._handled()

    def _route(self, event: rules.SocialEvent) -> None:
        with self._lock:
            allowed = rules.authorized(self._allow, event.platform, event.sender_id)
            if not allowed:
                self.counts["denied"] += 1
                self._unstarted.pop(event.event_id, None)
        if not allowed:
            log.info("social event from unlisted sender on %s denied", event.platform)
            self.ctx.emit("social_denied", platform=event.platform, sender_id=event.sender_id)
            self._handled()
            return
        # The session is made where the turn runs: a database error there is the turn's,
        # which runs again, where here it would drop an event its platform has a 202 for.
        sid = rules.session_id_for(event.platform, event.thread_id)
        with self._lock:
            chat = self._chats.setdefault(sid, Chat())
            decision = rules.route(chat.running_sender, event.sender_id)
            if decision is rules.Route.STEER:
                chat.steering.append(event)
                self.counts["steered"] += 1
            elif decision is rules.Route.QUEUE:
                chat.pending.append(event)
                self.counts["queued"] += 1
            else:
                chat.running_sender = event.sender_id
        self.ctx.emit("social_routed", session_id=sid, route=decision.value,
                      event_id=event.event_id)
        if decision is rules.Route.START:
            assert self.turns is not None
            if self.turns.submit_steps(lambda: self._run_chat(sid, event)) is None:
                self._handled()
