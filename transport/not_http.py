"""The answer to a request h11 cannot parse: a JSON 400, as the API answers everything.

uvicorn answers a request line, a header or a body framing that h11 refuses (a
``Content-Length`` that is no number, a path in raw UTF-8, a chunk size that is not hex)
with a plain-text ``Invalid HTTP request received.``, the one answer of the API a client
reading ``error`` from its JSON could not read. And when the refused part is a body, the
request's route is already running: a route that answers before it reads the body (a
403, a 404) then sent its answer on a connection that had given its own, and a HEAD
request's 400 carried a body a HEAD answer may not have; uvicorn logged an ERROR
traceback for each, any client's at will. :class:`NotHttpAnswered` answers ``400
{"error": "bad_request"}`` (no body to a HEAD), ends the running route's connection as a
client that went away would (its sends are dropped, its reads say the client left) and
closes the connection.
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

NOT_HTTP = (
    b'{"error": "bad_request", "message": "the request is not valid HTTP/1.1: its line, '
    b'a header or its body framing is malformed"}'
)
"""The body of the answer to a request h11 cannot parse."""


class NotHttpAnswered(H11Protocol):
    """uvicorn's h11 protocol, answering a request it cannot parse in JSON."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 refused (``msg`` is its fixed text, logged by it)."""
        cycle = self.cycle  # the request whose body was refused, if its route runs
        running = cycle is not None and not cycle.response_complete
        if cycle is not None and running:
            # As a client gone would: its route's sends are dropped, its reads end.
            cycle.disconnected = True
            cycle.message_event.set()
        if not (cycle is not None and running and cycle.response_started):
            head_only = cycle is not None and running and cycle.scope["method"] == "HEAD"
            headers = [
                (b"content-type", b"application/json"),
                (b"connection", b"close"),
                (b"content-length", str(len(NOT_HTTP)).encode()),
            ]
            answer = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            self.transport.write(self.conn.send(answer))
            if not head_only:
                self.transport.write(self.conn.send(h11.Data(data=NOT_HTTP)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()
