"""Shared fixtures: real SQLite files, the real embedding model, a real server on loopback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from postgres_support import pg_store, pg_url  # noqa: F401  (a real PostgreSQL per session)

from relay.auth import mint_key
from relay.cache import ResultCache
from relay.embedding import load_embedder
from relay.metrics import Metrics
from relay.search import Searcher
from relay.server import Services, asgi_app
from relay.store import Store
from relay.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def embedder():
    return load_embedder("onnx", 1)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every store-level test runs on both implementations (`-m "not postgres"` skips one)."""
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_store")
        return
    s = SQLiteStore(tmp_path / "relay.db")
    yield s
    s.close()


@dataclass
class Api:
    """An in-process app with two organisations and keys of every kind."""

    client: object
    services: Services
    keys: dict[str, str]
    orgs: dict[str, str]

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}


@pytest.fixture
def api(store: SQLiteStore, embedder) -> Iterator[Api]:
    from starlette.testclient import TestClient

    searcher = Searcher(store, embedder, cache=ResultCache())
    services = Services(store, searcher, embedder, Metrics())
    a = store.create_org("acme")
    b = store.create_org("globex")
    every = frozenset({"memory:read", "memory:write"})
    keys = {
        "acme_admin": mint_key(store, a.id, "admin", frozenset({"admin"}), frozenset()).secret,
        "acme_dev": mint_key(store, a.id, "dev", every, frozenset({"dev"})).secret,
        "acme_sre": mint_key(store, a.id, "sre", every, frozenset({"sre"})).secret,
        "acme_reader": mint_key(
            store, a.id, "reader", frozenset({"memory:read"}), frozenset()
        ).secret,
        "globex_dev": mint_key(store, b.id, "dev", every, frozenset({"dev"})).secret,
    }
    with TestClient(asgi_app(services), raise_server_exceptions=False) as client:
        yield Api(client, services, keys, {"acme": a.id, "globex": b.id})
    searcher.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    admin_key: str
    db: Path
    process: subprocess.Popen
    drain: threading.Thread | None = None
    startup: str = ""  # what it printed until it was up

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.drain is not None:
            self.drain.join(10)  # the pipe hits EOF once the process is gone
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_server(db: Path, extra_env: dict[str, str] | None = None) -> LiveServer:
    """`relay serve` as a user runs it, on a free loopback port; returns once /healthz answers."""
    port = free_port()
    env = {**os.environ, "RELAY_DB": str(db), "RELAY_PORT": str(port), **(extra_env or {})}
    proc = subprocess.Popen(
        [str(BIN / "relay"), "serve", "--org", "acme"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    deadline = time.monotonic() + 60
    key = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line and proc.poll() is not None:
            raise RuntimeError("relay serve exited:\n" + "".join(lines))
        lines.append(line)
        found = re.search(r"(relay_[0-9a-f]+_\S+)", line)
        if found and not key:
            key = found.group(1)
        if "Uvicorn running" in line or "Application startup complete" in line:
            break
    else:
        proc.kill()
        raise RuntimeError("relay serve did not start:\n" + "".join(lines))
    # Keep reading its output so a chatty server never blocks on a full pipe.
    drain = threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True)
    drain.start()
    return LiveServer(url, key, db, proc, drain, "".join(lines))


def console_health(url: str, key: str) -> dict:
    """GET /console/api/health of the server at `url`, signed in with `key` as a browser is."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as client:
        client.post("/console/api/session", json={"key": key}).raise_for_status()
        answer = client.get("/console/api/health")
        answer.raise_for_status()
        return answer.json()


@pytest.fixture(scope="session")
def live_server(tmp_path_factory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("live") / "relay.db")
    yield server
    server.stop()
