"""What the boundary fuzz tests share: a runtime served twice on 127.0.0.1 (without and
with an operator token), a raw HTTP client, and the witnesses of "nothing changed": every
table's rows and every file beside the database.

Rows are read through a connection of their own (read-only on a SQLite file, autocommit
on PostgreSQL), every row of every table (a refused request must not change, add or
remove one); files are every path under the test's folder but a SQLite database's own,
with size and mtime.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinbox.actors import ManualClock, Runtime
from kinbox.actors.serve import app_for
from kinbox.transport import OperatorToken

from .helpers import quiet_brain
from .test_http import Served

TOKEN = "op-token-7f3a9c1e5b"
SECRET = b"webhook-secret-4d2e8a"
SECRETS = (TOKEN.encode(), SECRET)
"""Neither may appear in any answer."""
MESSAGE_LIMIT = 400
"""Characters an error's message may have: it says what is wrong, quoting at most a
little of what was sent."""
ERROR_CODE = re.compile(r"[a-z_]{2,40}")


class Changes:
    """Every row of every table and every file beside the database, as of a moment."""

    def __init__(self, folder: Path, db_url: str) -> None:
        self.folder = folder
        self.sqlite = db_url.startswith("sqlite:///")
        self.db_file = Path(db_url.removeprefix("sqlite:///")) if self.sqlite else None
        if self.db_file is not None:
            self.conn: Any = sqlite3.connect(
                f"file:{self.db_file}?mode=ro", uri=True, check_same_thread=False
            )
            self.tables_sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        else:
            import psycopg2

            self.conn = psycopg2.connect(db_url)
            self.conn.autocommit = True
            self.tables_sql = (
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )

    def _all(self, sql: str) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        try:
            cur.execute(sql)
            return list(cur.fetchall())
        finally:
            cur.close()

    def rows(self) -> dict[str, tuple[int, str]]:
        """Per table: how many rows, and a digest of all of them."""
        out = {}
        for (table,) in self._all(self.tables_sql):
            rows = sorted(repr(r) for r in self._all(f'SELECT * FROM "{table}"'))
            out[table] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
        return out

    def files(self) -> dict[str, tuple[int, int]]:
        """Every file under the folder but a SQLite database's own: (size, mtime_ns)."""
        own = self.db_file.name if self.db_file is not None else None
        return {
            str(p.relative_to(self.folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.folder.rglob("*")
            if p.is_file() and not (own and p.name.startswith(own))
        }

    def snapshot(self) -> tuple[dict[str, tuple[int, str]], dict[str, tuple[int, int]]]:
        return self.rows(), self.files()

    def close(self) -> None:
        self.conn.close()


class LogWatch(logging.Handler):
    """What kinbox logged at INFO and above, formatted (a body or a secret may appear only
    at DEBUG)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.logger = logging.getLogger("kinbox")
        self.level_before = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def __enter__(self) -> LogWatch:
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)

    def holds(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


class ServerErrors(logging.Handler):
    """The server's ERROR records while it is entered: "Exception in ASGI application"
    is an exception that escaped a handler, whatever the client saw."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []
        self.logger = logging.getLogger("uvicorn.error")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> ServerErrors:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


@dataclass
class Fuzzed:
    """One runtime, its app served without a token (``open``) and with one (``tokened``)."""

    rt: Runtime
    open: Served
    tokened: Served
    changes: Changes
    logs: LogWatch
    token_clock: ManualClock
    """Times both apps' lock-outs of a client that keeps presenting wrong tokens (to
    ``tokened``'s API) or failing peer handshakes."""

    def settle(self) -> None:
        """Wait until what an accepted request started (a social turn, a cron run) ended,
        so that the next snapshot is not taken while it still writes."""
        assert self.rt.social.wait_idle(10) and self.rt.cron.wait_idle(10)
        self.rt.run_until_idle(timeout=10)


@contextmanager
def serving(make_runtime: Any, tmp_path: Path, db_url: str) -> Iterator[Fuzzed]:
    """A runtime on ``db_url`` (a SQLite file under ``tmp_path``, or PostgreSQL), served
    twice; for a test module's ``fuzzed`` fixture."""
    rt = make_runtime(db=db_url, brain=quiet_brain, data_dir=tmp_path / "data")
    rt.social.register_channel("slack", send=lambda route, text: None, secret=SECRET)
    rt.social.allow("slack", ["U1"])
    token_clock = ManualClock()
    open_srv = Served(app_for(rt, clock=token_clock.now))
    tokened = Served(app_for(rt, operator=OperatorToken.from_secret(TOKEN), clock=token_clock.now))
    changes = Changes(tmp_path, db_url)
    try:
        with LogWatch() as logs, ServerErrors() as errors:
            yield Fuzzed(rt, open_srv, tokened, changes, logs, token_clock)
            for secret in (TOKEN, SECRET.decode()):
                assert not logs.holds(secret)
            assert errors.lines == []  # no exception escaped a handler
    finally:
        changes.close()
        tokened.close()
        open_srv.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.raw)


def call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    chunked: bool = False,
) -> Answer:
    """One request on a connection of its own; ``chunked`` sends the body in 8 KiB chunks
    without a ``Content-Length``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        if chunked and body is not None:
            data = body
            conn.request(
                method,
                path,
                body=iter(data[i : i + 8192] for i in range(0, len(data), 8192)),
                headers=headers or {},
                encode_chunked=True,
            )
        else:
            conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def check_answer(method: str, answer: Answer) -> dict[str, Any] | None:
    """The properties every answer has; the error body when it is a refusal."""
    assert answer.status < 500, (answer.status, answer.raw[:300])
    for secret in SECRETS:
        assert secret not in answer.raw
    if method == "HEAD":  # an answer to HEAD has no body
        return None
    assert answer.headers.get("content-type", "").startswith("application/json"), answer
    body = answer.json()
    if answer.status < 400:
        return None
    # "field" names the request's field a refusal is of (a cron job's), when it is of one
    assert isinstance(body, dict) and set(body) - {"field"} == {"error", "message"}, body
    assert isinstance(body.get("field", ""), str), body
    assert ERROR_CODE.fullmatch(body["error"]), body
    assert isinstance(body["message"], str) and len(body["message"]) <= MESSAGE_LIMIT, (
        len(body["message"]),
        body["message"][:200],
    )
    return body
