"""Below the app: how long a connection may take to send a request's head, and how many
connections the process may hold.

uvicorn bounds neither the time a request line and headers take to arrive nor an idle
connection that never sends one: 1,100 sockets each holding half a request line took
every file descriptor of a server under the usual limit of 1,024, and it accepted
nothing, /healthz included, for as long as they stayed (`relay.guard` bounds the body,
which comes after). So a connection whose request head has not arrived within the body
timeout is answered 408 and closed, and the process raises its open-files limit to what
the system allows, so that such callers must keep reconnecting fast to matter at all.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("relay.server")

OPEN_FILES_WANTED = 65_536  # when the hard limit is unlimited


def _timed_out(seconds: float) -> bytes:
    message = f"the request head did not arrive within {seconds:g} s"
    error = {"error": {"code": "request_timeout", "message": message, "status": 408}}
    body = json.dumps(error, separators=(",", ":")).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def head_deadline(base: Any, seconds: float) -> Any:
    """uvicorn's HTTP protocol `base` (h11 or httptools: both keep the request in flight as
    `cycle`), with a deadline on each request's head: from the connection's start, and from
    the first byte of each later request on it (uvicorn closes an idle kept-alive one)."""

    class HeadDeadline(base):  # type: ignore[misc, valid-type]
        _head_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._disarm()
            elif self._head_timer is None and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expire(self) -> None:
            self._head_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.write(_timed_out(seconds))
                self.transport.close()

    return HeadDeadline


def raise_open_files_limit() -> None:
    """The soft open-files limit up to the hard one (at most OPEN_FILES_WANTED when that is
    unlimited): each connection holds one, and the soft default is often 1,024."""
    try:
        import resource
    except ImportError:  # not on this platform (Windows): nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:  # macOS caps an unlimited one lower
            log.info("the open-files limit stays at %d (raising it to %d: %s)", soft, wanted, exc)
