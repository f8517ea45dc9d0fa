"""`relay mcp`'s stdio transport: the `mcp` SDK's, with an answer to every line it drops.

The SDK's stdio server hands a line it cannot read (not JSON, or JSON holding a lone
surrogate such as `"\\ud800"`, which its parser refuses) to the session as an exception,
and the session only logs it: the client waits for an answer until its own timeout
(modelcontextprotocol/python-sdk#2751). Over HTTP the same line gets -32700. Here each such
line is answered on the spot with a JSON-RPC 2.0 error: -32700 Parse error (id null, as the
spec has it, unless a lone surrogate was all that stood in the way of reading the id), or
-32600 Invalid Request for JSON that is no JSON-RPC message. A line the SDK reads is passed
on unchanged, and so is a malformed response, which JSON-RPC never answers.

At the end of stdin (a client that pipes its requests, then closes) the SDK cancels the
requests still running: their writes happened, their answers never came. Here the end is
held back until every request passed on is answered (or cancelled by the client, which
JSON-RPC never answers), so each request read gets its answer before `relay mcp` exits.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from io import TextIOWrapper
from typing import TYPE_CHECKING, BinaryIO, cast

from relay.hook.codec import no_constant
from relay.hygiene import surrogate_in

if TYPE_CHECKING:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.shared._stream_protocols import WriteStream
    from mcp.shared.message import SessionMessage
    from mcp_types import JSONRPCError

# How long stdin's end waits for answers still owed: past any tool call's own HTTP timeouts,
# so it only ends a wait for an answer the SDK never sends.
OWED_ANSWERS_WAIT_S = 120.0


def _request_id(doc: object) -> str | int | None:
    """The id of a request as JSON-RPC reads it (a string or a whole number); else None."""
    ident = doc.get("id") if isinstance(doc, dict) else None
    if isinstance(ident, str) and surrogate_in(ident, "id"):
        return None  # echoed back, an id no encoder takes killed the server: null, as unread
    return ident if isinstance(ident, str | int) and not isinstance(ident, bool) else None


def answer_to(line: str) -> JSONRPCError | None:
    """The error a line gets in place of the SDK's silence; None when the SDK reads it (or it
    is blank, or a response, which nothing answers): then it is passed on as it came."""
    from mcp_types import (
        INVALID_REQUEST,
        PARSE_ERROR,
        ErrorData,
        JSONRPCError,
        JSONRPCNotification,
        jsonrpc_message_adapter,
    )
    from pydantic import ValidationError

    if not line.strip():
        return None
    try:
        read = jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError:
        pass
    else:
        if not isinstance(read, JSONRPCNotification) or not _has_id(line):
            return None
        # An id that is no string or whole number (true, 1.0, null): the SDK reads the
        # request as a notification and never answers it, so the client would wait for ever.
        return JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=ErrorData(
                code=INVALID_REQUEST,
                message="Invalid Request: a request's id is a string or a whole number",
            ),
        )
    try:
        doc = json.loads(line, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message=f"Parse error: {why}")
        )
    if isinstance(doc, dict) and "method" not in doc and ("result" in doc or "error" in doc):
        return None
    surrogate = surrogate_in(doc, "the message")
    if surrogate is not None:
        where, text = surrogate[0] or "the message", surrogate[1]
        where = where if len(where) <= 60 else where[:57] + "..."
        half = next(ch for ch in text if "\ud800" <= ch <= "\udfff")
        message = (
            f"Parse error: {where} holds a lone surrogate, \\u{ord(half):04x}: half of a UTF-16 "
            "pair, no character, so the message cannot be read as text; send the character "
            "itself, or both halves of its pair"
        )
        return JSONRPCError(
            jsonrpc="2.0",
            id=_request_id(doc) if isinstance(doc, dict) and "method" in doc else None,
            error=ErrorData(code=PARSE_ERROR, message=message),
        )
    return JSONRPCError(
        jsonrpc="2.0",
        id=_request_id(doc),
        error=ErrorData(
            code=INVALID_REQUEST,
            message="Invalid Request: not a JSON-RPC 2.0 request or notification",
        ),
    )


def _has_id(line: str) -> bool:
    """Whether a line that is a JSON-RPC message holds an `id` member at its top."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "id" in doc


def _asked(line: str) -> tuple[str | int | None, str | int | None]:
    """(id, None) for a request the SDK will answer; (None, id) for the client's cancel of
    request id, which it never answers; (None, None) for anything else."""
    from mcp.shared.dispatcher import coerce_request_id

    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict) or not isinstance(doc.get("method"), str):
        return None, None
    if "id" in doc:  # a string or a whole number: answer_to answered any other id
        ident = _request_id(doc)
        return (coerce_request_id(ident) if ident is not None else None), None
    params = doc.get("params")
    cancelled = params.get("requestId") if isinstance(params, dict) else None
    if doc["method"] == "notifications/cancelled" and isinstance(cancelled, str | int):
        return None, coerce_request_id(cancelled)
    return None, None


class AnsweredLines:
    """The stdin the SDK's transport reads: every line it can read, unchanged; the others
    answered here, through the transport's own writer (one writer: no torn lines). Its end
    comes once every request passed on is answered (`Answers` tells of each answer)."""

    def __init__(self, source: BinaryIO) -> None:
        import anyio

        # As the SDK reads stdin: UTF-8, a byte that is not UTF-8 replaced, never a crash.
        self._text = TextIOWrapper(source, encoding="utf-8", errors="replace")
        self._lines = anyio.wrap_file(self._text)
        self._writer: WriteStream[SessionMessage] | None = None
        self._ready = anyio.Event()
        self._owed: Counter[str | int] = Counter()
        self._answered = anyio.Event()

    def answer_through(self, writer: WriteStream[SessionMessage]) -> None:
        self._writer = writer
        self._ready.set()

    def answered(self, ident: str | int) -> None:
        """An answer to request `ident` went out (or is owed no more: the client cancelled)."""
        from mcp.shared.dispatcher import coerce_request_id

        key = coerce_request_id(ident)
        if self._owed[key] > 0:
            self._owed[key] -= 1
            self._answered.set()

    async def __aiter__(self) -> AsyncIterator[str]:
        import anyio
        from mcp.shared.message import SessionMessage

        async for line in self._lines:
            answer = answer_to(line)
            if answer is None:
                request, cancelled = _asked(line)
                if request is not None:
                    self._owed[request] += 1
                if cancelled is not None:
                    self.answered(cancelled)
                yield line
                continue
            await self._ready.wait()  # the writer comes once the transport is up
            assert self._writer is not None
            await self._writer.send(SessionMessage(answer))
        with anyio.move_on_after(OWED_ANSWERS_WAIT_S):
            while +self._owed:
                self._answered = anyio.Event()
                await self._answered.wait()
        if +self._owed:
            logging.getLogger("relay.mcp").warning(
                "stdin ended; no answer came within %.0f s to requests %s",
                OWED_ANSWERS_WAIT_S,
                sorted(map(str, (+self._owed).elements())),
            )

    def detach(self) -> None:
        """Leave stdin open: this wrapper is not its owner (the SDK's does the same)."""
        with contextlib.suppress(ValueError):
            self._text.detach()


class Answers:
    """The write stream the server answers through, telling `lines` of each answer sent."""

    def __init__(self, inner: WriteStream[SessionMessage], lines: AnsweredLines) -> None:
        self._inner = inner
        self._lines = lines

    async def send(self, item: SessionMessage, /) -> None:
        from mcp_types import JSONRPCError, JSONRPCResponse

        await self._inner.send(item)
        message = item.message
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self._lines.answered(message.id)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Answers:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def serve_stdio(server: MCPServer, source: BinaryIO) -> None:
    """Run `server` on stdin and stdout as the SDK's `run_stdio_async` does, reading `source`
    through `AnsweredLines`. The SDK still claims stdout (fd 1 points at stderr meanwhile, so
    stray prints miss the wire); stdin, handed over, is read in place: no tool reads it."""
    from mcp.server.stdio import stdio_server

    lines = AnsweredLines(source)
    try:
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read, write):
            lines.answer_through(write)
            lowlevel = server._lowlevel_server  # what run_stdio_async runs; mcp is pinned <3
            answers = Answers(write, lines)
            await lowlevel.run(read, answers, lowlevel.create_initialization_options())
    finally:
        lines.detach()
