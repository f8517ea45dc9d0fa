"""The HTTP API: FastAPI over the store and the search pipeline.

Every route authorizes first (`principal` dependency), then checks its scope; a body
that fails to parse or validate is judged after the key too (`_invalid`).
Every error leaves through `error_response()`, so clients see one shape. What a request
may carry (body models, list cursors) is `relay.api_requests`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Scope

from relay import __version__, auth, hygiene, writes
from relay.api_requests import (
    CURSOR_HELP,
    ORDER_HELP,
    PREFIX_HELP,
    TEXT_HELP,
    KeyBody,
    MemoryBatch,
    MemoryBody,
    MemoryPatch,
    QueryInt,
    SearchBody,
    check_query,
    decode_cursor,
    decode_position,
    encode_cursor,
    encode_position,
    validation_message,
)
from relay.embedding import Embedder
from relay.errors import (
    InvalidRequestError,
    NotFoundError,
    RelayError,
)
from relay.guard import BODY_TIMEOUT_S, GuardMiddleware
from relay.metrics import Metrics
from relay.models import Principal
from relay.search import Searcher, SearchSettings
from relay.store import Store, connect_by
from relay.store.listing import ListFilter

log = logging.getLogger("relay.server")

HEALTH_WAIT_S = 1.0  # /healthz fails after this long without a database connection

_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    422: "invalid_request",
}


def error_response(exc: Exception) -> Response:
    """The single place an exception becomes an HTTP error body. An error whose message
    the client is not told (a database's own words) is logged here instead, and no message
    holds a key's secret (`auth.withhold_secrets`)."""
    if isinstance(exc, RelayError):
        body, status = exc.to_dict(), exc.status
        exc.log_if_withheld(log)
    elif isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        code = _HTTP_CODES.get(status, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail), "status": status}}
    else:
        status = 500
        body = {"error": {"code": "internal", "message": "internal server error", "status": 500}}
    headers = dict(exc.headers or {}) if isinstance(exc, StarletteHTTPException) else {}
    if status == 503:
        headers["Retry-After"] = "1"
    if status == 401:  # RFC 9110: a 401 names the scheme it wants
        headers["WWW-Authenticate"] = 'Bearer realm="relay"'
    # An id or path echoed back may be a whole key pasted where an id goes: no secret in it
    # (what a key is made of needs no JSON escaping, so the text is cut as it is sent).
    content = auth.withhold_secrets(json.dumps(body, ensure_ascii=False, separators=(",", ":")))
    return Response(content, status, headers or None, media_type="application/json")


@dataclass
class Services:
    store: Store
    searcher: Searcher
    embedder: Embedder
    metrics: Metrics


def build_services(conf: dict[str, Any]) -> Services:
    """Open the store, load the embedding model and wire the search pipeline for `conf`."""
    from relay.cache import ResultCache
    from relay.embedding import load_embedder
    from relay.store import open_store

    store = open_store(conf["db"])
    embedder = load_embedder(conf["embedder"], conf["embed_threads"])
    cache = ResultCache(conf["cache_entries"]) if conf["cache_entries"] > 0 else None
    # A large org's first search would otherwise wait on loading its vectors.
    threading.Thread(target=_warm, args=(store, embedder), name="relay-warm", daemon=True).start()
    settings = SearchSettings()
    if conf.get("threshold") is not None:
        settings = dataclasses.replace(settings, threshold=conf["threshold"])
    return Services(store, Searcher(store, embedder, settings, cache), embedder, Metrics())


def _warm(store: Store, embedder: Embedder) -> None:
    try:
        store.warm()
    except Exception:  # a warm-up is an optimisation: searches load what they need anyway
        log.warning("warming the store failed", exc_info=True)
    done = 0
    try:
        for n in writes.backfill_tokens(store, embedder):
            done += n
            log.info("token matrices: %d stored passages backfilled so far", done)
        if done:
            log.info("token matrices: backfill complete, %d passages", done)
    except Exception:  # until it succeeds, those queries fall back to rank fusion and cosine
        log.warning("backfilling token matrices failed after %d passages", done, exc_info=True)
    try:  # after the backfill, which caches the matrices of texts passages hold
        if gone := store.forget_unheld_embeddings():
            log.info("embedding cache: %d entries of texts no passage holds dropped", gone)
    except Exception:
        log.warning("dropping unheld cached embeddings failed", exc_info=True)


def _principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """Authorize first, before any route or cache lookup runs."""
    return auth.authorize(request.app.state.services.store, authorization)


Auth = Annotated[Principal, Depends(_principal)]


def _search_principal(
    request: Request, body: SearchBody, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """Authorize a search within its deadline: while the database is away, the key lookup
    must not wait longer than the search itself may. The search gets what is left."""
    request.state.deadline = time.monotonic() + body.deadline_ms / 1000
    with connect_by(request.state.deadline):
        return _principal(request, authorization)


SearchAuth = Annotated[Principal, Depends(_search_principal)]


def _authorize_within(request: Request, seconds: float) -> Principal:
    """The key check for a request whose body was refused (so no deadline was read): it
    must not wait on a database that is away longer than /healthz would."""
    with connect_by(time.monotonic() + seconds):
        return _principal(request, request.headers.get("authorization"))


def read_memory(store: Store, p: Principal, memory_id: str) -> dict[str, Any]:
    """A memory as `p` reads it (GET /v1/memories/{id}, and the `/mcp` tools)."""
    auth.require(p, "memory:read")
    writes.check_memory_id(memory_id)
    return store.get_memory(p.org_id, memory_id, auth.management_view(p)).to_dict()


def revisions(store: Store, p: Principal, memory_id: str) -> dict[str, Any]:
    """A memory's revisions as `p` reads them, and the memory that supersedes it (when `p`
    may read that one; None when deleted): the history alone never said a fact was replaced,
    so an agent reading it took a superseded memory for current."""
    auth.require(p, "memory:read")
    writes.check_memory_id(memory_id)
    view = auth.management_view(p)
    items = store.history(p.org_id, memory_id, view)
    try:
        superseded_by = store.get_memory(p.org_id, memory_id, view).superseded_by
    except NotFoundError:  # deleted: its tombstone says so, and it supersedes nothing now
        superseded_by = None
    return {"items": [r.to_dict() for r in items], "superseded_by": superseded_by}


def _batch_item(exc: RelayError, i: int) -> RelayError:
    """A refusal of a batch's item `i`: named `items.i` in the message, and in `details.item`
    for a client to find it without reading the message."""
    exc.message = f"items.{i}: {exc.message}"
    exc.details["item"] = i
    return exc


_UNPARSED_BODY = "There was an error parsing the body"  # FastAPI's words for its 400
_UNREADABLE = {
    UnicodeDecodeError: "it is not UTF-8",
    RecursionError: "it is nested too deeply",
}


def create_app(services: Services) -> FastAPI:
    store, searcher, metrics = services.store, services.searcher, services.metrics
    app = FastAPI(
        title="Relay",
        version=__version__,
        # `/v1/memories/` is not `/v1/memories`: a 404 in the error shape, never a redirect
        # with an empty body (whose Location would name http behind a TLS proxy).
        redirect_slashes=False,
        # /docs is relay.docs_page: FastAPI's pages load unpinned scripts from a CDN.
        docs_url=None,
        redoc_url=None,
        description=(
            "Team memory for coding agents. Errors: {'error': {'code', 'message', 'status'}}."
        ),
    )
    app.state.services = services

    for exc_type in (RelayError, Exception):
        app.add_exception_handler(exc_type, lambda _r, e: error_response(e))  # type: ignore[arg-type]

    async def _refused_body(request: Request, message: str) -> Response:
        # FastAPI parses and validates a body before any dependency runs, so a bad body
        # would tell an unauthenticated caller 422 before its key was looked at.
        if request.url.path.startswith("/v1/"):
            try:
                await run_in_threadpool(_authorize_within, request, HEALTH_WAIT_S)
            except RelayError as denied:
                return error_response(denied)
        err = InvalidRequestError(message)
        err.status = 422
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return await _refused_body(
            request, validation_message(exc.errors()[0] if exc.errors() else {})
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == _UNPARSED_BODY:
            # A body FastAPI could not even decode: said like every other unreadable body.
            why = _UNREADABLE.get(type(exc.__cause__), "it cannot be parsed")
            return await _refused_body(request, f"the body is not valid JSON ({why})")
        return error_response(exc)

    @app.middleware("http")
    async def _measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        metrics.observe_request(
            _route_label(app, request.scope),
            request.method,
            response.status_code,
            time.perf_counter() - start,
        )
        return response

    @app.get("/healthz", tags=["operations"])
    def healthz() -> dict[str, Any]:
        with connect_by(time.monotonic() + HEALTH_WAIT_S):
            store.generation("")  # a cheap query: proves the database answers
        return {"status": "ok", "version": __version__}

    # Load balancers probe with HEAD too; one operation in the description is enough.
    app.add_api_route("/healthz", healthz, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", tags=["operations"], response_class=Response)
    def metrics_endpoint() -> Response:
        metrics.cache_entries.set(len(searcher.cache) if searcher.cache is not None else 0)
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/whoami", tags=["keys"])
    def whoami(p: Auth) -> dict[str, Any]:
        org = store.get_org(p.org_id)
        key = store.key_for_auth(p.key_id)
        return {
            "org": {"id": org.id, "name": org.name},
            "key": key[0].to_dict() if key else {"id": p.key_id},
        }

    @app.post("/v1/search", tags=["search"])
    def search(body: SearchBody, p: SearchAuth, request: Request) -> dict[str, Any]:
        auth.require(p, "memory:read")
        response = searcher.search(
            p,
            check_query(body.query),
            body.k,
            body.deadline_ms,
            body.mode,  # type: ignore[arg-type]
            until=request.state.deadline,  # the key check already spent some of it
        )
        metrics.observe_search(response)
        return response.to_dict()

    @app.get("/v1/profile", tags=["search"])
    def profile(p: Auth) -> dict[str, Any]:
        auth.require(p, "memory:read")
        items = store.pinned(p.org_id, p.audiences, datetime.now(UTC))
        return {
            "results": [
                {
                    "id": m.id,
                    "revision": m.revision,
                    "title": m.title,
                    "source": m.source,
                    "text": m.body,
                    "score": 1.0,
                    "updated_at": m.to_dict()["updated_at"],
                    "passage": 0,
                }
                for m in items
            ]
        }

    @app.post("/v1/memories", status_code=201, tags=["memories"])
    def create_memory(body: MemoryBody, p: Auth) -> dict[str, Any]:
        auth.require(p, "memory:write")
        memory = writes.create(store, services.embedder, p, body.model_dump(), body.id)
        return writes.write_answer(p, memory)

    @app.post("/v1/memories/batch", tags=["memories"])
    def upsert_memories(body: MemoryBatch, p: Auth) -> dict[str, Any]:
        """Create or update many memories at once (imports): every item is checked first,
        then all are written in one transaction; an unchanged item makes no new revision."""
        auth.require(p, "memory:write")
        items = []
        known = store.known_audiences(p.org_id)
        first: dict[str, int] = {}
        for i, item in enumerate(body.items):
            if not item.id:
                raise InvalidRequestError(f"items.{i}.id: a batch item needs an id", item=i)
            # Judged whole first: a secret-shaped id is refused before a message repeats it.
            # Its audiences are judged by the store, against `known` and the memory's own
            # (which it reads there): a memory whose role's last key is gone may still be
            # imported or restored as it is, as `relay edit` may change it.
            try:
                # An expired memory's own valid_until, sent back as it is, is kept: judged
                # by the store against the memory (`rules.settle_expiry`).
                draft = writes.draft_from_fields(item.model_dump(), past_expiry=True)
            except RelayError as exc:
                raise _batch_item(exc, i) from None
            if item.id in first:  # the last would win silently, and count as written twice
                raise InvalidRequestError(
                    f"items.{i}: id {item.id!r} is also items.{first[item.id]}",
                    field=f"items.{i}.id",
                    item=i,
                )
            first[item.id] = i
            items.append((item.id, draft))
        expected = {
            item.id: item.expected_revision
            for item in body.items
            if item.id and item.expected_revision is not None
        }
        try:
            written, unchanged = writes.save_many(
                store,
                services.embedder,
                p.org_id,
                items,
                p.key_id,
                "upsert",
                batch=len(items),
                audiences=auth.management_view(p),
                expected=expected,
                known=known,
            )
        except RelayError as exc:
            if exc.item is not None:  # refused by the store's write rules, named the same way
                raise _batch_item(exc, exc.item) from None
            raise
        return writes.batch_answer(p, items, written, unchanged)

    @app.get("/v1/memories", tags=["memories"])
    def list_memories(
        p: Auth,
        limit: Annotated[QueryInt, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(description=CURSOR_HELP)] = None,
        source: Annotated[str | None, Query(description="Exactly this source.")] = None,
        tag: str | None = None,
        source_prefix: Annotated[str | None, Query(description=PREFIX_HELP)] = None,
        q: Annotated[str | None, Query(description=TEXT_HELP)] = None,
        order: Annotated[str, Query(pattern="^(updated|id)$", description=ORDER_HELP)] = "id",
    ) -> dict[str, Any]:
        """The memories this key may manage, a page at a time: by id (the default, as before
        `order` existed), or newest change first with `order=updated`."""
        auth.require(p, "memory:read")
        filters = (("source", source), ("tag", tag), ("source_prefix", source_prefix), ("q", q))
        for name, value in filters:
            hygiene.check_filter(name, value)
        where = ListFilter(source=source, tag=tag, source_prefix=source_prefix, text=q)
        items, last = store.list_memories(
            p.org_id, auth.management_view(p), limit, decode_position(cursor, order), where, order
        )
        return {"items": [m.to_dict() for m in items], "next_cursor": encode_position(last)}

    @app.get("/v1/tombstones/count", tags=["memories"])
    def count_tombstones(
        p: Auth, source: str | None = None, source_prefix: str | None = None
    ) -> dict[str, int]:
        auth.require(p, "memory:read")
        for name, value in (("source", source), ("source_prefix", source_prefix)):
            hygiene.check_filter(name, value)
        audiences = auth.management_view(p)
        return {"count": store.deleted_count(p.org_id, audiences, source, source_prefix)}

    @app.get("/v1/memories/{memory_id}", tags=["memories"])
    def get_memory(memory_id: str, p: Auth) -> dict[str, Any]:
        return read_memory(store, p, memory_id)

    @app.patch("/v1/memories/{memory_id}", tags=["memories"])
    def edit_memory(memory_id: str, body: MemoryPatch, p: Auth) -> dict[str, Any]:
        auth.require_edit(p)
        writes.check_memory_id(memory_id)
        changes = body.model_dump(exclude_unset=True, exclude={"expected_revision"})
        memory = writes.edit(
            store, services.embedder, p, memory_id, changes, body.expected_revision
        )
        return writes.write_answer(p, memory)

    @app.delete("/v1/memories/{memory_id}", status_code=204, tags=["memories"])
    def delete_memory(
        memory_id: str,
        p: Auth,
        expected_revision: Annotated[
            QueryInt | None,
            Query(
                ge=1,
                description="The revision the caller read the memory at: when it is at"
                " another (an edit landed since), nothing is deleted and the answer is 409"
                " `conflict` with the revision it is at (`details.revision`).",
            ),
        ] = None,
    ) -> Response:
        auth.require(p, "memory:write")
        writes.check_memory_id(memory_id)
        store.delete_memory(
            p.org_id, memory_id, p.key_id, auth.management_view(p), expected_revision
        )
        return Response(status_code=204)

    @app.get("/v1/memories/{memory_id}/revisions", tags=["memories"])
    def memory_revisions(memory_id: str, p: Auth) -> dict[str, Any]:
        return revisions(store, p, memory_id)

    @app.post("/v1/keys", status_code=201, tags=["keys"])
    def create_key(body: KeyBody, p: Auth) -> dict[str, Any]:
        auth.require(p, "admin")
        minted = auth.mint_key(
            store,
            p.org_id,
            body.name,
            frozenset(body.scopes),
            frozenset(body.roles),
            body.expires_at,
        )
        return {**minted.key.to_dict(), "secret": minted.secret}

    @app.get("/v1/keys", tags=["keys"])
    def list_keys(
        p: Auth, limit: Annotated[QueryInt, Query(ge=1, le=500)] = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        auth.require(p, "admin")
        after = decode_cursor(cursor)
        found = None if after is None else store.key_for_auth(after)
        if after is not None and (found is None or found[0].org_id != p.org_id):
            # Keys are never deleted: a cursor naming none of this org's was not handed out.
            raise InvalidRequestError(
                "cursor is not one this listing handed out: send next_cursor back as it came,"
                " or leave cursor out to list from the beginning",
                field="cursor",
            )
        keys = store.list_keys(p.org_id, limit + 1, after)
        more = len(keys) > limit
        return {
            "items": [k.to_dict() for k in keys[:limit]],
            "next_cursor": encode_cursor(keys[limit - 1].id if more else None),
        }

    @app.delete("/v1/keys/{key_id}", tags=["keys"])
    def revoke_key(key_id: str, p: Auth) -> dict[str, Any]:
        auth.require(p, "admin")
        return store.revoke_key(p.org_id, auth.check_key_id(key_id)).to_dict()

    from relay.mcp_server import mount_mcp

    mount_mcp(app, services)  # MCP over streamable HTTP at /mcp, same keys as the API
    from relay.console import mount_console

    mount_console(app, services)  # the team console at /console (relay/console/)
    from relay.docs_page import mount_docs

    mount_docs(app)  # Swagger UI at /docs, its script pinned by hash
    app.openapi = _openapi_with_error_shape(app)  # type: ignore[method-assign]
    return app


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "status"],
            "properties": {
                "code": {"type": "string", "description": "stable, machine-readable"},
                "message": {"type": "string"},
                "status": {"type": "integer"},
            },
        }
    },
}


BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "A Relay API key (`relay_...`), as `Authorization: Bearer relay_...`",
}


def _bearer_security(operation: dict[str, Any]) -> None:
    """An operation that reads the `Authorization` header declares the bearer scheme in its
    place, so clients and generators see how to authenticate, not a free-form header."""
    parameters = operation.get("parameters", [])
    kept = [p for p in parameters if not (p.get("in") == "header" and p["name"] == "authorization")]
    if len(kept) == len(parameters):
        return
    operation["security"] = [{"bearerKey": []}]
    if kept:
        operation["parameters"] = kept
    else:
        operation.pop("parameters", None)


def _route_label(app: FastAPI, scope: Scope) -> str:
    """The route's path template for metrics labels: API routes record themselves in the
    scope; the framework's own pages (/openapi.json, /docs) do not, so they are matched
    here. Anything else (a 404) is `unmatched`: one label, whatever the path."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in app.router.routes if r.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path", "unmatched")


def _openapi_with_error_shape(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The framework's description, with the one error shape every endpoint really answers
    with in place of the validation-error schema it assumes (which no response carries), and
    the bearer key scheme in place of a free-form `Authorization` header."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = build()  # cached on the app: edited in place, once
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["Error"] = ERROR_SCHEMA
        error = {
            "description": "Error: {'error': {'code', 'message', 'status'}}",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        schemes = spec["components"].setdefault("securitySchemes", {})
        schemes["bearerKey"] = BEARER_SCHEME
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                responses["4XX"] = responses["5XX"] = error
                _bearer_security(operation)
        return spec

    return openapi


def asgi_app(
    services: Services,
    max_inflight: int = 64,
    max_body_bytes: int = 262_144,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> ASGIApp:
    """The app behind its guard (load shedding, body cap and deadline): what `relay serve` runs."""
    app = create_app(services)

    def observe(scope: Scope, status: int, seconds: float) -> None:
        route = _route_label(app, scope)
        services.metrics.observe_request(route, scope["method"], status, seconds)

    return GuardMiddleware(app, max_inflight, max_body_bytes, body_timeout_s, observe)
