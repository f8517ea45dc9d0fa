"""`relay bench search`: search latency and memory at scale on one organisation.

(The 100-organisation layout, for both stores, is `relay.bench_orgs`; the corpus,
queries, server and round-trip helpers here serve both.)

The corpus is `cursorrules_bullets` replicated to N memories (each distinct
text is embedded once; copies reuse the cached vector, as re-imports do). The
queries are the developer prompts of `coding_prompts` plus the rule-file
descriptions of `cursorrules_bullets`. Search time is measured in-process
through the real pipeline (cache off); the HTTP round trip is measured against
a real `relay serve` on loopback, one fresh connection per request as the hook
makes it; RSS is the server process's resident memory after the run. A database
given with --db that predates token matrices gets them first, through the
server's own backfill, so it is measured as a fresh one would be.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.auth import mint_key
from relay.bench_recall import read_jsonl
from relay.embedding import Embedder
from relay.hook_stats import percentiles
from relay.models import MemoryDraft, Principal
from relay.search import Searcher
from relay.store import Store, open_store
from relay.writes import backfill_tokens, save_many

BENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "bench"


def corpus(bench: Path) -> list[MemoryDraft]:
    rows = list(read_jsonl(bench / "cursorrules_bullets" / "memories.jsonl"))
    return [
        MemoryDraft(
            body=r["text"],
            title=(r.get("meta") or {}).get("heading"),
            source=f"rules/{(r.get('meta') or {}).get('file', 'unknown')}",
        )
        for r in rows
    ]


def queries(bench: Path) -> list[str]:
    out = [q["query"] for q in read_jsonl(bench / "coding_prompts" / "queries.jsonl")]
    out += [q["query"] for q in read_jsonl(bench / "cursorrules_bullets" / "queries.jsonl")]
    return out


def populate(
    store: Store, embedder: Embedder, n: int, bench: Path, progress: Callable[[str], None] | None
) -> tuple[Principal, str]:
    """One org of `n` memories (kept from an earlier run on the same --db); returns a read
    principal and its key secret."""
    org = store.find_org(f"bench-{n}") or store.create_org(f"bench-{n}")
    minted = mint_key(store, org.id, "bench", frozenset({"memory:read"}), frozenset())
    if store.current_memory(org.id, f"m{n - 1}") is not None:  # populated to the end before
        return Principal(org.id, minted.key.id, minted.key.scopes, minted.key.roles), minted.secret
    base = corpus(bench)
    items = [(f"m{i}", base[i % len(base)]) for i in range(n)]
    t = time.perf_counter()
    done = 0

    def tick(k: int) -> None:
        nonlocal done
        done += k
        if progress and done % 10_000 < k:
            progress(f"{done}/{n} memories, {done / (time.perf_counter() - t):.0f}/s")

    save_many(store, embedder, org.id, items, "bench", progress=tick, batch=1000)
    principal = Principal(org.id, minted.key.id, minted.key.scopes, minted.key.roles)
    return principal, minted.secret


def backfill(store: Store, embedder: Embedder, progress: Callable[[str], None]) -> int:
    """Token matrices for rows a database given with --db holds from before relay.late,
    through the server's own backfill (one embedding per distinct text): searches then
    preselect by late interaction, as on a fresh database. Returns how many it stored."""
    done = 0
    for n in backfill_tokens(store, embedder):
        done += n
        if done % 50_000 < n:
            progress(f"token matrices backfilled for {done} passages")
    return done


def timed_search(host: str, port: int, key: str, text: str, deadline_ms: int = 300) -> float:
    """One search over a fresh connection, as the hook makes it; milliseconds, or raises."""
    body = json.dumps({"query": text, "k": 5, "deadline_ms": deadline_ms})
    t = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/search",
            body,
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"search failed with HTTP {resp.status}")
    return (time.perf_counter() - t) * 1000


def http_round_trips(url: str, key: str, texts: list[str], deadline_ms: int = 300) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    return [timed_search(host, int(port), key, text, deadline_ms) for text in texts]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def serve(db: str, port: int, embed_threads: int | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "RELAY_DB": db,
        "RELAY_PORT": str(port),
        "RELAY_LOG_LEVEL": "warning",
        "RELAY_CACHE_ENTRIES": "0",  # every round trip pays for a real search
    }
    if embed_threads is not None:
        env["RELAY_EMBED_THREADS"] = str(embed_threads)
    relay = Path(sys.executable).parent / "relay"
    return subprocess.Popen(
        [str(relay), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
        finally:
            conn.close()
    raise RuntimeError("server did not become healthy")


def run(
    n: int,
    embedder: Embedder,
    bench: Path = BENCH,
    db: str | None = None,
    port: int = 0,
    progress: Callable[[str], None] | None = None,
    rounds: int = 2,
) -> dict[str, Any]:
    tmp = None
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="relay-bench-search-")
        db = str(Path(tmp.name) / "bench.db")
    store = open_store(db)
    try:
        t = time.perf_counter()
        principal, secret = populate(store, embedder, n, bench, progress)
        ingest_s = time.perf_counter() - t
        backfilled = backfill(store, embedder, progress or (lambda _: None))
        texts = queries(bench)
        searcher = Searcher(store, embedder)
        searcher.search(principal, texts[0], use_cache=False)  # warm the vector index
        times = []
        for _ in range(rounds):
            for q in texts:
                r = searcher.search(principal, q, k=5, deadline_ms=10_000, use_cache=False)
                times.append(r.took_ms)
        searcher.close()
    finally:
        store.close()
    port = port or free_port()
    proc = serve(db, port)
    try:
        wait_healthy(port)
        url = f"http://127.0.0.1:{port}"
        http_round_trips(url, secret, texts[:20])  # warm-up: index build, first connections
        http_times = []
        for _ in range(rounds):
            http_times += http_round_trips(url, secret, texts)
        rss = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
        if tmp is not None:
            tmp.cleanup()
    return {
        "memories": n,
        "queries": len(times),
        # None when --db already held the memories (nothing was ingested in this run)
        "ingest_per_s": round(n / ingest_s, 1) if ingest_s > 1.0 else None,
        "tokens_backfilled": backfilled,  # passages of a reused database given theirs
        "search_ms": percentiles(times),
        "http_ms": percentiles(http_times),
        "rss_mb": round(rss, 1),
    }
