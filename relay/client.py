"""A small HTTP client for the Relay API, for the CLI, the MCP server and `relay doctor`.

Standard library only. Error bodies come back as the matching RelayError, so
callers handle a remote failure exactly like a local one.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from relay import errors, key_source
from relay.hook import config as hook_config
from relay.ids import MEMORY_ID

_BY_CODE: dict[str, type[errors.RelayError]] = {
    cls.code: cls
    for cls in (
        errors.InvalidRequestError,
        errors.SecretDetectedError,
        errors.TooLargeError,
        errors.UnauthorizedError,
        errors.ForbiddenError,
        errors.NotFoundError,
        errors.RequestTimeoutError,
        errors.ConflictError,
        errors.OverloadedError,
        errors.UnavailableError,
        errors.StoreError,
    )
}


T = TypeVar("T")
# What one POST /v1/memories/batch may carry: at most 256 items, in a request body the
# server caps at max_body_bytes (256 KiB by default). Batches stay well inside both, and
# inside BATCH_TEXT_CHARS of title and body: the server embeds every passage before it
# answers, so a batch's text is its time. Measured on 2 busy cores, 10-15k characters a
# second: 32k is 2-4 s (60 sections of 500 words, all the byte bound let through, took
# 13-17 s, and past the client's 30 s timeout on a slower machine).
BATCH_ITEMS = 128
BATCH_BYTES = 192 * 1024
BATCH_TEXT_CHARS = 32_000


def batches(items: Sequence[T], as_item: Callable[[T], Any]) -> Iterator[list[T]]:
    """`items` in runs the batch endpoint accepts and embeds in a few seconds: at most
    BATCH_ITEMS, BATCH_BYTES of JSON as `RelayClient.request` encodes it and
    BATCH_TEXT_CHARS of title and body (one larger item goes alone)."""
    batch: list[T] = []
    size = text = 0
    for item in items:
        fields = as_item(item)
        item_size = len(json.dumps(fields)) + 2  # ASCII only: the rest is escaped
        item_text = len(fields.get("title") or "") + len(fields.get("body") or "")
        if batch and (
            len(batch) >= BATCH_ITEMS
            or size + item_size > BATCH_BYTES
            or text + item_text > BATCH_TEXT_CHARS
        ):
            yield batch
            batch, size, text = [], 0, 0
        batch.append(item)
        size += item_size
        text += item_text
    if batch:
        yield batch


def memory_path(memory_id: str, rest: str = "") -> str:
    """`/v1/memories/<id><rest>`; text that cannot be an id names no memory, and is refused
    here as the server would (a `/` or `?` in it would address another resource)."""
    if not MEMORY_ID.fullmatch(memory_id):
        raise errors.NotFoundError(f"no memory {memory_id!r}")
    return f"/v1/memories/{memory_id}{rest}"


def deletion(revisions: Callable[[], list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The tombstone ending a deleted memory's history, `revisions()` as this key reads
    them; None when it was not deleted, or its history is not for this key (a write-only
    key's). The CLI and the MCP tools say what it tells (`deleted_at`) where a memory
    already deleted answers as none ('no memory')."""
    try:
        items = revisions()
    except (errors.ForbiddenError, errors.NotFoundError):
        return None
    return items[-1] if items and items[-1]["action"] == "delete" else None


def deleted_at(memory_id: str, tombstone: dict[str, Any]) -> str:
    """`ID was forgotten at TIME (revision N)`, from its `deletion` tombstone."""
    return (
        f"{memory_id} was forgotten at {tombstone['recorded_at']}"
        f" (revision {tombstone['revision']})"
    )


def forget(
    memory_id: str,
    read: Callable[[str], dict[str, Any]],
    delete: Callable[[], object],
) -> list[str]:
    """Delete a memory with `delete()`; the ids of those it superseded that are back in
    recall now, as `read(id)` (the memory as this key reads it) tells: no longer
    superseded by another, and not expired. The CLI and the MCP tools say them
    (`back_in_recall`), so an out-of-date fact is not back unnoticed. A failed delete
    raises as `delete()` does."""
    replaced = readable(read, memory_id)
    delete()
    # Asked after the delete: the server relinks what it superseded to any other memory
    # that still supersedes it (and a link this key cannot read shows here as none).
    back = []
    for target in replaced.get("supersedes", []) if replaced else []:
        memory = readable(read, target)
        if (
            memory
            and memory.get("superseded_by") is None
            and not expired(memory.get("valid_until"))
        ):
            back.append(target)
    return back


def readable(read: Callable[[str], dict[str, Any]], memory_id: str) -> dict[str, Any] | None:
    """`read(memory_id)`; None when gone or not for this key to read (a write-only key may
    still forget: what it superseded then goes unsaid)."""
    try:
        return read(memory_id)
    except (errors.ForbiddenError, errors.NotFoundError):
        return None


def back_in_recall(back: list[str]) -> str:
    """`ID, which it superseded, is back in recall (...)`, for `forget`'s answer."""
    again = "forget it too if it is" if len(back) == 1 else "forget each too that is"
    return (
        f"{', '.join(back)}, which it superseded, {'is' if len(back) == 1 else 'are'} back"
        f" in recall ({again} out of date)"
    )


def expired(valid_until: object) -> bool | None:
    """Whether a memory's or revision's `valid_until`, as a server sends it, has passed:
    recall no longer returns it (None: no date, or none a Relay server writes)."""
    from datetime import UTC, datetime

    if not isinstance(valid_until, str):
        return None
    try:
        return datetime.fromisoformat(valid_until.replace("Z", "+00:00")) <= datetime.now(UTC)
    except ValueError:
        return None


def search_records(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A search answer's results as the recall hook checks and reads them (`score`, `title`
    and `source` may be missing): a flaw is one error line naming it, not a KeyError in the
    command that printed them, and an answer the server ran out of time to search for is
    UnavailableError, not "nothing relevant"."""
    from relay.hook.client import HookFailure
    from relay.hook.pack import starved, validate

    try:
        records = validate(answer)
    except HookFailure as exc:
        raise errors.RelayError(
            f"the Relay server sent a malformed answer ({exc.detail})"
        ) from None
    if starved(answer, records):  # not "nothing relevant": nothing was looked at
        raise errors.UnavailableError(errors.SEARCH_OUT_OF_TIME)
    return records


class AnswerTooLargeError(errors.RelayError):
    """An answer larger than any Relay server sends to that request: not read whole."""


class ConnectionFailedError(errors.UnavailableError):
    """The server itself could not be reached (a remote UnavailableError is its database).
    `sent`: whether the request may have reached it whole (the connection failed after
    sending): a write may then still happen; one refused or cut while sending cannot."""

    sent = True


class TimedOutError(ConnectionFailedError):
    """The server took the request but did not answer in time: a write may still happen."""


class NotRelayRootError(errors.InvalidRequestError):
    """The URL answered, but as no Relay server root would (a 404 for a route Relay has)."""

    surely = True  # False: a bare 404 a Relay server also sends, for a route it lacks


# The most a Relay answer weighs, read no further (`relay mcp` took 570 MB for a 50 MB
# answer). One memory as JSON is at most about 100 KB: its body, title, source and tags at 4
# bytes a character (UTF-8's most), 64 audiences and links. An answer about one memory or a
# search (MAX_K passages) stays under 2 MB; a list (a page of 500 memories, as `relay export`
# reads them) under 50 MB. A memory's revisions and the pinned profile have no count bound
# (2,100 revisions of a full-size body weigh 135 MB), so no size is more than a Relay server
# sends to them: they are read whole (None), as any cap would refuse a real server's answer.
ANSWER_BYTES = 8 * 1024 * 1024
LIST_ANSWER_BYTES = 128 * 1024 * 1024

# Relay's routes: what each answer holds at its top level (None: no body, a 204), whether
# the request writes, and what bounds its answer (`answer_bytes`). An answer without
# those keys is some other server's (one that answers JSON 200 to everything), said here
# once rather than a KeyError in whichever command read it; and a request that writes
# nothing (a search is a POST) is not said to maybe have written. Keys a newer server added
# are not required (an older one lacks them).
_ID = r"/[^/?]+"
_ONE, _PAGE = "one", "page"  # ANSWER_BYTES, LIST_ANSWER_BYTES (read as a request is)
_Route = tuple[tuple[str, ...] | None, bool, str | None]
_ROUTES: tuple[tuple[str, re.Pattern[str], _Route], ...] = tuple(
    (method, re.compile(path + r"(\?.*)?"), (keys, writes, most))
    for method, path, keys, writes, most in (
        ("GET", "/healthz", ("status", "version"), False, _ONE),
        ("GET", "/v1/whoami", ("org", "key"), False, _ONE),
        ("GET", "/v1/profile", ("results",), False, None),
        ("POST", "/v1/search", ("results",), False, _ONE),
        ("POST", "/v1/memories", ("id",), True, _ONE),
        ("POST", "/v1/memories/batch", ("written", "unchanged"), True, _ONE),
        ("GET", "/v1/memories", ("items", "next_cursor"), False, _PAGE),
        ("GET", f"/v1/memories{_ID}", ("id",), False, _ONE),
        ("PATCH", f"/v1/memories{_ID}", ("id",), True, _ONE),
        ("DELETE", f"/v1/memories{_ID}", None, True, _ONE),
        ("GET", f"/v1/memories{_ID}/revisions", ("items",), False, None),
        ("GET", "/v1/tombstones/count", ("count",), False, _ONE),
        ("POST", "/v1/keys", ("id", "secret"), True, _ONE),
        ("GET", "/v1/keys", ("items",), False, _PAGE),
        ("DELETE", f"/v1/keys{_ID}", ("id",), True, _ONE),
        ("POST", "/v1/hook-outcomes", ("developer",), True, _ONE),
    )
)
# Said of a write whose answer never came: it may have happened, and a retry would double it.
MAY_HAVE_WRITTEN = "; it may still have written this request"


def _route(method: str, path: str) -> _Route:
    """The keys Relay's answer to `method path` holds (None: it has no body), whether the
    request writes, and what bounds its answer; an unknown route: nothing checked, it may
    write unless a GET, and its answer may weigh a page's."""
    for m, pattern, route in _ROUTES:
        if m == method and pattern.fullmatch(path):
            return route
    return (), method not in ("GET", "HEAD"), _PAGE


def answer_bytes(method: str, path: str) -> int | None:
    """The most Relay's answer to `method path` may weigh (None: no bound)."""
    most = _route(method, path)[2]
    return None if most is None else ANSWER_BYTES if most == _ONE else LIST_ANSWER_BYTES


def settings(url: str | None = None) -> hook_config.Config:
    """The hook's settings as a command reads them, a --url given taking RELAY_URL's place:
    the config file's key goes only to the config file's server (`hook_config.load`), so a
    URL typed (a typo, a pasted link) is held to it as one exported is (a stale export, a
    teammate's .envrc). Another server needs a key of its own: --key, --key-file,
    RELAY_API_KEY(_FILE)."""
    return hook_config.load({**os.environ, "RELAY_URL": url} if url else None)


def _pass(flag: str, variable: str, flags: bool) -> str:
    """How to give a missing setting: the flag only where the command takes it."""
    given = f"pass {flag}, set {variable}," if flags else f"set {variable}"
    return f"{given} or run 'relay install'"


class NotConfiguredError(errors.InvalidRequestError):
    """This machine has no server to ask: nothing was sent anywhere."""


def _check_url(url: str) -> None:
    """Refuse a URL no request can go to (no http(s) scheme, no host)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotConfiguredError(
            f"{url!r} is not a Relay server URL: give http://host:port (or https://...)"
        )


class RelayClient:
    # Why the configured key cannot be used (a key file missing, unreadable, with a
    # byte-order mark or a character no HTTP header takes), when it is the reason for no key.
    key_problem: str | None = None
    # Whether the command running takes --url and --key: `relay stats --send` has neither
    # (it sends with the hook's settings), so it must not be told to pass them.
    flags = True

    def __init__(self, url: str, api_key: str, timeout: float = 30.0) -> None:
        if not url:
            raise NotConfiguredError(f"no server URL: {_pass('--url', 'RELAY_URL', True)}")
        _check_url(url)
        self.url = url.strip().rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    @classmethod
    def from_config(
        cls, url: str | None = None, api_key: str | None = None, flags: bool = True
    ) -> RelayClient:
        """Flags first, then RELAY_URL / RELAY_API_KEY(_FILE), then ~/.relay/config.json,
        whose key goes to its own server only (`settings`). `flags`: whether the command
        takes --url and --key, for what a refusal says."""
        cfg = settings(url)
        if url or cfg.url:  # a typo is told as such, not as another server than the key's
            _check_url(url or cfg.url)
        refusal = key_source.elsewhere(cfg, url) if not api_key else None
        if refusal:
            how = (
                "pass --key or --key-file (or set RELAY_API_KEY_FILE or RELAY_API_KEY) for that"
                " server"
                if flags
                else "set RELAY_API_KEY_FILE (or RELAY_API_KEY) for that server"
            )
            raise NotConfiguredError(f"{refusal}: {how}{'' if url else ', or unset RELAY_URL'}")
        url, api_key = url or cfg.url, api_key or cfg.api_key
        if cfg.bad_file and not (url and api_key):  # what is missing may be in the broken file
            problem = hook_config.file_problem(hook_config.config_path(os.environ))
            if problem:
                raise NotConfiguredError(problem)
        if not url:
            raise NotConfiguredError(f"no server URL: {_pass('--url', 'RELAY_URL', flags)}")
        client = cls(url, api_key)
        client.flags = flags
        if not api_key:  # a key given and unusable is not the same as none: say what is wrong
            unsent = key_source.key_problem(cfg)
            client.key_problem = str(unsent) if unsent else None
        return client

    def require_key(self) -> RelayClient:
        """This client, once it has an API key: without one every /v1 request would be
        refused with the server's HTTP hint, which tells a CLI user nothing to do."""
        if not self.api_key and self.key_problem:
            raise NotConfiguredError(self.key_problem)
        if not self.api_key:
            where = "RELAY_API_KEY (or RELAY_API_KEY_FILE)"
            raise NotConfiguredError(
                f"no API key: {_pass('--key or --key-file', where, self.flags)}"
            )
        return self

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                raw = self._read_capped(resp, method, path)
        except urllib.error.HTTPError as exc:
            raise _remote_error(exc, self.url, f"{method} {self.url}{path}") from None
        except TimeoutError as exc:  # sent whole: only the answer is missing
            _, writes, _ = _route(method, path)
            written = MAY_HAVE_WRITTEN if writes else ""
            raise TimedOutError(
                f"the Relay server at {self.url} did not answer within {self.timeout:g} s{written}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            # urllib wraps in URLError what fails while connecting or sending; a connection
            # lost while waiting for the answer comes bare, after the whole request went.
            sent = not isinstance(exc, urllib.error.URLError)
            if isinstance(reason, TimeoutError):  # while connecting or sending: nothing taken
                failed: ConnectionFailedError = TimedOutError(
                    f"the Relay server at {self.url} did not take the request within"
                    f" {self.timeout:g} s"
                )
            elif sent:  # it was reached: a write it took may have happened (a retry doubles it)
                written = MAY_HAVE_WRITTEN if _route(method, path)[1] else ""
                failed = ConnectionFailedError(
                    f"the Relay server at {self.url} closed the connection without answering"
                    f" ({reason}){written}"
                )
            else:
                failed = ConnectionFailedError(
                    f"cannot reach the Relay server at {self.url}: {reason}"
                )
            failed.sent = sent
            raise failed from exc
        return self._relay_answer(method, path, raw)

    def _read_capped(self, resp: Any, method: str, path: str) -> bytes:
        """The answer's body, refused unread past the most Relay sends to `method path`
        (declared larger, or longer than it said)."""
        cap = answer_bytes(method, path)
        if cap is None:
            return bytes(resp.read())
        declared = resp.headers.get("Content-Length", "")
        too_large = declared.isdigit() and int(declared) > cap
        raw = b"" if too_large else resp.read(cap + 1)
        if too_large or len(raw) > cap:
            raise AnswerTooLargeError(
                f"the server at {self.url} sent an answer over {cap // (1024 * 1024)} MiB to"
                f" {method} {path.split('?')[0]}, more than any Relay server sends to it:"
                " not read (is another server or a proxy at that URL?)"
            )
        return raw

    def _relay_answer(self, method: str, path: str, raw: bytes) -> Any:
        """The parsed 2xx answer, once it has the shape Relay's has: else NotRelayRootError."""
        request = f"{method} {self.url}{path.split('?')[0]}"
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:  # HTML, or bytes that are not UTF-8: some other web server
            raise not_relay_root(self.url, request, "an answer that is not JSON") from None
        keys, _, _ = _route(method, path)
        relays = (
            answer is None
            if keys is None
            else not keys or (isinstance(answer, dict) and all(k in answer for k in keys))
        )
        if not relays:
            raise not_relay_root(self.url, request, "an answer that is not Relay's")
        return answer

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)


_NOT_RELAY_STATUSES = {
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    501: "501 Not Implemented",
}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A Relay server never redirects. urllib followed a redirect to wherever it pointed,
    another host included, with the `Authorization` header: the key went to that host (a
    POST went on as a GET). A redirect is now refused like any answer no Relay server gives."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)
_REDIRECTS = (301, 302, 303, 307, 308)


def _remote_error(exc: urllib.error.HTTPError, url: str, request: str) -> errors.RelayError:
    if exc.code in _REDIRECTS:  # the request, and its key, went no further
        where = exc.headers.get("Location") or "elsewhere"
        return not_relay_root(url, request.split("?")[0], f"{exc.code}, a redirect to {where}")
    try:
        payload = json.loads(exc.read(ANSWER_BYTES) or b"{}")["error"]  # cut: not Relay's
        cls = _BY_CODE.get(payload.get("code"), errors.RelayError)
        details = payload.get("details") if isinstance(payload.get("details"), dict) else {}
        message = payload.get("message") or f"HTTP {exc.code}"
    except (ValueError, KeyError, TypeError, AttributeError):
        cls, details, message = errors.RelayError, {}, f"HTTP {exc.code} from the server"
        # Not even Relay's error shape, for a route or method Relay has: some other web
        # server (a proxy before a Relay server sends 502-504 of its own while it is away).
        if exc.code in _NOT_RELAY_STATUSES:
            return not_relay_root(url, request.split("?")[0], _NOT_RELAY_STATUSES[exc.code])
        if exc.code in (502, 503, 504):  # the Relay server behind a proxy is away, or slow
            method, _, target = request.partition(" ")
            # 502 and 504: the proxy may have passed the whole request on before it gave up.
            writes = exc.code != 503 and _route(method, urllib.parse.urlsplit(target).path)[1]
            written = MAY_HAVE_WRITTEN if writes else ""
            failed = ConnectionFailedError(f"{message}{written}")
            failed.sent = exc.code != 503
            return failed
    # A route no Relay server has: Starlette's bare 404 (Relay's own name what is missing).
    if exc.code == 404 and message == "Not Found" and not details:
        return not_relay_root(url, request.split("?")[0], "404 Not Found", surely=False)
    return cls(message, **details)


def not_relay_root(url: str, request: str, answer: str, surely: bool = True) -> NotRelayRootError:
    """`url` answered `request` as no Relay server root would: say so, and what to give."""
    base = url.rstrip("/")
    root = base.removesuffix("/v1")
    give = (
        f"give its root, {root}, without /v1"
        if root != base
        else "give the root URL `relay serve` prints (the one /healthz and /v1/... are under)"
    )
    error = NotRelayRootError(
        f"{url} is {'not' if surely else 'likely not'} a Relay server root: {request} got"
        f" {answer}; {give}"
    )
    error.surely = surely
    return error


def whoami(client: RelayClient) -> dict[str, Any]:
    """GET /v1/whoami, the one request `relay install` and `relay doctor` ask a server to
    prove it is a Relay root with: every Relay root answers it, so a 404 here is sure."""
    try:
        return client.get("/v1/whoami")
    except (errors.NotFoundError, NotRelayRootError) as exc:
        if isinstance(exc, NotRelayRootError) and exc.surely:
            raise
        raise not_relay_root(client.url, f"GET {client.url}/v1/whoami", "404 Not Found") from None
