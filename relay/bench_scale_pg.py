"""`relay bench search --store postgresql`: many organisations in one PostgreSQL database.

The table holds N passages over 100 organisations: `big` holds 40%, `small`
1%, and 98 others share the rest. Texts are `cursorrules_bullets` rows; each
distinct text is embedded once, and every copy gets its own vector (the
text's vector plus small seeded noise, re-normalised; copies keep a cosine of
about 0.93 to their text) so the HNSW graph sees N distinct points rather than
a few thousand repeated ones. Rows go in through the store's real write path
(`save_memories`), org batches interleaved as live traffic would leave them,
with the HNSW index dropped during the load and built once per size (timed).

Measured per size: search time in-process (store stages and the whole
pipeline, cache off) for the small and the big org; recall of the small org's
true top 5 (tie-aware, against `exact_semantic_search`) through Relay's routed
vector search and through a plain HNSW query (what pgvector alone would give);
HTTP round trips to `relay serve` on loopback; and throughput with two server
processes and concurrent clients.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np

from relay.auth import mint_key
from relay.bench_search import BENCH, corpus, queries, timed_search, wait_healthy
from relay.hook_stats import percentiles
from relay.models import MemoryDraft, PassageInput, Principal
from relay.text import lexical_terms, query_terms

NOISE = 0.02  # per-dimension sigma of the copy noise (384 dims: cosine to the text ~0.93)
SMALL_SHARE, BIG_SHARE, ORGS = 0.01, 0.40, 100
EVERY = frozenset({"all"})


def org_sizes(n: int) -> dict[str, int]:
    small, big = round(n * SMALL_SHARE), round(n * BIG_SHARE)
    rest = n - small - big
    sizes = {"small": small, "big": big}
    for i in range(ORGS - 2):
        sizes[f"org{i:02d}"] = rest // (ORGS - 2) + (1 if i < rest % (ORGS - 2) else 0)
    return sizes


class Corpus:
    """Distinct texts, embedded once; copies get seeded, noisy vectors of their own."""

    def __init__(self, embedder: Any, bench: Path, progress: Callable[[str], None]) -> None:
        drafts = corpus(bench)
        self.texts = [d.body for d in drafts]
        self.titles = [d.title for d in drafts]
        t = time.perf_counter()
        to_embed = [f"{d.title}\n{d.body}" if d.title else d.body for d in drafts]
        self.vectors = np.asarray(embedder.embed(to_embed), dtype="<f4")
        progress(f"embedded {len(self.texts)} distinct texts in {time.perf_counter() - t:.0f} s")
        self.lexical = [" ".join(lexical_terms(t)) for t in to_embed]

    def item(self, org: str, i: int) -> tuple[str, MemoryDraft, list[PassageInput]]:
        seed = zlib.crc32(org.encode())
        base = (seed + i * 7919) % len(self.texts)
        rng = np.random.default_rng(seed * 10_000_000 + i)
        v = self.vectors[base] + rng.normal(0, NOISE, self.vectors.shape[1]).astype("<f4")
        v /= np.linalg.norm(v)
        text = self.texts[base]
        draft = MemoryDraft(body=text, title=self.titles[base], source="bench/rules")
        passage = PassageInput(0, text, self.lexical[base], f"{base}", v.astype("<f4").tobytes())
        return f"m{i:07d}", draft, [passage]


def load(
    store: Any,
    data: Corpus,
    orgs: dict[str, str],
    have: dict[str, int],
    want: dict[str, int],
    progress: Callable[[str], None],
    batch: int = 1000,
) -> float:
    """Fill each org from `have` to `want` rows, org batches interleaved; returns rows/s."""
    t = time.perf_counter()
    done = 0
    total = sum(want[o] - have.get(o, 0) for o in want)
    while any(have.get(o, 0) < want[o] for o in want):
        for name, target in want.items():
            start = have.get(name, 0)
            if start >= target:
                continue
            stop = min(target, start + batch)
            items = [data.item(name, i) for i in range(start, stop)]
            store.save_memories(orgs[name], items, "bench", "upsert")
            have[name] = stop
            done += stop - start
            if done % 20_000 < stop - start:
                rate = done / (time.perf_counter() - t)
                progress(f"loaded {done}/{total} rows, {rate:.0f}/s")
    return total / max(1e-9, time.perf_counter() - t)


def tie_aware_recall(got: list[tuple[int, float]], exact: list[tuple[int, float]]) -> float:
    """Share of the true top-k found; a result as close as the k-th true one counts too."""
    if not exact:
        return 1.0
    k = len(exact)
    bar = exact[-1][1] - 1e-6
    truth = {r for r, _ in exact}
    found = sum(1 for r, c in got[:k] if r in truth or c >= bar)
    return min(1.0, found / k)


def plain_hnsw(store: Any, org: str, qvec: np.ndarray, k: int) -> list[tuple[int, float]]:
    """What pgvector alone gives: the index's nearest rows, then the org filter."""
    from relay.store.postgres import Vector

    with store._tx(org) as conn:
        conn.execute("SET LOCAL enable_sort = off")  # keep the planner on the HNSW index
        rows = conn.execute(
            "SELECT id, 1 - (embedding <=> %(q)s) AS c FROM passages WHERE org_id = %(org)s"
            " ORDER BY embedding <=> %(q)s LIMIT %(k)s",
            {"q": Vector.of(qvec), "org": org, "k": k},
        ).fetchall()
    return [(r["id"], float(r["c"])) for r in rows]


def measure(
    store: Any, embedder: Any, principals: dict[str, Principal], texts: list[str], rounds: int = 2
) -> dict[str, Any]:
    from relay.search import Searcher

    searcher = Searcher(store, embedder)
    now = datetime.now(UTC)
    out: dict[str, Any] = {}
    qvecs = [embedder.embed_query(q) for q in texts]
    for name, p in principals.items():
        sem, lex, full, recall, plain = [], [], [], [], []
        for _ in range(rounds):
            for q, qv in zip(texts, qvecs, strict=True):
                t = time.perf_counter()
                got = store.semantic_search(p.org_id, EVERY, now, qv, 40)
                sem.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                store.lexical_search(p.org_id, EVERY, now, query_terms(q), 40)
                lex.append((time.perf_counter() - t) * 1000)
                r = searcher.search(p, q, k=5, deadline_ms=10_000, use_cache=False)
                full.append(r.took_ms)
                if len(recall) < len(texts):
                    exact = store.exact_semantic_search(p.org_id, EVERY, now, qv, 5)
                    recall.append(tie_aware_recall(got, exact))
                    plain.append(tie_aware_recall(plain_hnsw(store, p.org_id, qv, 5), exact))
        out[name] = {
            "vector_plan": store.vector_plan(p.org_id),
            "semantic_ms": percentiles(sem),
            "lexical_ms": percentiles(lex),
            "pipeline_ms": percentiles(full),
            "recall_at_5": round(statistics.mean(recall), 4),
            "plain_hnsw_recall_at_5": round(statistics.mean(plain), 4),
        }
    searcher.close()
    return out


def serve(url: str, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "RELAY_DB": url,
        "RELAY_PORT": str(port),
        "RELAY_LOG_LEVEL": "warning",
        "RELAY_CACHE_ENTRIES": "0",  # measure searches, not the cache
        "RELAY_EMBED_THREADS": "1",
    }
    relay = Path(sys.executable).parent / "relay"
    return subprocess.Popen(
        [str(relay), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one(port: int, key: str, text: str) -> float:
    return timed_search("127.0.0.1", port, key, text, deadline_ms=5000)


def http_and_throughput(
    url: str, keys: dict[str, str], texts: list[str], clients: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    ports = [_free_port(), _free_port()]
    procs = [serve(url, p) for p in ports]
    try:
        for p in ports:
            wait_healthy(p)
        for p in ports:  # warm-up: model, pools
            for q in texts[:10]:
                _one(p, keys["small"], q)
        out: dict[str, Any] = {}
        for name, key in keys.items():
            out[f"http_ms_{name}"] = percentiles([_one(ports[0], key, q) for q in texts])
        out["throughput"] = [_saturate(ports, keys, texts, n, seconds) for n in clients]
        return out
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)


def _saturate(
    ports: list[int], keys: dict[str, str], texts: list[str], n: int, seconds: float
) -> dict[str, Any]:
    """`n` clients, each a fresh connection per request, alternating replicas and orgs."""
    times: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(i: int) -> None:
        nonlocal errors
        j = i
        while time.perf_counter() < stop_at:
            key = keys["small"] if j % 2 else keys["big"]
            try:
                took = _one(ports[j % 2], key, texts[j % len(texts)])
                with lock:
                    times.append(took)
            except (OSError, RuntimeError):
                with lock:
                    errors += 1
            j += n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.perf_counter() - t
    return {
        "clients": n,
        "qps": round(len(times) / took, 1),
        "ms": percentiles(times),
        "errors": errors,
    }


def start_postgres(folder: Path) -> str:
    """A throwaway PostgreSQL (pgserver) tuned for the size of the run."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_ctl

        server = pgserver.get_server(folder, cleanup_mode=None)
    import psycopg

    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        for setting, value in (
            ("shared_buffers", "4GB"),
            ("max_wal_size", "8GB"),
            ("checkpoint_timeout", "30min"),
            ("maintenance_work_mem", "2GB"),
            ("max_parallel_maintenance_workers", "2"),
            ("synchronous_commit", "off"),
        ):
            conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
    pg_ctl(["-w", "restart", "-m", "fast"], pgdata=folder, user=server.system_user, timeout=60)
    return server.get_uri()


def run(
    sizes: list[int],
    embedder: Any,
    bench: Path = BENCH,
    url: str | None = None,
    progress: Callable[[str], None] = print,
    clients: tuple[int, ...] = (4, 16, 32),
    seconds: float = 15.0,
    rounds: int = 2,
) -> dict[str, Any]:
    from relay.store.postgres import PostgresStore

    tmp = None
    if url is None:
        tmp = tempfile.mkdtemp(prefix="relay-bench-pg-")
        url = start_postgres(Path(tmp) / "data")
    store = PostgresStore(url, pool_size=4)
    data = Corpus(embedder, bench, progress)
    texts = queries(bench)
    names = list(org_sizes(max(sizes)))
    orgs = {n: store.create_org(f"bench-{n}-{time.time_ns()}").id for n in names}
    minted = {
        n: mint_key(store, orgs[n], "bench", frozenset({"memory:read"}), frozenset())
        for n in ("small", "big")
    }
    principals = {
        n: Principal(orgs[n], m.key.id, m.key.scopes, m.key.roles) for n, m in minted.items()
    }
    keys = {n: m.secret for n, m in minted.items()}
    have: dict[str, int] = {}
    results = []
    try:
        for n in sorted(sizes):
            store.drop_vector_index()
            rate = load(store, data, orgs, have, org_sizes(n), progress)
            progress(f"{n}: building the HNSW index ...")
            build_s = store.build_vector_index("4GB")
            progress(f"{n}: index built in {build_s:.0f} s; measuring")
            row: dict[str, Any] = {
                "passages": n,
                "ingest_rows_per_s": round(rate, 1),
                "hnsw_build_s": round(build_s, 1),
                "orgs": {k: org_sizes(n)[k] for k in ("small", "big")},
            }
            row["in_process"] = measure(store, embedder, principals, texts, rounds)
            row.update(http_and_throughput(url, keys, texts, clients, seconds))
            row["db_size_mb"] = _db_size_mb(store)
            results.append(row)
            progress(json.dumps(row))
    finally:
        store.close()
        if tmp is not None:
            stop_postgres(Path(tmp) / "data")
            shutil.rmtree(tmp, ignore_errors=True)
    return {"store": "postgresql", "queries": len(texts), "runs": results}


def stop_postgres(folder: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_ctl

        server = pgserver.get_server(folder, cleanup_mode=None)
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=folder, user=server.system_user, timeout=120)


def _db_size_mb(store: Any) -> dict[str, float]:
    import psycopg

    with psycopg.connect(store.conninfo) as conn:
        db, table, hnsw = conn.execute(
            "SELECT pg_database_size(current_database()), pg_total_relation_size('passages'),"
            " pg_relation_size('passages_embedding')"
        ).fetchone()  # type: ignore[misc]
    return {
        "database": round(db / 2**20),
        "passages_total": round(table / 2**20),
        "hnsw_index": round(hnsw / 2**20),
    }


@click.command("search-pg")
@click.option(
    "--sizes",
    default="100000,300000",
    show_default=True,
    help="Comma-separated table sizes (passages over 100 organisations).",
)
@click.option("--pg-url", help="Use this PostgreSQL (default: a throwaway pgserver).")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the figures as JSON here.",
)
@click.option("--seconds", default=15.0, show_default=True, help="Per throughput level.")
@click.option(
    "--clients",
    default="4,16,32",
    show_default=True,
    help="Concurrent clients per throughput level.",
)
@click.option("--rounds", default=1, show_default=True, help="Passes over the queries.")
def bench_search_pg(
    sizes: str,
    pg_url: str | None,
    json_path: Path | None,
    seconds: float,
    clients: str,
    rounds: int,
) -> None:
    """Search latency, small-org recall, index build and two-replica throughput on PostgreSQL."""
    from relay.embedding import load_embedder

    result = run(
        [int(s) for s in sizes.split(",")],
        load_embedder("onnx", 2),
        url=pg_url,
        progress=lambda m: click.echo(m, err=True),
        clients=tuple(int(c) for c in clients.split(",")),
        seconds=seconds,
        rounds=rounds,
    )
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(json.dumps(result, indent=2))


if __name__ == "__main__":
    bench_search_pg()
