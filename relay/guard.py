"""The guard in front of every route: load shedding, the body cap, and the body's deadline.

A request holds one of `max_inflight` slots only while the app works on it. Before
that, a request to a route whose only credential is the `Authorization` header is
refused 401 at once when it has none (or more than one), and every body is read here,
capped in size and in time. So a client with no key, or one that stalls its body, never
holds a slot: 70 connections each sending one byte of a promised 1,000 made every
request, /healthz included, 503 for as long as they stalled (uvicorn bounds no body's
time).

A request whose body is framed two ways (both Content-Length and Transfer-Encoding) is
refused 400 and its connection closed, as RFC 9112 6.1 asks, before anything else.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from relay import auth
from relay.errors import (
    InvalidRequestError,
    OverloadedError,
    RelayError,
    RequestTimeoutError,
    TooLargeError,
    UnauthorizedError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    # Told of each request the guard answers itself: (scope, status, seconds taken).
    Observe = Callable[[Scope, int, float], None]

log = logging.getLogger("relay.server")

BODY_TIMEOUT_S = 10  # `relay serve --body-timeout`: 256 KiB, the default body cap, at 26 KB/s


def _keyed(path: str) -> bool:
    """A route that takes no credential but the bearer header: the API and MCP. The
    console signs in with a key in its body, then a cookie; /healthz, /metrics and the
    API's description take none."""
    return path.startswith("/v1/") or path == "/mcp"


class GuardMiddleware:
    """Sheds load past `max_inflight` with a fast 503; caps request bodies in size and time."""

    def __init__(
        self,
        app: ASGIApp,
        max_inflight: int,
        max_body_bytes: int,
        body_timeout_s: float = BODY_TIMEOUT_S,
        observe: Observe | None = None,
    ) -> None:
        self.app = app
        self.max_inflight = max_inflight
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        # The app measures what it answers; what the guard refuses never reaches it, so
        # probing without a key or stalling bodies would not show in /metrics otherwise.
        self.observe = observe
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            self._check_head(scope)
            body = await self._read_body(receive)
            self._check_busy()  # again: reading the body took time
        except RelayError as refused:
            from relay.server import error_response

            response = error_response(refused)
            if refused.status != 503:  # the body may be unread: nothing else can follow it
                response.headers["Connection"] = "close"
            try:
                await response(scope, receive, send)
            finally:  # counted even when the client left while it was told (slow clients do)
                self._observe(scope, refused.status, time.perf_counter() - start)
            return
        self.inflight += 1
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.inflight -= 1

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        """Count a refusal in /metrics; a failure to count is logged, never the answer's."""
        if self.observe is None:
            return
        try:
            self.observe(scope, status, seconds)
        except Exception:  # noqa: BLE001 - the refusal was sent; metrics must not turn it into an error
            log.exception("could not count a refused request in /metrics")

    def _check_head(self, scope: Scope) -> None:
        """What the request line and headers already decide, before any body is read."""
        headers = dict(scope.get("headers") or [])
        if b"transfer-encoding" in headers and b"content-length" in headers:
            # h11 reads such a body as chunked and kept the connection open, so a proxy in
            # front that went by the length would pass a second request hidden in the body
            # (smuggling). RFC 9112 6.1: refuse it and close (every refusal here but a 503
            # closes), before the key or the load is looked at.
            raise InvalidRequestError(
                "the request has both Content-Length and Transfer-Encoding, which frame its "
                "body two ways; send one"
            )
        if _keyed(scope["path"]) and b"authorization" not in headers:
            # The route would answer 401 whatever the body says: no reason to wait for it.
            raise UnauthorizedError(auth.MISSING_KEY)
        keys = sum(name == b"authorization" for name, _ in scope.get("headers") or [])
        if _keyed(scope["path"]) and keys > 1:
            # Two keys name two principals: the API took the first header and /mcp the last,
            # so one request was two different keys' depending on the route (and on which
            # header a proxy in front added). RFC 9110 11.6.2 allows one; none is chosen.
            raise UnauthorizedError(
                f"the request has {keys} Authorization headers; send one key, as 'Bearer <key>'"
            )
        self._check_busy()
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise TooLargeError("request body too large")

    def _check_busy(self) -> None:
        if self.inflight >= self.max_inflight:
            raise OverloadedError("server busy; retry shortly")

    async def _read_body(self, receive: Receive) -> list[Message]:
        """The request's body messages, all of them (chunked or not): past `max_body_bytes`
        a 413, whatever the length said (the framework made a 400 of it while parsing);
        not all there within `body_timeout_s` a 408."""
        messages: list[Message] = []
        seen = 0
        with anyio.move_on_after(self.body_timeout_s):
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":  # the client went away
                    return messages
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise TooLargeError("request body too large")
                if not message.get("more_body"):
                    return messages
        raise RequestTimeoutError(
            f"the request body did not arrive within {self.body_timeout_s:g} s"
        )


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out `messages` first, then the connection's own."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
