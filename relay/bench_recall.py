"""`relay bench recall`: retrieval quality and search time on a ../shared/bench-format folder.

Each `store` becomes its own organisation, loaded through the production write
path (validation, passages, embeddings, the store), and every query runs
through the real search pipeline with a read key of that organisation, once
per mode (hybrid, lexical, semantic) in the same run. The cache is bypassed so
each query pays its real cost.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.auth import mint_key
from relay.embedding import Embedder
from relay.models import MemoryDraft, Principal
from relay.search import MODES, Searcher, SearchSettings
from relay.store.sqlite import SQLiteStore
from relay.writes import save_many

K = 10  # results asked for: enough for MRR@10


@dataclass(frozen=True)
class Query:
    store: str
    qid: str
    text: str
    relevant: frozenset[str]
    answerable: bool
    kind: str
    exclude_recommended: bool


def read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def memory_draft(row: dict[str, Any]) -> MemoryDraft:
    """How a benchmark record becomes a memory: the text is the body; when the record knows
    when it was said and by whom, that goes into the title, as a team would write it down."""
    meta = row.get("meta") or {}
    title_bits = [str(meta[k]) for k in ("speaker", "date_time") if meta.get(k)]
    source = f"{row['store']}/session-{meta['session']}" if "session" in meta else row["store"]
    return MemoryDraft(body=row["text"], title=" · ".join(title_bits) or None, source=source)


def load_queries(folder: Path) -> list[Query]:
    out = []
    for q in read_jsonl(folder / "queries.jsonl"):
        meta = q.get("meta") or {}
        if meta.get("unscorable"):
            continue
        out.append(
            Query(
                store=q["store"],
                qid=q["qid"],
                text=q["query"],
                relevant=frozenset(q.get("relevant") or ()),
                answerable=bool(q.get("answerable", True)),
                kind=q.get("kind") or "all",
                exclude_recommended=bool(meta.get("exclude_recommended")),
            )
        )
    return out


def load_folder(
    store: SQLiteStore,
    embedder: Embedder,
    folder: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Principal]:
    """Load every bench `store` as an organisation; returns a read principal per store."""
    by_store: dict[str, list[tuple[str, MemoryDraft]]] = defaultdict(list)
    for row in read_jsonl(folder / "memories.jsonl"):
        by_store[row["store"]].append((row["id"], memory_draft(row)))
    principals = {}
    for name, items in by_store.items():
        org = store.create_org(name)
        minted = mint_key(store, org.id, "bench", frozenset({"memory:read"}), frozenset())
        save_many(store, embedder, org.id, items, author="bench")
        principals[name] = Principal(org.id, minted.key.id, minted.key.scopes, minted.key.roles)
        if progress:
            progress(f"loaded {name}: {len(items)} memories")
    return principals


def score_query(q: Query, ranked: list[str]) -> dict[str, float]:
    hits = [i for i, mid in enumerate(ranked) if mid in q.relevant]
    first = hits[0] if hits else None
    dcg = sum(1 / math.log2(i + 2) for i in hits if i < 5)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(q.relevant), 5)))
    return {
        "recall@1": float(first is not None and first < 1),
        "recall@3": float(first is not None and first < 3),
        "recall@5": float(first is not None and first < 5),
        "ndcg@5": dcg / ideal if ideal else 0.0,
        "mrr@10": 1 / (first + 1) if first is not None and first < 10 else 0.0,
    }


def summarise(rows: list[tuple[Query, list[str]]]) -> dict[str, Any]:
    answerable = [(q, r) for q, r in rows if q.answerable]
    empty_gold = [(q, r) for q, r in rows if not q.answerable]
    out: dict[str, Any] = {"n": len(rows), "n_answerable": len(answerable)}
    per = [score_query(q, r) for q, r in answerable]
    for metric in ("recall@1", "recall@3", "recall@5", "ndcg@5", "mrr@10"):
        out[metric] = round(statistics.fmean(p[metric] for p in per), 4) if per else None
    out["abstention"] = (
        round(sum(not r for _, r in empty_gold) / len(empty_gold), 4) if empty_gold else None
    )
    out["false_empty"] = (
        round(sum(not r for _, r in answerable) / len(answerable), 4) if answerable else None
    )
    return out


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pick(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(math.ceil(p * len(ordered))) - 1)], 3)

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}


def run(
    folder: Path,
    embedder: Embedder,
    settings: SearchSettings | None = None,
    modes: Iterable[str] = MODES,
    db_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
    stores: set[str] | None = None,
) -> dict[str, Any]:
    tmp = None
    if db_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="relay-bench-")
        db_path = Path(tmp.name) / "bench.db"
    store = SQLiteStore(db_path)
    try:
        t = time.perf_counter()
        principals = load_folder(store, embedder, folder, progress)
        load_s = time.perf_counter() - t
        queries = [q for q in load_queries(folder) if q.store in principals]
        if stores:
            queries = [q for q in queries if q.store in stores]
        searcher = Searcher(store, embedder, settings)
        result: dict[str, Any] = {
            "dataset": folder.name,
            "memories": sum(1 for _ in read_jsonl(folder / "memories.jsonl")),
            "queries": len(queries),
            "load_s": round(load_s, 1),
            "modes": {},
        }
        for mode in modes:
            rows: list[tuple[Query, list[str]]] = []
            times: list[float] = []
            for q in queries:
                response = searcher.search(
                    principals[q.store],
                    q.text,
                    K,
                    10_000,
                    mode,
                    use_cache=False,  # type: ignore[arg-type]
                )
                times.append(response.took_ms)
                rows.append((q, [h.id for h in response.results]))
            scored = [(q, r) for q, r in rows if not q.exclude_recommended]
            kinds = sorted({q.kind for q, _ in rows})
            result["modes"][mode] = {
                "overall": summarise(scored),
                "by_kind": {
                    k: summarise([(q, r) for q, r in scored if q.kind == k]) for k in kinds
                },
                "excluded_recommended": summarise(
                    [(q, r) for q, r in rows if q.exclude_recommended]
                ),
                "search_ms": percentiles(times),
            }
            if progress:
                o = result["modes"][mode]["overall"]
                progress(f"{mode}: recall@5 {o['recall@5']} abstention {o['abstention']}")
        searcher.close()
        return result
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()


def render_table(result: dict[str, Any]) -> str:
    """A Markdown table per mode: overall and every kind slice."""
    lines = [
        f"### {result['dataset']}: {result['memories']} memories, {result['queries']} queries",
        "",
    ]
    cols = (
        "n",
        "recall@1",
        "recall@3",
        "recall@5",
        "ndcg@5",
        "mrr@10",
        "abstention",
        "false_empty",
    )
    lines.append("| mode | slice | " + " | ".join(cols) + " |")
    lines.append("|---" * (len(cols) + 2) + "|")
    for mode, m in result["modes"].items():
        for name, f in [("overall", m["overall"]), *m["by_kind"].items()]:
            cells = [
                "–" if f.get(c) is None else f"{f[c]:.3f}" if c != "n" else str(f[c]) for c in cols
            ]
            lines.append(f"| {mode} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| mode | search p50 ms | p95 | p99 |")
    lines.append("|---|---|---|---|")
    for mode, m in result["modes"].items():
        s = m["search_ms"]
        lines.append(f"| {mode} | {s['p50']} | {s['p95']} | {s['p99']} |")
    return "\n".join(lines)
