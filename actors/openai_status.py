"""The OpenAI Python client's error answers as kinbox brain failures, for the brains whose
model calls go through it: the OpenAI Agents SDK's (``openai_agents_brain``) and
autogen-ext's OpenAI clients (``autogen_brain``). ``openai`` is imported here only; the
status rule itself is :func:`.http_failure.model_http_failure`.

``AuthenticationError`` (401), ``PermissionDeniedError`` (403), ``BadRequestError``
(400), ``NotFoundError`` (404) and ``UnprocessableEntityError`` (422) are
:class:`~.errors.PermanentFailure`; ``RateLimitError`` (429) and a 5xx with a
``retry-after-ms`` or ``Retry-After`` header are :class:`~.errors.RetryLater` for that
wait. The client's own retries (``max_retries``) have run by then.
"""

from __future__ import annotations

from openai import APIStatusError

from .errors import PermanentFailure, RetryLater
from .http_failure import headers_retry_after, model_http_failure


def openai_failure(error: BaseException, now: float) -> PermanentFailure | RetryLater | None:
    """The brain failure ``error`` is when it is an OpenAI API status error (else None);
    ``now``: the clock an HTTP-date ``Retry-After`` is measured from."""
    if not isinstance(error, APIStatusError):
        return None
    wait = headers_retry_after(error.response.headers, now)
    return model_http_failure(error.status_code, wait, "the OpenAI API")
