"""`relay bench search --layout orgs100`: many organisations in one database, either store.

The table holds N passages over 100 organisations: `big` holds 40%, `small`
1%, and 98 others share the rest. Texts are `cursorrules_bullets` rows; each
distinct text is embedded once, and every copy gets its own vector (the
text's vector plus small seeded noise, re-normalised; copies keep a cosine of
about 0.93 to their text) so a vector index sees N distinct points rather than
a few thousand repeated ones. Rows go in through the store's real write path
(`save_memories`), org batches interleaved as live traffic would leave them.
On PostgreSQL the HNSW index is dropped during the load and built once per
size (timed; the build vacuums the table so index-only scans work).

Sizes grow one database: a database given with --db that already holds a
size's rows is measured as it is (nothing re-ingested).

Measured per size: each search stage in-process (query embedding, the store's
vector, lexical and passage calls; the whole pipeline, cache off) for the
small and the big org; recall of each org's true top 5 (tie-aware, against an
exact numpy scan of the vectors the benchmark generated) through the store's
vector search and, on PostgreSQL, through a plain HNSW query (what pgvector
alone would give); HTTP round trips to `relay serve` on loopback; and
throughput with two server processes and concurrent clients. The load
average is recorded around every measurement: the machine is shared.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from relay import late
from relay.auth import mint_key
from relay.bench_search import (
    BENCH,
    backfill,
    corpus,
    free_port,
    queries,
    rss_mb,
    serve,
    timed_search,
    wait_healthy,
)
from relay.hook_stats import percentiles
from relay.models import MemoryDraft, PassageInput, Principal
from relay.store import Store
from relay.text import lexical_terms, query_terms

NOISE = 0.02  # per-dimension sigma of the copy noise (384 dims: cosine to the text ~0.93)
SMALL_SHARE, BIG_SHARE, ORGS = 0.01, 0.40, 100
EVERY = frozenset({"all"})
MEASURED = ("small", "big")


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
        vectors, states = embedder.embed_tokens(to_embed)
        self.vectors = np.asarray(vectors, dtype="<f4")
        self.tokens = [late.pack(s) for s in states]  # copies share their text's matrix
        progress(f"embedded {len(self.texts)} distinct texts in {time.perf_counter() - t:.0f} s")
        self.lexical = [" ".join(lexical_terms(t)) for t in to_embed]

    def base(self, org: str, i: int) -> int:
        return (zlib.crc32(org.encode()) + i * 7919) % len(self.texts)

    def vector(self, org: str, i: int) -> np.ndarray:
        seed = zlib.crc32(org.encode())
        rng = np.random.default_rng(seed * 10_000_000 + i)
        noise = rng.normal(0, NOISE, self.vectors.shape[1:]).astype("<f4")
        v = self.vectors[self.base(org, i)] + noise
        return (v / np.linalg.norm(v)).astype("<f4")

    def item(self, org: str, i: int) -> tuple[str, MemoryDraft, list[PassageInput]]:
        base = self.base(org, i)
        text = self.texts[base]
        draft = MemoryDraft(body=text, title=self.titles[base], source="bench/rules")
        embedding = self.vector(org, i).tobytes()
        passage = PassageInput(0, text, self.lexical[base], f"{base}", embedding, self.tokens[base])
        return f"m{i:07d}", draft, [passage]

    def matrix(self, org: str, n: int) -> np.ndarray:
        """Every vector of an org's first `n` rows: the yardstick for exact search."""
        return np.stack([self.vector(org, i) for i in range(n)]) if n else np.zeros((0, 384))


def load(
    store: Store,
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


def recall_at(got: list[tuple[int, float]], truth: np.ndarray, k: int) -> float:
    """Share of the true top k found, tie-aware: a result whose cosine reaches the k-th
    true cosine is one of the true top k (or ties with it). `truth` holds the exact
    cosines, best first."""
    if len(truth) == 0:
        return 1.0
    k = min(k, len(truth))
    bar = float(truth[k - 1]) - 1e-5  # float32 in numpy vs pgvector's arithmetic
    return min(1.0, sum(1 for _, c in got[:k] if c >= bar) / k)


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


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


def measure(
    store: Store,
    embedder: Any,
    data: Corpus,
    principals: dict[str, Principal],
    sizes: dict[str, int],
    texts: list[str],
    rounds: int = 1,
) -> dict[str, Any]:
    """Per org: each stage alone, then the whole pipeline, and recall against numpy."""
    from relay.search import Searcher

    searcher = Searcher(store, embedder)
    now = datetime.now(UTC)
    postgres = hasattr(store, "vector_plan")
    out: dict[str, Any] = {}
    for name, p in principals.items():
        truth_matrix = data.matrix(name, sizes[name])
        timed: dict[str, list[float]] = {
            k: [] for k in ("embed", "semantic", "lexical", "tokens", "passages", "pipeline")
        }
        recall, plain = [], []
        searcher.search(p, texts[0], use_cache=False)  # warm: the in-memory vectors load here
        store.warm()  # and are current: a grown database is not measured on the older copy
        for r in range(rounds):
            for q in texts:
                t = time.perf_counter()
                qv = embedder.read_query(q).vector  # what search runs: vector and token states
                timed["embed"].append(_ms(t))
                t = time.perf_counter()
                got = store.semantic_search(p.org_id, EVERY, now, qv, 40)
                timed["semantic"].append(_ms(t))
                t = time.perf_counter()
                lex = store.lexical_search(p.org_id, EVERY, now, query_terms(q), 40)
                timed["lexical"].append(_ms(t))
                t = time.perf_counter()  # preselection reads both stages' proposals' matrices
                store.token_matrices(p.org_id, list(dict.fromkeys([i for i, _ in got + lex])))
                timed["tokens"].append(_ms(t))
                chosen = list(dict.fromkeys([i for i, _ in got[:6]] + [i for i, _ in lex[:6]]))
                t = time.perf_counter()
                store.passages(p.org_id, EVERY, now, chosen)
                timed["passages"].append(_ms(t))
                res = searcher.search(p, q, k=5, deadline_ms=10_000, use_cache=False)
                timed["pipeline"].append(res.took_ms)
                if r == 0:
                    cos = truth_matrix @ qv
                    truth = np.sort(cos[np.argpartition(-cos, 5)[:5]] if len(cos) > 5 else cos)
                    truth = truth[::-1]
                    recall.append(recall_at(got, truth, 5))
                    if postgres:
                        plain.append(recall_at(plain_hnsw(store, p.org_id, qv, 5), truth, 5))
        out[name] = {
            "rows": sizes[name],
            **({"vector_plan": store.vector_plan(p.org_id)} if postgres else {}),  # type: ignore[attr-defined]
            **{f"{k}_ms": percentiles(v) for k, v in timed.items()},
            "recall_at_5": round(statistics.mean(recall), 4),
            **({"plain_hnsw_recall_at_5": round(statistics.mean(plain), 4)} if postgres else {}),
        }
    searcher.close()
    return out


def http_and_throughput(
    db: str, keys: dict[str, str], texts: list[str], clients: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    """Round trips to one `relay serve`, then two replicas under `clients` concurrent clients."""
    ports = [free_port(), free_port()]
    procs = [serve(db, p, embed_threads=1) for p in ports]
    try:
        for p in ports:
            wait_healthy(p)
        for p in ports:  # warm-up: model, pools, SQLite's vector copies
            for key in keys.values():
                for q in texts[:10]:
                    timed_search("127.0.0.1", p, key, q, deadline_ms=5000)
        out: dict[str, Any] = {}
        for name, key in keys.items():
            out[f"http_ms_{name}"] = percentiles(
                [timed_search("127.0.0.1", ports[0], key, q, deadline_ms=5000) for q in texts]
            )
        out["throughput"] = [saturate(ports, keys, texts, n, seconds) for n in clients]
        out["server_rss_mb"] = [round(rss_mb(proc.pid), 1) for proc in procs]
        return out
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)


def saturate(
    ports: list[int], keys: dict[str, str], texts: list[str], n: int, seconds: float
) -> dict[str, Any]:
    """`n` clients, each a fresh connection per request, alternating replicas and orgs."""
    times: list[float] = []
    errors = 0
    lock = threading.Lock()
    names = list(keys)
    stop_at = time.perf_counter() + seconds

    def worker(i: int) -> None:
        nonlocal errors
        j = i
        while time.perf_counter() < stop_at:
            key = keys[names[j % len(names)]]
            try:
                took = timed_search("127.0.0.1", ports[j % 2], key, texts[j % len(texts)], 5000)
                with lock:
                    times.append(took)
            except (OSError, RuntimeError):
                with lock:
                    errors += 1
            j += n

    load_before = os.getloadavg()[0]
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
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def start_postgres(folder: Path) -> str:
    """A local PostgreSQL (pgserver) in `folder`, tuned for bulk loads and index builds."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # set on import

        server = pgserver.get_server(folder, cleanup_mode=None)
    import psycopg

    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        current = conn.execute("SHOW shared_buffers").fetchone()[0]  # type: ignore[index]
        for setting, value in (
            ("shared_buffers", "4GB"),
            ("max_wal_size", "8GB"),
            ("checkpoint_timeout", "30min"),
            ("maintenance_work_mem", "2GB"),
            ("max_parallel_maintenance_workers", "2"),
            ("synchronous_commit", "off"),
        ):
            conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
    if current != "4GB":  # shared_buffers needs a restart; the rest a reload
        pg_ctl(["-w", "restart", "-m", "fast"], pgdata=folder, user=server.system_user, timeout=60)
    return server.get_uri()


def stop_postgres(folder: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # set on import

        server = pgserver.get_server(folder, cleanup_mode=None)
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=folder, user=server.system_user, timeout=120)


def _sizes_mb(store: Any) -> dict[str, float]:
    import psycopg

    with psycopg.connect(store.conninfo) as conn:
        sizes = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relname LIKE 'passages%%'"
        ).fetchall()
        db = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
    return {"database": round(db / 2**20), **{k: round(v / 2**20) for k, v in sizes}}


def open_bench_store(kind: str, db: str) -> Store:
    if kind == "postgresql":
        from relay.store.postgres import PostgresStore

        return PostgresStore(db, pool_size=4)
    from relay.store.sqlite import SQLiteStore

    return SQLiteStore(db)


def run(
    kind: str,
    sizes: list[int],
    embedder: Any,
    bench: Path = BENCH,
    db: str | None = None,
    progress: Callable[[str], None] = print,
    clients: tuple[int, ...] = (4, 16, 32),
    seconds: float = 15.0,
    rounds: int = 1,
) -> dict[str, Any]:
    """Grow one database through `sizes` (ascending), measuring at each.

    `db`: for SQLite a file; for PostgreSQL a postgresql:// URL, or a folder where a
    local pgserver keeps its data (kept, so a later run reuses it); None: throwaway.
    """
    tmp = None
    folder: Path | None = None
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="relay-bench-orgs-")
        db = str(Path(tmp.name) / ("data" if kind == "postgresql" else "bench.db"))
    if kind == "postgresql" and not db.startswith(("postgresql://", "postgres://")):
        folder = Path(db)
        db = start_postgres(folder)
    store = open_bench_store(kind, db)
    results = []
    try:
        data = Corpus(embedder, bench, progress)
        texts = queries(bench)
        names = list(org_sizes(max(sizes)))
        orgs = {}
        for name in names:
            org = store.find_org(f"bench-{name}") or store.create_org(f"bench-{name}")
            orgs[name] = org.id
        minted = {
            n: mint_key(store, orgs[n], "bench", frozenset({"memory:read"}), frozenset())
            for n in MEASURED
        }
        principals = {
            n: Principal(orgs[n], m.key.id, m.key.scopes, m.key.roles) for n, m in minted.items()
        }
        keys = {n: m.secret for n, m in minted.items()}
        have = {n: store.doc_freq(orgs[n], [])[0] for n in names}  # one passage per memory
        for n in sorted(sizes):
            want = org_sizes(n)
            if any(have[o] > want[o] for o in names):
                raise ValueError(f"the database already holds more than {n} passages")
            row: dict[str, Any] = {"passages": n, "orgs": {k: want[k] for k in MEASURED}}
            if have != want:
                if kind == "postgresql":
                    store.drop_vector_index()  # type: ignore[attr-defined]
                row["ingest_rows_per_s"] = round(load(store, data, orgs, have, want, progress), 1)
            else:
                row["ingest_rows_per_s"] = None  # already populated: nothing ingested
            row["tokens_backfilled"] = backfill(store, embedder, progress)
            if kind == "postgresql":
                progress(f"{n}: building the HNSW index ...")
                row["hnsw_build_s"] = round(store.build_vector_index("2GB"), 1)  # type: ignore[attr-defined]
            progress(f"{n}: measuring")
            row["load_avg_before"] = [round(x, 2) for x in os.getloadavg()]
            row["in_process"] = measure(store, embedder, data, principals, want, texts, rounds)
            row["load_avg_in_process"] = [round(x, 2) for x in os.getloadavg()]
            row.update(http_and_throughput(db, keys, texts, clients, seconds))
            row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            if kind == "postgresql":
                row["size_mb"] = _sizes_mb(store)
            else:
                row["size_mb"] = {"database": round(os.path.getsize(db) / 2**20)}
            results.append(row)
            progress(f"{n}: done")
    finally:
        store.close()
        if folder is not None:  # the server this run started; its data folder stays
            stop_postgres(folder)
        if tmp is not None:
            tmp.cleanup()
    return {"store": kind, "layout": "orgs100", "queries": len(texts), "runs": results}
