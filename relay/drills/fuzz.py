"""Bad-input drill: Hypothesis against the HTTP API and against the hook.

API: random methods, paths, headers and bodies (near-valid objects with hostile field
values, arbitrary JSON, raw bytes, lone surrogates) through the real app. Every answer
is below 500, every error has the one shape, and a refused write stores nothing (row
counts of every table unchanged). Hook: random stdin, and random server responses
(status, headers, body), through the real `relay-hook` process: exit 0 always, stdout
empty or exactly one JSON object of the documented shape.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from relay.drills.common import BIN, is_error_shape

TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"


def _strategies():
    from hypothesis import strategies as st

    any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=60)
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), any_text
    )
    json_values = st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(any_text, c, max_size=4),
        max_leaves=12,
    )
    field_values = st.one_of(
        json_values,
        st.sampled_from(
            [
                "",
                " ",
                "all",
                "dev",
                "admin",
                "memory:read",
                "2020-01-01T00:00:00Z",
                "2999-01-01T00:00:00Z",
                "not a date",
                "x" * 300_000,
                "\x00",
                "\ud800",
                "AKIAIOSFODNN7EXAMPLE",
                "-----BEGIN RSA PRIVATE KEY-----",
                -1,
                0,
                10**12,
                1e308,
            ]
        ),
    )
    fields = [
        "query",
        "k",
        "deadline_ms",
        "mode",
        "body",
        "id",
        "title",
        "source",
        "audiences",
        "tags",
        "valid_until",
        "supersedes",
        "pinned",
        "expected_revision",
        "name",
        "scopes",
        "roles",
        "expires_at",
        "items",
        "invocations",
        "outcomes",
    ]
    near_valid = st.dictionaries(st.sampled_from(fields), field_values, max_size=6)
    body = st.one_of(near_valid, json_values, st.binary(max_size=200))
    memory_ids = st.one_of(
        st.sampled_from(["fz-known", "missing", "..", "%2e%2e", "a" * 300]),
        st.text(alphabet="abc-_.%/~ ", min_size=1, max_size=12),
    )
    endpoint = st.one_of(
        st.sampled_from(
            [
                ("POST", "/v1/search"),
                ("POST", "/v1/memories"),
                ("POST", "/v1/memories/batch"),
                ("GET", "/v1/memories"),
                ("POST", "/v1/keys"),
                ("GET", "/v1/keys"),
                ("GET", "/v1/whoami"),
                ("GET", "/v1/profile"),
                ("POST", "/v1/hook-outcomes"),
                ("PUT", "/v1/search"),
                ("GET", "/healthz"),
            ]
        ),
        st.tuples(
            st.sampled_from(["GET", "PATCH", "DELETE"]),
            memory_ids.map(lambda i: f"/v1/memories/{i}"),
        ),
        st.tuples(st.just("GET"), memory_ids.map(lambda i: f"/v1/memories/{i}/revisions")),
        st.tuples(st.just("DELETE"), memory_ids.map(lambda i: f"/v1/keys/{i}")),
        st.tuples(
            st.just("GET"),
            st.text(alphabet="=&abcdlimtursoyg0123456789-%", max_size=30).map(
                lambda q: f"/v1/memories?{q}"
            ),
        ),
    )
    auth = st.sampled_from(["admin", "dev", "reader", "none", "garbage", "revoked"])
    return st, endpoint, body, auth


def api(examples: int, seed: int) -> dict[str, Any]:
    """Fuzz the API in-process; returns figures and the problems found."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from starlette.testclient import TestClient

    from relay.auth import mint_key
    from relay.cache import ResultCache
    from relay.embedding import load_embedder
    from relay.metrics import Metrics
    from relay.search import Searcher
    from relay.server import Services, asgi_app
    from relay.store.sqlite import SQLiteStore

    st, endpoint, body, auth = _strategies()
    tmp = tempfile.TemporaryDirectory(prefix="relay-drill-fuzz-")
    path = Path(tmp.name) / "relay.db"
    store = SQLiteStore(path)
    embedder = load_embedder("onnx", 1)
    searcher = Searcher(store, embedder, cache=ResultCache())
    org = store.create_org("fuzz")
    every = frozenset({"memory:read", "memory:write"})
    keys = {
        "admin": mint_key(store, org.id, "a", frozenset({"admin"}), frozenset({"dev"})).secret,
        "dev": mint_key(store, org.id, "d", every, frozenset({"dev"})).secret,
        "reader": mint_key(store, org.id, "r", frozenset({"memory:read"}), frozenset()).secret,
        "garbage": "relay_zz_" + "x" * 30,
    }
    revoked = mint_key(store, org.id, "gone", every, frozenset())
    store.revoke_key(org.id, revoked.key.id)
    keys["revoked"] = revoked.secret
    problems: list[str] = []
    tried = [0]
    statuses: dict[int, int] = {}
    snapshot_conn = sqlite3.connect(path)
    tables = [r[0] for r in snapshot_conn.execute(TABLES_SQL)]

    def counts() -> dict[str, int]:
        return {
            t: snapshot_conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            for t in tables
            if t not in ("embedding_cache", "hook_outcomes")
        }

    with TestClient(
        asgi_app(Services(store, searcher, embedder, Metrics())), raise_server_exceptions=False
    ) as client:
        client.post(
            "/v1/memories",
            json={"id": "fz-known", "body": "a known fuzz memory"},
            headers={"Authorization": f"Bearer {keys['dev']}"},
        )

        @hseed(seed)
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(endpoint, body, auth)
        def probe(where: tuple[str, str], payload: Any, who: str) -> None:
            method, url = where
            tried[0] += 1
            headers = {"Content-Type": "application/json"}
            if who in keys:
                headers["Authorization"] = f"Bearer {keys[who]}"
            if isinstance(payload, bytes):
                content = payload
            else:
                content = json.dumps(payload).encode()
            before = counts()
            resp = client.request(method, url, content=content, headers=headers)
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            what = f"{method} {url} as {who} with {content[:120]!r}"
            if resp.status_code >= 500:
                problems.append(f"{resp.status_code} for {what}: {resp.text[:200]}")
            if resp.status_code >= 400:
                try:
                    shaped = is_error_shape(resp.json(), resp.status_code)
                except ValueError:
                    shaped = False
                if not shaped:
                    problems.append(f"error shape for {what}: {resp.text[:200]}")
                if method != "GET" and counts() != before:
                    problems.append(f"refused write changed the database: {what}")

        probe()
    snapshot_conn.close()
    searcher.close()
    store.close()
    tmp.cleanup()
    return {
        "api_inputs": tried[0],
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "problems": problems,
    }


# -- the hook ---------------------------------------------------------------------
def _hook_ok(proc: subprocess.CompletedProcess) -> str | None:
    """None when the hook behaved; else what was wrong."""
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {proc.stderr[-300:]!r}"
    out = proc.stdout.strip()
    if not out:
        return None
    try:
        obj = json.loads(out)
    except ValueError:
        return f"stdout is not one JSON object: {out[:200]!r}"
    if not isinstance(obj, dict):
        return f"stdout JSON is not an object: {out[:200]!r}"
    if set(obj) == {"systemMessage"} and isinstance(obj["systemMessage"], str):
        return None  # the documented once-per-session notice of a rejected key
    spec = obj.get("hookSpecificOutput")
    if not (
        isinstance(spec, dict)
        and isinstance(spec.get("additionalContext"), str)
        and isinstance(spec.get("hookEventName"), str)
    ):
        return f"stdout object has the wrong shape: {out[:200]!r}"
    return None


class ScriptedServer:
    """Loopback HTTP server answering every request with the current scripted reply."""

    def __init__(self) -> None:
        from relay.hook_bench import FaultServer

        self.reply = b""
        self.server = FaultServer(self._behave)
        self.url = self.server.url

    def _behave(self, conn, stop) -> None:
        conn.sendall(self.reply)

    def close(self) -> None:
        self.server.close()


def hook(examples: int, seed: int) -> dict[str, Any]:
    """Fuzz the real hook process on its stdin and on the server's responses."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from relay.hook_bench import hook_env, prompt_payload

    problems: list[str] = []
    tried = {"stdin": 0, "responses": 0}
    tmp = tempfile.TemporaryDirectory(prefix="relay-drill-hookfuzz-")
    server = ScriptedServer()
    valid: dict[str, Any] = {
        "results": [
            {
                "id": "m1",
                "revision": 1,
                "title": "T",
                "source": "s/x",
                "text": "the staging cluster is blue",
                "score": 0.9,
                "updated_at": "2026-01-01T00:00:00Z",
                "conflicts_with": [],
            }
        ],
        "stages": ["lexical"],
        "degraded": False,
        "cached": False,
        "took_ms": 1.0,
    }
    server.reply = _http(200, json.dumps(valid).encode())
    counter = [0]

    def run_hook(stdin: bytes, argv: list[str] | None = None) -> subprocess.CompletedProcess:
        counter[0] += 1
        home = Path(tmp.name) / str(counter[0])
        home.mkdir()
        env = hook_env(str(home), server.url, "relay_abc123_" + "k" * 32, 400)
        return subprocess.run(
            [str(BIN / "relay-hook"), *(argv or [])],
            input=stdin,
            env=env,
            capture_output=True,
            timeout=20,
        )

    any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=80)
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), any_text)
    values = st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(any_text, c, max_size=3),
        max_leaves=8,
    )
    payload_fields = st.fixed_dictionaries(
        {},
        optional={
            "session_id": values,
            "prompt": st.one_of(
                any_text, values, st.just("how do we deploy the staging cluster safely today")
            ),
            "hook_event_name": st.one_of(st.just("UserPromptSubmit"), values),
            "source": values,
            "cwd": values,
            "transcript_path": values,
        },
    )
    stdin = st.one_of(
        st.binary(max_size=300),
        payload_fields.map(lambda d: json.dumps(d).encode()),
        values.map(lambda v: json.dumps(v).encode()),
    )

    @hseed(seed)
    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(stdin, st.sampled_from([[], ["session-start"]]))
    def fuzz_stdin(data: bytes, argv: list[str]) -> None:
        tried["stdin"] += 1
        bad = _hook_ok(run_hook(data, argv))
        if bad:
            problems.append(f"stdin {data[:120]!r} {argv}: {bad}")

    result_item = st.fixed_dictionaries(
        {}, optional={k: st.one_of(values, st.just(v)) for k, v in valid["results"][0].items()}
    )
    body = st.one_of(
        st.binary(max_size=300),
        values.map(lambda v: json.dumps(v).encode()),
        st.lists(result_item, max_size=5).map(
            lambda items: json.dumps({**valid, "results": items}).encode()
        ),
        st.dictionaries(st.sampled_from(list(valid)), values).map(
            lambda d: json.dumps({**valid, **d}).encode()
        ),
    )
    status = st.sampled_from([200, 200, 200, 201, 204, 301, 400, 401, 403, 404, 413, 429, 500, 503])

    @hseed(seed)
    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(status, body, st.booleans())
    def fuzz_response(code: int, data: bytes, lie_length: bool) -> None:
        tried["responses"] += 1
        server.reply = _http(code, data, len(data) + (7 if lie_length else 0))
        prompt = prompt_payload(
            f"how do we deploy the staging cluster {counter[0]}", "s1", tmp.name
        )
        bad = _hook_ok(run_hook(prompt))
        if bad:
            problems.append(f"response {code} {data[:120]!r}: {bad}")

    started = time.monotonic()
    try:
        fuzz_stdin()
        fuzz_response()
    finally:
        server.close()
        tmp.cleanup()
    return {
        "hook_stdin_inputs": tried["stdin"],
        "hook_response_inputs": tried["responses"],
        "seconds": round(time.monotonic() - started, 1),
        "problems": problems,
    }


def _http(status: int, body: bytes, length: int | None = None) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def schemathesis_run(
    url: str, key: str, examples: int, seed: int, report: Path, phases: str | None = None
) -> dict[str, Any]:
    """Schema-driven fuzzing from the server's own /openapi.json (schemathesis CLI);
    `phases` narrows it (e.g. "fuzzing"), all phases by default."""
    cmd = [
        str(BIN / "schemathesis"),
        "run",
        f"{url}/openapi.json",
        "-H",
        f"Authorization: Bearer {key}",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        str(examples),
        *(["--phases", phases] if phases else []),
        "--seed",
        str(seed),
        "--request-timeout",
        "20",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=report.parent)
    tail = proc.stdout[-3000:]
    return {
        "command": " ".join(
            c if "Bearer" not in c else "Authorization: Bearer <key>" for c in cmd[1:]
        ),
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "summary": tail,
    }
