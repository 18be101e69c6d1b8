"""The HTTP API's JSON error answers: one body for every refusal of every route.

``{"error": code, "message": text}``, and ``"field"`` naming the request's field a
refusal is about. The app's own routes, the cron and social routes (which a product may
mount in an app of its own) and the request-shape rule all answer with these.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from .errors import BackendRefused


def error(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    field: str | None = None,
) -> JSONResponse:
    """A JSON error body; ``field``, when given, names the request's field it refuses."""
    body = {"error": code, "message": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


def refused_answer(exc: BackendRefused) -> JSONResponse:
    """The JSON error body of a backend's refusal."""
    return error(exc.status, exc.code, exc.message, field=exc.field)
