"""Two `relay serve` processes over one PostgreSQL: a change through one is seen through the other
at once, although each keeps its own search cache (the generation lives in the database)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait

import psycopg
import pytest
from conftest import LiveServer, console_health, start_server

from relay.store.postgres import parse_url

pytestmark = pytest.mark.postgres


def call(server: LiveServer, method: str, path: str, key: str, body: object = None):  # noqa: ANN201
    req = urllib.request.Request(
        server.url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def found(server: LiveServer, key: str, query: str) -> list[str]:
    status, body = call(server, "POST", "/v1/search", key, {"query": query, "deadline_ms": 5000})
    assert status == 200, body
    return [r["id"] for r in body["results"]]


def wait_healthy(server: LiveServer) -> None:
    """start_server may return on 'startup complete', a moment before the port is bound."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(server.url + "/healthz", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def replicas(pg_url: str, pg_store) -> Iterator[tuple[LiveServer, LiveServer]]:  # noqa: ANN001
    """Two replicas started together on an empty database, each held where it would make the
    first organisation until both are there (`orgs` locked against writes, not reads), then
    let go at once: QA saw the second exit 5 ("an organisation named 'default' already
    exists"), and under another `--org` it made a second org and key. The one that made the
    org (and printed its key) comes first. `pg_store`: the schema made, the tables empty."""
    env = {"RELAY_PG_POOL": "4"}
    conninfo = parse_url(pg_url).conninfo
    with psycopg.connect(conninfo) as hold, ThreadPoolExecutor(2) as pool:
        hold.execute("LOCK TABLE orgs IN EXCLUSIVE MODE")
        # a URL where a path usually goes
        starting = [pool.submit(start_server, pg_url, env) for _ in range(2)]  # type: ignore[arg-type]
        _until_waiting(conninfo, 2, starting)
        hold.commit()
        wait(starting)
    up = [f.result() for f in starting if f.exception() is None]
    try:
        for f in starting:
            f.result()  # the one that failed to start, if any, with what it printed
        a, b = sorted(up, key=lambda s: not s.admin_key)
        for server in (a, b):
            wait_healthy(server)
        yield a, b
    finally:
        for server in up:
            server.stop()
        time.sleep(0.2)  # let start_server's reader threads see EOF, then close the pipes
        for server in up:
            if server.process.stdout:
                server.process.stdout.close()


def _until_waiting(conninfo: str, n: int, starting: list[Future]) -> None:
    """Until `n` sessions of the database wait on a lock (or a server stops on its own)."""
    deadline = time.monotonic() + 60
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not any(f.done() for f in starting):
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0] >= n:
                return
            assert time.monotonic() < deadline, "the servers never reached the first org"
            time.sleep(0.05)


def test_write_delete_and_revocation_through_one_replica_are_seen_through_the_other(replicas):
    a, b = replicas
    admin = a.admin_key
    assert admin and not b.admin_key  # the second replica found the org the first created
    assert "Another process created the first organisation" in b.startup
    assert "Traceback" not in a.startup + b.startup
    query = "which cluster is staging on?"
    assert found(b, admin, query) == []  # b caches this empty answer ...
    assert found(b, admin, query) == []

    status, memory = call(
        a, "POST", "/v1/memories", admin, {"body": "Staging is the blue cluster; prod is green."}
    )
    assert status == 201, memory
    assert found(b, admin, query) == [memory["id"]]  # ... and drops it at a's write

    status, _ = call(a, "DELETE", f"/v1/memories/{memory['id']}", admin)
    assert status == 204
    assert found(b, admin, query) == []  # the delete, at once

    status, minted = call(
        a, "POST", "/v1/keys", admin, {"name": "laptop", "scopes": ["memory:read"]}
    )
    assert status == 201, minted
    secret = minted["secret"]
    assert found(b, secret, query) == []
    status, _ = call(a, "DELETE", f"/v1/keys/{minted['id']}", admin)
    assert status == 200
    status, body = call(b, "POST", "/v1/search", secret, {"query": query})
    assert status == 401 and body["error"]["code"] == "unauthorized"  # revoked everywhere


def test_a_hook_report_sent_to_one_replica_is_seen_through_the_other_and_after_a_restart(
    replicas, pg_url
):
    """QA: reports lived in the memory of the replica that took them, so the console's
    health view showed a broken install on one replica and nothing on the other, and a
    restart lost them all."""
    a, b = replicas
    report = {
        "developer": "alice",
        "invocations": 10,
        "outcomes": {"unauthorized": 10},
        "unauthorized_streak": {"length": 10, "since": "2026-11-30T20:00:00Z"},
    }
    status, body = call(a, "POST", "/v1/hook-outcomes", a.admin_key, report)
    assert status == 202, body
    seen = [console_health(s.url, a.admin_key)["developers"] for s in (a, b)]
    assert seen[0] == seen[1]  # the same answer, whichever replica the balancer picks
    (alice,) = seen[1]
    assert (alice["developer"], alice["broken"]) == ("alice", ["unauthorized"])
    assert alice["latest"]["unauthorized_streak"] == report["unauthorized_streak"]

    a.stop()
    again = start_server(pg_url, {"RELAY_PG_POOL": "4"})  # type: ignore[arg-type]
    try:
        wait_healthy(again)
        assert console_health(again.url, a.admin_key)["developers"] == seen[0]
    finally:
        again.stop()
