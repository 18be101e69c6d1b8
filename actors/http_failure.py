"""A model API's (or a chat platform's) HTTP error answer, read the same way everywhere
(pure: ``now`` comes in as an argument).

- :func:`retry_after_seconds`: the wait a ``Retry-After`` header asks (seconds, or an
  HTTP date measured from ``now``);
- :func:`fallback_failure`: the same for a fallback chain of models that all failed;
- :func:`model_http_failure`: a model API's error status as kinbox's brain failure
  (:mod:`.brain_failure`), what the framework brains raise ``from`` their client's error:
  400, 401, 403, 404 and 422 cannot heal by waiting (a bad key, a refused or malformed
  request, an unknown model): :class:`~.errors.PermanentFailure`; 408, 429 and 5xx with a
  wait asked: :class:`~.errors.RetryLater`; anything else (a 5xx without one): None, an
  ordinary failed attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.utils import mktime_tz, parsedate_tz

from .errors import PermanentFailure, RetryLater

PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 422})
"""A model API's answers that the same request gets again however long it waits."""


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait: a whole number of seconds, or an
    HTTP date (GMT) measured from ``now``; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    parsed = parsedate_tz(value)
    if parsed is None:
        return None
    if parsed[9] is None:  # an HTTP date is GMT
        parsed = (*parsed[:9], 0)
    try:
        return max(0.0, mktime_tz(parsed) - now)
    except (OverflowError, ValueError):
        return None


def headers_retry_after(headers: Mapping[str, str] | None, now: float) -> float | None:
    """The wait a response's headers ask (keys in any case): ``retry-after-ms`` (what
    OpenAI's API sends besides), else ``Retry-After``; None without either."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass  # unreadable: the seconds header, if any
    return retry_after_seconds(lowered.get("retry-after"), now)


def model_http_failure(
    status: int, retry_after: float | None, what: str
) -> PermanentFailure | RetryLater | None:
    """The brain failure a model API's HTTP ``status`` is (None: an ordinary failed
    attempt); ``retry_after``: the seconds its answer asked to wait, if it did; ``what``
    names the API in the message (never the body: it may quote the prompt)."""
    if status in PERMANENT_STATUSES:
        return PermanentFailure(
            f"{what} answered HTTP {status}: the same request cannot succeed later"
        )
    if (status in (408, 429) or status >= 500) and retry_after is not None:
        return RetryLater(
            retry_after, f"{what} answered HTTP {status} and asked to wait {retry_after:g} s"
        )
    return None


def fallback_failure(
    failures: list[PermanentFailure | RetryLater | None], what: str
) -> PermanentFailure | RetryLater | None:
    """The brain failure of a fallback chain whose every model failed, from each model's own
    (:func:`model_http_failure`, None for an ordinary error): for good only when every one
    is (the chain is there to get past a model that refused), else the shortest wait one
    asked (the first model ready again may answer), else None (an ordinary failed
    attempt). Unlike a task group, whose every part must succeed, one model is enough."""
    if failures and all(isinstance(f, PermanentFailure) for f in failures):
        return PermanentFailure(f"every model of {what} answered for good")
    waits = [f.retry_after for f in failures if isinstance(f, RetryLater)]
    if waits:
        return RetryLater(min(waits), f"every model of {what} failed; the first asked to "
                          f"wait {min(waits):g} s")
    return None
