"""The console's routes: the page and its assets, a cookie session, a JSON API under /console/api.

Every /console/api route authorizes the session's key exactly as the HTTP API
authorizes a bearer key (`relay.auth.authorize`), on every request, so a revoked
key is signed out at once on every replica. Writes go through the same functions
as the API (`relay.writes.create`, `writes.edit`, the store), with the same request
models, so they fail with the same error codes and messages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import ConfigDict, Field

from relay import auth, hygiene, writes
from relay.api_requests import (
    KeyBody,
    MemoryBody,
    MemoryPatch,
    QueryInt,
    TextBody,
    check_query,
    decode_position,
    encode_position,
)
from relay.console import curate
from relay.console.health import (
    SearchLog,
    most_recalled,
    search_series,
    streak_rows,
)
from relay.errors import ForbiddenError, InvalidRequestError, NotFoundError, UnauthorizedError
from relay.hook import codec, gate, state
from relay.hook import config as hook_config
from relay.hook.client import HookFailure
from relay.hook.pack import (
    MAX_BUDGET_TOKENS,
    MIN_BUDGET_TOKENS,
    PROMPT_INTRO,
    context_room,
    pack,
    tokens,
    validate,
)
from relay.hook.run import QUERY_MAX_CHARS, results_wanted
from relay.hook_stats import OUTCOMES
from relay.models import ApiKey, HookReport, Memory, Principal, iso
from relay.search import MAX_K, SearchResponse
from relay.server import Auth, Services
from relay.store.listing import ListFilter

COOKIE = "relay_console"
CSRF_HEADER = "X-CSRF-Token"
SESSION_MAX_AGE_S = 8 * 3600
STATIC = Path(__file__).parent / "static"
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# What the hook tells the server by default: its budget less start-up and the packing reserve.
HOOK_SERVER_MS = (
    int(hook_config.DEFAULTS["deadline_ms"])  # type: ignore[call-overload]
    - 25
    - int(hook_config.PACK_RESERVE_S * 1000)
)


def csrf_token(key: str) -> str:
    """Bound to the session's key, so no replica needs a shared secret to check it."""
    return hmac.new(key.encode(), b"relay-console-csrf", hashlib.sha256).hexdigest()


def _same_origin(request: Request) -> None:
    """Refuse writes a browser marks as coming from another site (belt to SameSite's braces)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise ForbiddenError("cross-site request refused")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise ForbiddenError("cross-origin request refused")


def _session_principal(request: Request) -> Principal:
    """The signed-in key, authorized now; writes also need the CSRF header and the same origin."""
    token = request.cookies.get(COOKIE)
    if not token:
        raise UnauthorizedError("not signed in to the console")
    principal = auth.authorize(request.app.state.services.store, f"Bearer {token}")
    if request.method not in ("GET", "HEAD"):
        _same_origin(request)
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), csrf_token(token).encode()):
            raise ForbiddenError("missing or wrong CSRF token; reload the console")
    return principal


Session = Annotated[Principal, Depends(_session_principal)]


def _no_store(request: Request, response: Response) -> None:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"


# -- request bodies -------------------------------------------------------------
class _Body(TextBody):
    model_config = ConfigDict(extra="forbid")


class SignIn(_Body):
    key: str = Field(max_length=400)  # an empty one is told by `sign_in`, blank or not


class ConsoleSearch(_Body):
    query: str = Field(min_length=1)  # its size: check_query (413), as on /v1/search
    mode: str = Field("hybrid", pattern="^(hybrid|lexical|semantic)$")
    k: int = Field(10, ge=1, le=MAX_K)


class Preview(_Body):
    prompt: str = Field(max_length=100_000)
    key_id: str | None = Field(None, max_length=64)
    max_records: int = Field(cast(int, hook_config.DEFAULTS["max_records"]), ge=1, le=20)
    max_tokens: int = Field(
        cast(int, hook_config.DEFAULTS["max_tokens"]), ge=MIN_BUDGET_TOKENS, le=MAX_BUDGET_TOKENS
    )
    min_score: float = Field(
        cast(float, hook_config.DEFAULTS.get("min_score", 0.0)), ge=0.0, le=1.0
    )
    deadline_ms: int = Field(HOOK_SERVER_MS, ge=20, le=10_000)


class Streak(TextBody):
    model_config = ConfigDict(extra="ignore", strict=True)
    length: int = Field(0, ge=0, le=10_000_000)
    since: str | None = Field(None, max_length=40)


class HookOutcomes(TextBody):
    """`relay stats --json` as it prints; fields it has that are not listed here are dropped.
    Read strictly, like the API's bodies: `"invocations": "5"` is not 5."""

    model_config = ConfigDict(extra="ignore", strict=True)
    developer: str | None = Field(None, max_length=100)
    since: str | None = Field(None, max_length=40)
    until: str | None = Field(None, max_length=40)
    # Required: a report without them says nothing, and would show as an idle developer.
    invocations: int = Field(ge=0, le=1_000_000_000)
    outcomes: dict[str, int] = Field(max_length=len(OUTCOMES))
    unauthorized_streak: Streak = Streak(length=0, since=None)
    unavailable_streak: Streak = Streak(length=0, since=None)
    hook_ms: dict[str, float] = Field(default_factory=dict, max_length=3)
    breaker: dict[str, Any] | None = None


def _printable(text: str, limit: int) -> str:
    return "".join(ch for ch in text if ch.isprintable())[:limit].strip()


def _key_view(key: ApiKey, now: datetime) -> dict[str, Any]:
    status = "active"
    if key.revoked_at is not None:
        status = "revoked"
    elif key.expires_at is not None and key.expires_at <= now:
        status = "expired"
    return {**key.to_dict(), "status": status}


def build_routers(
    services: Services,
    search_log: SearchLog,
    search: Callable[..., SearchResponse],
) -> list[APIRouter]:
    """The console's routes; `search` is the searcher's unrecorded search (console queries
    are not recall and must not count in recall's health)."""
    store, embedder = services.store, services.embedder
    page = APIRouter(include_in_schema=False)
    api = APIRouter(
        prefix="/console/api", include_in_schema=False, dependencies=[Depends(_no_store)]
    )
    ingest = APIRouter()

    def key_names(p: Principal) -> dict[str, str]:
        return {k.id: k.name for k in store.list_keys(p.org_id)} if "admin" in p.scopes else {}

    def memory_view(m: Any, now: datetime, names: dict[str, str]) -> dict[str, Any]:
        return {
            **m.to_dict(),
            "status": curate.statuses(m, now),
            "author_name": names.get(m.author or ""),
        }

    def written_view(m: Memory, p: Principal) -> dict[str, Any]:
        """A create's or edit's answer: the memory, with the API's `warnings` when the key
        cannot read it any more (`writes.write_answer`)."""
        return {**memory_view(m, datetime.now(UTC), key_names(p)), **writes.write_answer(p, m)}

    # -- the page ---------------------------------------------------------------
    @page.get("/console")
    def console_page() -> Response:
        return Response((STATIC / "index.html").read_bytes(), 200, PAGE_HEADERS, "text/html")

    @page.get("/console/")
    def console_slash() -> Response:
        return RedirectResponse("/console", 308)

    @page.get("/console/static/{name}")
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise NotFoundError(f"no asset {name!r}")
        return Response((STATIC / name).read_bytes(), 200, PAGE_HEADERS, ASSETS[name])

    # -- session ----------------------------------------------------------------
    def session_info(p: Principal, token: str) -> dict[str, Any]:
        org = store.get_org(p.org_id)
        found = store.key_for_auth(p.key_id)
        return {
            "org": {"id": org.id, "name": org.name},
            "key": found[0].to_dict() if found else {"id": p.key_id},
            "csrf_token": csrf_token(token),
            "can": {
                "write": auth_allows(p, "memory:write"),
                "admin": "admin" in p.scopes,
            },
            "audiences": sorted(p.audiences),
            "hook": {
                "max_records": hook_config.DEFAULTS["max_records"],
                "max_tokens": hook_config.DEFAULTS["max_tokens"],
                "max_tokens_min": MIN_BUDGET_TOKENS,
                "max_tokens_max": MAX_BUDGET_TOKENS,
                "min_score": hook_config.DEFAULTS.get("min_score", 0.0),
                "deadline_ms": HOOK_SERVER_MS,
            },
        }

    @api.post("/session")
    def sign_in(body: SignIn, request: Request) -> JSONResponse:
        _same_origin(request)
        key = body.key.strip()
        if not key:  # else it became `Bearer ` and was told of a header the user never sent
            raise InvalidRequestError(
                "the API key is empty: paste a key (relay_<key id>_<secret>)", field="key"
            )
        principal = auth.authorize(store, f"Bearer {key}")
        response = JSONResponse(session_info(principal, key))
        response.set_cookie(
            COOKIE,
            key,
            max_age=SESSION_MAX_AGE_S,
            path="/console",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    @api.get("/session")
    def whoami(p: Session, request: Request) -> dict[str, Any]:
        return session_info(p, request.cookies[COOKIE])

    @api.delete("/session")
    def sign_out(_p: Session) -> Response:
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return response

    # -- memories ---------------------------------------------------------------
    @api.get("/memories")
    def list_memories(
        p: Session,
        limit: Annotated[QueryInt, Query(ge=1, le=500)] = 50,
        cursor: str | None = None,
        source_prefix: str | None = None,
        q: str | None = None,
        tag: str | None = None,
        audience: str | None = None,
        author: str | None = None,
        status: str = "any",
        expiring_days: Annotated[QueryInt, Query(ge=1, le=3650)] = 7,
    ) -> dict[str, Any]:
        """As /v1/memories?order=updated lists them (newest change first), filtered in the
        store's query."""
        auth.require(p, "memory:read")
        for name, value in (
            ("source_prefix", source_prefix),
            ("q", q),
            ("tag", tag),
            ("audience", audience),
            ("author", author),
        ):
            hygiene.check_filter(name, value)
        now = datetime.now(UTC)
        where = ListFilter(
            source_prefix=source_prefix,
            text=q,
            tag=tag,
            audience=audience,
            author=author,
            status=status,
            expiring_days=expiring_days,
            now=now,
        )
        after = decode_position(cursor)
        items, last = store.list_memories(p.org_id, auth.management_view(p), limit, after, where)
        names = key_names(p)
        return {
            "items": [memory_view(m, now, names) for m in items],
            "next_cursor": encode_position(last),
        }

    @api.get("/facets")
    def facets(p: Session) -> dict[str, Any]:
        """Values the filters can take: the org's roles, and the authors with their key names."""
        auth.require(p, "memory:read")
        audiences = store.known_audiences(p.org_id) if "admin" in p.scopes else set(p.audiences)
        return {"audiences": sorted(audiences | {"all"}), "authors": key_names(p)}

    @api.post("/memories", status_code=201)
    def create_memory(body: MemoryBody, p: Session) -> dict[str, Any]:
        auth.require(p, "memory:write")
        memory = writes.create(store, embedder, p, body.model_dump(), body.id)
        return written_view(memory, p)

    @api.get("/memories/{memory_id}")
    def get_memory(memory_id: str, p: Session) -> dict[str, Any]:
        auth.require(p, "memory:read")
        writes.check_memory_id(memory_id)
        memory = store.get_memory(p.org_id, memory_id, auth.management_view(p))
        return memory_view(memory, datetime.now(UTC), key_names(p))

    @api.patch("/memories/{memory_id}")
    def edit_memory(memory_id: str, body: MemoryPatch, p: Session) -> dict[str, Any]:
        auth.require_edit(p)
        writes.check_memory_id(memory_id)
        changes = body.model_dump(exclude_unset=True, exclude={"expected_revision"})
        memory = writes.edit(store, embedder, p, memory_id, changes, body.expected_revision)
        return written_view(memory, p)

    @api.delete("/memories/{memory_id}", status_code=204)
    def delete_memory(
        memory_id: str,
        p: Session,
        expected_revision: Annotated[QueryInt | None, Query(ge=1)] = None,
    ) -> Response:
        """As on the API: with the revision the page showed, one edited since is kept (409)."""
        auth.require(p, "memory:write")
        writes.check_memory_id(memory_id)
        store.delete_memory(
            p.org_id, memory_id, p.key_id, auth.management_view(p), expected_revision
        )
        return Response(status_code=204)

    @api.get("/memories/{memory_id}/revisions")
    def revisions(memory_id: str, p: Session) -> dict[str, Any]:
        auth.require(p, "memory:read")
        writes.check_memory_id(memory_id)
        names = key_names(p)
        items = store.history(p.org_id, memory_id, auth.management_view(p))
        return {"items": [{**r.to_dict(), "author_name": names.get(r.author or "")} for r in items]}

    @api.get("/memories/{memory_id}/diff")
    def compare(
        memory_id: str,
        p: Session,
        old: Annotated[QueryInt, Query(alias="from", ge=1)],
        new: Annotated[QueryInt, Query(alias="to", ge=1)],
    ) -> dict[str, Any]:
        auth.require(p, "memory:read")
        writes.check_memory_id(memory_id)
        history = store.history(p.org_id, memory_id, auth.management_view(p))
        a, b = curate.find_revision(history, old), curate.find_revision(history, new)
        return {
            "id": memory_id,
            "from": a.to_dict(),
            "to": b.to_dict(),
            "fields": curate.diff(a, b),
        }

    # -- search and the agent's view --------------------------------------------
    @api.post("/search")
    def console_search(body: ConsoleSearch, p: Session) -> dict[str, Any]:
        """The recall pipeline itself, under this key's roles (no admin widening)."""
        auth.require(p, "memory:read")
        response = search(p, check_query(body.query), body.k, 1000.0, body.mode, False)
        return response.to_dict()

    @api.post("/preview")
    def preview(body: Preview, p: Session) -> dict[str, Any]:
        """What the hook would inject for this prompt as the first of a new session."""
        auth.require(p, "memory:read")
        reader = p if body.key_id in (None, "", p.key_id) else _other_key(p, body.key_id)
        return agent_view(reader, body)

    def _other_key(p: Principal, key_id: str) -> Principal:
        if "admin" not in p.scopes:
            raise ForbiddenError("only an admin key may preview as another key")
        now = datetime.now(UTC)
        for key in store.list_keys(p.org_id):
            if key.id == key_id:
                if _key_view(key, now)["status"] != "active":
                    raise InvalidRequestError(f"key {key_id!r} is {_key_view(key, now)['status']}")
                return Principal(key.org_id, key.id, key.scopes, key.roles)
        raise NotFoundError(f"no key {key_id!r}")

    def agent_view(reader: Principal, body: Preview) -> dict[str, Any]:
        cfg = hook_config.Config(hook_config.DEFAULTS)
        cfg["max_records"], cfg["max_tokens"] = body.max_records, body.max_tokens
        prompt = body.prompt.strip()
        words = gate.keywords(prompt)
        session = state.fresh("")
        session["count"] = 1
        out: dict[str, Any] = {"key_id": reader.key_id, "keywords": words}
        reason = gate.skip_reason(prompt, words, session, cfg)
        if reason is not None:
            return {**out, "outcome": "skipped", "reason": reason}
        query, k = prompt[:QUERY_MAX_CHARS], results_wanted(body.max_records)
        out["request"] = {"query": query, "k": k, "deadline_ms": body.deadline_ms}
        if not auth_allows(reader, "memory:read"):
            return {**out, "outcome": "unauthorized", "reason": "HTTP 403"}
        response = search(reader, query, k, body.deadline_ms, "hybrid", False)
        # Through JSON, as the hook receives it, then the hook's own validation and packing.
        payload = json.loads(json.dumps(response.to_dict()))
        try:
            records = validate(payload)
        except HookFailure as failure:
            return {**out, "outcome": failure.outcome, "reason": failure.detail, "server": payload}
        if body.min_score:  # as relay.hook.run._prompt, before packing
            records = [r for r in records if (r.get("score") or 0.0) >= body.min_score]
        room = context_room("UserPromptSubmit")  # the hook's stdout cap
        context, injected, _ = pack(
            records, {}, body.max_records, body.max_tokens, PROMPT_INTRO, max_chars=room
        )
        out["server"] = payload
        if context is None:
            return {**out, "outcome": "no_match", "context": None, "tokens": 0, "injected": []}
        stdout = codec.dumps(
            {
                "hookSpecificOutput": {
                    "hookEventName": "UserPromptSubmit",
                    "additionalContext": context,
                }
            }
        )
        return {
            **out,
            "outcome": "hit",
            "context": context,
            "tokens": tokens(context),
            "injected": [
                {"id": r["id"], "revision": r["revision"], "source": r["source"]} for r in injected
            ],
            "stdout": stdout,
        }

    # -- keys -------------------------------------------------------------------
    @api.get("/keys")
    def list_keys(p: Session) -> dict[str, Any]:
        auth.require(p, "admin")
        now = datetime.now(UTC)
        return {"items": [_key_view(k, now) for k in store.list_keys(p.org_id)]}

    @api.post("/keys", status_code=201)
    def create_key(body: KeyBody, p: Session) -> dict[str, Any]:
        auth.require(p, "admin")
        minted = auth.mint_key(
            store,
            p.org_id,
            body.name,
            frozenset(body.scopes),
            frozenset(body.roles),
            body.expires_at,
        )
        return {**_key_view(minted.key, datetime.now(UTC)), "secret": minted.secret}

    @api.delete("/keys/{key_id}")
    def revoke_key(key_id: str, p: Session) -> dict[str, Any]:
        auth.require(p, "admin")
        return _key_view(store.revoke_key(p.org_id, auth.check_key_id(key_id)), datetime.now(UTC))

    # -- health -----------------------------------------------------------------
    @api.get("/health")
    def health(
        p: Session, hours: Annotated[float, Query(gt=0, le=24 * 30)] = 24.0
    ) -> dict[str, Any]:
        auth.require(p, "memory:read")
        now = datetime.now(UTC)
        until = now.timestamp()
        since = until - hours * 3600
        events = search_log.events(p.org_id, since)
        memories = {m.id: m for m in curate.scan(store, p.org_id, auth.management_view(p))}
        counts = search_log.recalls(p.org_id)
        brief = lambda m: {"id": m.id, "title": m.title, "source": m.source}  # noqa: E731
        live = [
            m
            for m in memories.values()
            if not {"expired", "superseded"} & set(curate.statuses(m, now))
        ]
        never = sorted((m for m in live if not counts.get(m.id)), key=lambda m: m.created_at)
        expired = sorted(
            (m for m in memories.values() if m.valid_until is not None and m.valid_until <= now),
            key=lambda m: m.valid_until,  # type: ignore[arg-type,return-value]
        )
        out: dict[str, Any] = {
            "recorded_since": iso(datetime.fromtimestamp(search_log.started_at, UTC)),
            "searches": search_series(events, since, until, 24),
            "memories": len(memories),
            "most_recalled": [
                {**brief(memories[mid]), "recalls": c}
                for mid, c in most_recalled(counts, memories, 10)
            ],
            "never_recalled": {
                "total": len(never),
                "items": [{**brief(m), "created_at": iso(m.created_at)} for m in never[:20]],
            },
            "past_valid_until": {
                "total": len(expired),
                "items": [{**brief(m), "valid_until": iso(m.valid_until)} for m in expired[:50]],
            },
            "developers": None,
        }
        if "admin" in p.scopes:
            out["developers"] = streak_rows(store.hook_reports(p.org_id), key_names(p))
        return out

    # -- hook outcomes, sent by developers who opt in ---------------------------
    @ingest.post("/v1/hook-outcomes", status_code=202, tags=["operations"])
    def hook_outcomes(body: HookOutcomes, p: Auth) -> dict[str, Any]:
        """Aggregated hook outcomes from one developer's machine (`relay stats --json`);
        any valid key of the org may send them. Kept by the store (every replica shows them)
        and shown per developer on the console."""
        unknown = set(body.outcomes) - set(OUTCOMES)
        if unknown:
            raise InvalidRequestError(f"unknown outcome(s) {', '.join(sorted(unknown))[:200]}")
        if any(v < 0 for v in body.outcomes.values()):
            raise InvalidRequestError("outcome counts must not be negative")
        found = store.key_for_auth(p.key_id)
        developer = _printable(body.developer or "", 100) or (found[0].name if found else p.key_id)
        # Kept for good and listed on the console beside the key's name: held to a key
        # name's rule, so a token pasted where the name goes is refused, not shown to admins.
        hygiene.check_name(developer, "alice laptop")
        breaker = body.breaker.get("state") if body.breaker else None
        report = HookReport(
            received_at=datetime.now(UTC).timestamp(),
            developer=developer,
            key_id=p.key_id,
            period_since=body.since,
            period_until=body.until,
            invocations=body.invocations,
            outcomes={k: body.outcomes.get(k, 0) for k in OUTCOMES},
            unauthorized_streak=body.unauthorized_streak.length,
            unauthorized_since=body.unauthorized_streak.since,
            unavailable_streak=body.unavailable_streak.length,
            unavailable_since=body.unavailable_streak.since,
            hook_ms={k: float(v) for k, v in body.hook_ms.items() if k in ("p50", "p95", "p99")},
            # a state ("closed", "open", "half_open"): bounded, as it is now kept for good
            breaker=_printable(breaker, 40) if isinstance(breaker, str) else None,
        )
        store.add_hook_report(p.org_id, report)
        return {"accepted": True, "developer": developer}

    return [page, api, ingest]


def auth_allows(p: Principal, scope: str) -> bool:
    return scope in p.scopes or "admin" in p.scopes
