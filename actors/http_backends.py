"""The cron and social backends of the HTTP API, and the routes they serve.

Transport knows nothing of the runtime; these adapters give it what its
Protocols ask for and translate the runtime's errors into
:class:`~kinbox.transport.BackendRefused` with a precise status: 404 for an
unknown job, 422 for invalid input, 409 for a paused job triggered (or one whose
run is in progress, triggered or removed, or an idempotency key another job's), 503
when the social queue is full, this runtime runs no turns or it stopped, or the
database fails, 504 when a write may yet commit (its database did not answer in
time: read before retrying).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.routing import BaseRoute

from ..persistence import DatabaseFailed, WriterClosed, WriteTimeout
from ..transport import BackendRefused, Refusal, cron_routes, social_routes
from . import cron_rules, social_rules
from .cron import CronService
from .errors import RuntimeStateError
from .runtime import Runtime
from .social import SocialService

log = logging.getLogger("kinbox.http")

ACTIONS = ("trigger", "pause", "resume", "remove")


def _refusal(exc: Exception) -> BackendRefused:
    if isinstance(exc, cron_rules.CronJobNotFound):
        return BackendRefused(404, "not_found", str(exc))
    if isinstance(exc, cron_rules.CronJobPaused | cron_rules.CronRunInProgress
                  | cron_rules.CronJobConflict):
        return BackendRefused(409, "conflict", str(exc))
    if isinstance(exc, cron_rules.InvalidCronExpression | cron_rules.InvalidCronJob):
        return BackendRefused(422, "invalid_argument", str(exc), field=exc.field)
    if isinstance(exc, social_rules.InvalidSocialEvent):
        return BackendRefused(422, "invalid_argument", str(exc), field=exc.field or None)
    if isinstance(exc, social_rules.SocialQueueFull):
        return BackendRefused(503, "queue_full", str(exc))
    if isinstance(exc, WriteTimeout) and not exc.withdrawn:
        # Taken by a batch that outran the wait: it may yet commit, and a blind retry
        # would add a second job or fire a second run.
        return BackendRefused(504, "outcome_unknown", "the database did not answer in time "
                              "and the change may yet be made: read before trying again")
    if isinstance(exc, DatabaseFailed | WriteTimeout):
        # The driver's text may name paths, hosts or statements: the caller learns only
        # that this is worth retrying (the log keeps the rest).
        return BackendRefused(503, "unavailable", "the database is unavailable; try again")
    return BackendRefused(503, "unavailable", str(exc))


@contextmanager
def answered(rt: Runtime) -> Iterator[None]:
    """Answer for ``rt`` only while it runs, and turn what it refuses into the status the
    route answers with: a runtime that stopped (or whose writer did) is 503, never a 500,
    whether the route would write, read the database or read its memory; a database that
    fails or does not answer in time is 503 too (the caller may retry), not a 500."""
    try:
        if rt.state != "running":
            raise RuntimeStateError(f"the runtime is {rt.state}; it answers no more requests",
                                    state=rt.state)
        yield
    except (cron_rules.CronError, social_rules.SocialError, RuntimeStateError,
            WriterClosed) as exc:
        raise _refusal(exc) from exc
    except (DatabaseFailed, WriteTimeout) as exc:
        log.warning("a request found the database failing: %s", type(exc).__name__)
        log.debug("the database's error: %s", exc)
        raise _refusal(exc) from exc


class CronHttpBackend:
    """The :class:`~kinbox.transport.CronBackend` of a running runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cron: CronService = rt.cron

    def jobs(self, limit: int, offset: int, after: str | None = None
             ) -> tuple[list[dict[str, Any]], bool]:
        """``GET /cron/jobs``: a page (in id order past ``after``, when given), and whether
        another follows."""
        with answered(self.rt):
            return self.cron.jobs_page(limit, offset, after=after)

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /cron/jobs/{job_id}``."""
        with answered(self.rt):
            return self.cron.job(job_id)

    def add(self, fields: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """``POST /cron/jobs``."""
        with answered(self.rt):
            return self.cron.add(fields.get("name"), fields.get("cron"), fields.get("prompt"),
                                 delivery=fields.get("delivery", "announce"),
                                 timezone=fields.get("timezone", "UTC"),
                                 idempotency_key=idempotency_key)

    def act(self, action: str, job_id: str, idempotency_key: str | None = None
            ) -> dict[str, Any]:
        """``POST /cron/jobs/{job_id}/<action>`` and ``DELETE /cron/jobs/{job_id}``; a
        trigger's ``idempotency_key`` (its header, if given)."""
        if action not in ACTIONS:
            raise BackendRefused(404, "not_found", f"no cron action {action!r}")
        with answered(self.rt):
            if action == "trigger":
                return self.cron.trigger(job_id, idempotency_key)
            result: dict[str, Any] = getattr(self.cron, action)(job_id)
        return result

    def runs(self, job_id: str | None, limit: int, offset: int, before: str | None
             ) -> tuple[list[dict[str, Any]], bool, str | None]:
        """``GET /cron/jobs/{job_id}/runs`` and ``GET /cron/runs``: a page, whether older
        runs follow, and their cursor."""
        with answered(self.rt):
            page, more = self.cron.runs_page(job_id, limit, offset, before=before)
        return list(page), more, page.before

    def drain_announcements(self) -> tuple[list[dict[str, Any]], int]:
        """``POST /cron/announcements/drain``."""
        with answered(self.rt):
            drained = self.cron.drain_announcements()
        return list(drained), drained.dropped


class SocialHttpBackend:
    """The :class:`~kinbox.transport.SocialBackend` of a running runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.social: SocialService = rt.social

    def now(self) -> float:
        """The runtime's clock."""
        return self.social.ctx.now()

    def webhook_secret(self, platform: str) -> bytes | None:
        """The platform's signing secret."""
        return self.social.webhook_secret(platform)

    def ingest_event(self, platform: str, event: dict[str, Any]) -> dict[str, Any]:
        """Validate and queue a webhook event (its platform is the route's)."""
        with answered(self.rt):
            return self.social.ingest(event, platform=platform)


def cron_social_routes(rt: Runtime) -> Callable[[Refusal], list[BaseRoute]]:
    """The cron and social routes of a started runtime, for ``create_app(guarded_routes=...)``."""
    cron, social = CronHttpBackend(rt), SocialHttpBackend(rt)
    return lambda refusal: [*cron_routes(cron, refusal), *social_routes(social)]
