"""The cron routes of the HTTP API: the same operations as ``kinbox cron`` (C1, C3).

::

    GET    /cron/jobs                      its jobs, soonest due first (?limit=, ?offset=),
                                           or by id (?after=: a walk, each job once)
    POST   /cron/jobs                      add: {name, cron, prompt, delivery?, timezone?}
                                           (Idempotency-Key: a retry adds no second job)
    GET    /cron/jobs/{job_id}             one job
    POST   /cron/jobs/{job_id}/trigger     run it now (Idempotency-Key: a retry runs nothing again)
    POST   /cron/jobs/{job_id}/pause       stop its schedule
    POST   /cron/jobs/{job_id}/resume      restart it, retries reset
    DELETE /cron/jobs/{job_id}             remove it and its runs (409 while one runs)
    GET    /cron/jobs/{job_id}/runs        its runs, newest first (?limit=, ?before= or ?offset=)
    GET    /cron/runs                      every job's runs (?limit=, ?before= or ?offset=)
    POST   /cron/announcements/drain       take the UI's announcements of finished runs:
                                           {announcements, dropped (since the last drain)}

Every call follows the app's rule (the ``refusal`` it hands over: the
``X-Kinbox: 1`` header on state-changing calls, or its operator token on
every call when one is set), like every other route's. The
backend's calls touch the database, so they run on a worker thread, never
on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import json_body
from .errors import BackendRefused, quoted
from .http_app import DescribedRoute, Refusal, guard
from .json_answers import error, refused_answer
from .page_limits import RUNS_LIMIT
from .request_shape import PAGE, shaped

RUNS_PAGE = (*PAGE, "before")
"""The query parameters of a listing of runs: a page's cursor too."""

JOBS_PAGE = (*PAGE, "after")
"""The query parameters of the listing of jobs: a page's cursor too (a job id)."""

ADD_FIELDS = ("name", "cron", "prompt", "delivery", "timezone")
IDEMPOTENCY_KEY = "Idempotency-Key"
"""The header of a ``POST /cron/jobs`` a client may retry: the same key and job again
answer the job added first (no second job), the same key with another job is a 409."""
MAX_BODY = 256 * 1024
"""Largest ``POST /cron/jobs`` body, in bytes: room for the longest prompt (20,000
characters) even with every character escaped as a JSON surrogate pair (12 bytes)."""


class CronBackend(Protocol):
    """What the cron routes need from a runtime; refusals are :class:`BackendRefused`."""

    def jobs(self, limit: int, offset: int, after: str | None = None
             ) -> tuple[list[dict[str, Any]], bool]:
        """At most ``limit`` jobs in listing order, from the ``offset``-th on, or in id
        order, those whose ``job_id`` sorts after ``after`` (``""``: from the first); and
        whether more follow. Called with ``after`` only when the request gave one (a
        backend written before the cursor keeps serving offsets)."""
        ...

    def job(self, job_id: str) -> dict[str, Any]:
        """One job."""
        ...

    def add(self, fields: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """Create a job from the request's fields; ``idempotency_key`` (its header, if
        given): a repeat answers the job the key's first request added."""
        ...

    def act(self, action: str, job_id: str, idempotency_key: str | None = None
            ) -> dict[str, Any]:
        """``trigger``, ``pause``, ``resume`` or ``remove`` a job; ``idempotency_key`` (a
        trigger's header, if given): a repeat of the job's last keyed trigger runs
        nothing again."""
        ...

    def runs(self, job_id: str | None, limit: int, offset: int, before: str | None
             ) -> tuple[list[dict[str, Any]], bool, str | None]:
        """At most ``limit`` run records, newest first, older than the cursor ``before``
        (None: from the newest) or from the ``offset``-th on; whether older ones follow;
        and the cursor of the older ones (None on the last page)."""
        ...

    def drain_announcements(self) -> tuple[list[dict[str, Any]], int]:
        """Take the queued announcements, oldest first; and how many the full queue dropped
        since the last drain."""
        ...


async def _call(work: Callable[[], Any], status: int = 200) -> JSONResponse:
    try:
        result = await run_in_threadpool(work)
    except BackendRefused as exc:
        return refused_answer(exc)
    return JSONResponse(result, status_code=status)


NEXT_OFFSET = "X-Kinbox-Next-Offset"
"""The header of a listing page (jobs, runs) that is not the last: the ``offset`` of the
next."""

NEXT_AFTER = "X-Kinbox-Next-After"
"""The header of a page of jobs read by ``?after=`` that is not the last: the cursor
(``?after=``) of the next, the id of its last job."""

NEXT_BEFORE = "X-Kinbox-Next-Before"
"""The header of a page of runs that is not the last: the cursor (``?before=``) of the
runs older than its last."""

OFFSET_LIMIT = 1_000_000_000
"""The largest ``offset`` a listing takes (past every job or run a database holds)."""


def _whole(request: Request, name: str, default: int, low: int, high: int) -> int | None:
    """The query parameter ``name`` as a whole number ``low..high`` (``default`` when it is
    absent); None when it is anything else (a number past ``high`` is refused before it is
    read: Python reads at most 4,300 digits)."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(high))):
        return None
    return int(text) if low <= int(text) <= high else None


def idempotency_key(request: Request) -> str | Response | None:
    """The request's ``Idempotency-Key`` header (None: none), or the 422 answering two."""
    keys = request.headers.getlist(IDEMPOTENCY_KEY)
    if len(keys) > 1:  # which one the client meant is anyone's guess
        return error(422, "invalid_argument", f"one {IDEMPOTENCY_KEY} header, not "
                     f"{len(keys)}", field="idempotency_key")
    return keys[0] if keys else None


def cron_routes(backend: CronBackend, refusal: Refusal) -> list[Route]:
    """The cron routes; ``refusal`` is the app's rule for every call (see
    :func:`.http_app.create_app`)."""

    async def paged(request: Request, default: int,
                    read: Callable[[int, int], tuple[list[dict[str, Any]], bool]]
                    ) -> Response:
        limit = _whole(request, "limit", default, 1, RUNS_LIMIT)
        offset = _whole(request, "offset", 0, 0, OFFSET_LIMIT)
        if limit is None or offset is None:
            return error(422, "invalid_argument", f"limit must be a whole number "
                         f"1..{RUNS_LIMIT} and offset one 0..{OFFSET_LIMIT:_}",
                         field="limit" if limit is None else "offset")
        try:
            page, more = await run_in_threadpool(read, limit, offset)
        except BackendRefused as exc:
            return refused_answer(exc)
        # A page that is not the last says where the next begins (the body stays a list).
        headers = {NEXT_OFFSET: str(offset + len(page))} if more else None
        return JSONResponse(page, headers=headers)

    async def jobs(request: Request) -> Response:
        after = request.query_params.get("after")
        if after is None:
            return await paged(request, RUNS_LIMIT, backend.jobs)
        last: list[str] = []

        def read(limit: int, offset: int) -> tuple[list[dict[str, Any]], bool]:
            page, more = backend.jobs(limit, offset, after=after)
            if more and page:
                last.append(str(page[-1]["job_id"]))
            return page, more

        answer = await paged(request, RUNS_LIMIT, read)
        if last:
            # By id, which a job never moves in: a walk by it lists each job once while
            # jobs fire (each one moves in due order, and shifted an offset's pages).
            answer.headers[NEXT_AFTER] = last[0]
            del answer.headers[NEXT_OFFSET]
        return answer

    async def add(request: Request) -> Response:
        try:
            body = await json_body.json_object(request, MAX_BODY)
        except BackendRefused as exc:
            return refused_answer(exc)
        unknown = sorted(set(body) - set(ADD_FIELDS))
        if unknown:
            return error(422, "invalid_argument", f"unknown fields {quoted(unknown)}; "
                                                  f"known: {list(ADD_FIELDS)}")
        key = idempotency_key(request)
        if isinstance(key, Response):
            return key
        # A repeat (the same key and job) answers 201 with the job as the first did: the
        # client whose answer was lost reads it as it would have read that one.
        return await _call(lambda: backend.add(body, key), 201)

    async def one(request: Request) -> Response:
        return await _call(lambda: backend.job(request.path_params["job_id"]))

    def action(verb: str) -> Callable[[Request], Any]:
        async def handler(request: Request) -> Response:
            key = idempotency_key(request) if verb == "trigger" else None
            if isinstance(key, Response):
                return key
            return await _call(lambda: backend.act(verb, request.path_params["job_id"], key))
        return handler

    async def runs(request: Request) -> Response:
        job_id = request.path_params.get("job_id")
        before = request.query_params.get("before")
        cursors: list[str | None] = []

        def read(limit: int, offset: int) -> tuple[list[dict[str, Any]], bool]:
            page, more, cursor = backend.runs(job_id, limit, offset, before)
            cursors.append(cursor)
            return page, more

        answer = await paged(request, 50, read)
        if cursors and cursors[0] is not None:
            # The older runs, past the page's last: a walk by it lists each run once while
            # runs are recorded (each one shifts the pages of an offset, counted from the
            # newest). A page read from a cursor names no offset: it counts from none.
            answer.headers[NEXT_BEFORE] = cursors[0]
            if before is not None:
                del answer.headers[NEXT_OFFSET]
        return answer

    async def drain(request: Request) -> Response:
        def take() -> dict[str, Any]:
            announcements, dropped = backend.drain_announcements()
            return {"announcements": announcements, "dropped": dropped}
        return await _call(take)

    guarded = guard(refusal)  # every cron call, reads too, meets the app's rule first

    return [
        _by_method("/cron/jobs", {"GET": guarded(shaped(jobs, query=JOBS_PAGE)),
                                  "POST": guarded(shaped(add, body=True))},
                   "the cron jobs, soonest due first (?limit=, ?offset=), or by id "
                   "(?after=); POST adds one: {name, cron, prompt, delivery?, timezone?}"),
        _by_method("/cron/jobs/{job_id}", {"GET": guarded(shaped(one)),
                                            "DELETE": guarded(shaped(action("remove")))},
                   "one cron job; DELETE removes it and its runs"),
        *(DescribedRoute(f"/cron/jobs/{{job_id}}/{verb}", guarded(shaped(action(verb))),
                         methods=["POST"], about=about)
          for verb, about in ABOUT_ACTIONS.items()),
        DescribedRoute("/cron/jobs/{job_id}/runs", guarded(shaped(runs, query=RUNS_PAGE)),
                       methods=["GET"],
                       about="a cron job's runs, newest first (?limit=, ?before= or "
                             "?offset=)"),
        DescribedRoute("/cron/runs", guarded(shaped(runs, query=RUNS_PAGE)), methods=["GET"],
                       about="every cron job's runs, newest first (?limit=, ?before= or "
                             "?offset=)"),
        DescribedRoute("/cron/announcements/drain", guarded(shaped(drain)), methods=["POST"],
                       about="take the announcements of finished runs, and how many "
                             "were dropped"),
    ]


ABOUT_ACTIONS = {"trigger": "run a cron job now, its schedule unchanged",
                 "pause": "stop a cron job's schedule",
                 "resume": "restart a paused cron job, its retries reset"}


def _by_method(path: str, handlers: dict[str, Callable[[Request], Any]], about: str
               ) -> Route:
    """One route for a path that takes several methods: two routes for one path would
    answer a wrong method with only the first one's methods in ``Allow``."""
    async def dispatch(request: Request) -> Any:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)
    return DescribedRoute(path, dispatch, methods=list(handlers), about=about)
