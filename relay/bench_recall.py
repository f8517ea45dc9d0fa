"""`relay bench recall`: retrieval quality and search time on a ../shared/bench-format folder.

Each `store` becomes its own organisation, loaded through the production write
path (validation, passages, embeddings, the store), and every query runs
through the real search pipeline with a read key of that organisation, once
per mode (hybrid, lexical, semantic) in the same run. The cache is bypassed so
each query pays its real cost.
"""

from __future__ import annotations

import dataclasses
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
from relay.hook_stats import percentiles
from relay.hygiene import MAX_TITLE_CHARS
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
    session: str | None = None


def read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def memory_draft(row: dict[str, Any], previous: dict[str, Any] | None = None) -> MemoryDraft:
    """How a benchmark record becomes a memory, the way a team import would write it down.

    - A note keeps its text as the body; who said it and when go into the title.
    - A transcript line ("Name: ...") also carries, in its title, the line it answers
      (`previous`, the record before it in the same conversation and session): a reply
      such as "Adoption agencies!" means nothing without the question before it. The
      title is indexed and embedded with the passage but the body stays the line itself.
    - A rule or decision filed under a heading or topic gets that heading as its title and
      its file as its source.
    """
    meta = row.get("meta") or {}
    text = row["text"]
    speaker = meta.get("speaker")
    bits = [str(meta[k]) for k in ("speaker", "date_time") if meta.get(k)]
    if speaker and previous is not None and text.startswith(f"{speaker}:"):
        bits.append(f"re {previous['text']}")
    title = _clip(" · ".join(bits), MAX_TITLE_CHARS) if bits else None
    if title is None and (meta.get("heading") or meta.get("topic")):
        title = _clip(str(meta.get("heading") or meta.get("topic")), MAX_TITLE_CHARS)
    if "session" in meta:
        source = f"{row['store']}/session-{meta['session']}"
    else:
        source = meta.get("source_file") or row["store"]
    return MemoryDraft(body=text, title=title, source=source)


def memory_drafts(rows: Iterable[dict[str, Any]]) -> Iterable[tuple[dict[str, Any], MemoryDraft]]:
    """Every record with its draft; each record sees the one before it in its conversation."""
    last: dict[tuple[str, object], dict[str, Any]] = {}
    for row in rows:
        key = (row["store"], (row.get("meta") or {}).get("session"))
        yield row, memory_draft(row, last.get(key))
        last[key] = row


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


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
                session=str(meta["session"]) if meta.get("session") is not None else None,
            )
        )
    return out


DEV_STORES = 3  # of a many-store folder, the first this many (sorted) are for development


def dev_query_ids(folder: str, queries: list[Query]) -> set[str]:
    """The development split the settings may be tuned on; everything else is held out.

    Many stores: the first `DEV_STORES` in sorted order. One store: the odd-numbered
    conversations (`meta.session` "s01", "s03", ...). Otherwise nothing.
    """
    stores = sorted({q.store for q in queries})
    if len(stores) > 1:
        dev = set(stores[:DEV_STORES])
        return {q.qid for q in queries if q.store in dev}
    out = set()
    for q in queries:
        digits = "".join(ch for ch in q.session or "" if ch.isdigit())
        if digits and int(digits) % 2 == 1:
            out.add(q.qid)
    return out


def load_folder(
    store: SQLiteStore,
    embedder: Embedder,
    folder: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Principal]:
    """Load every bench `store` as an organisation; returns a read principal per store."""
    by_store: dict[str, list[tuple[str, MemoryDraft]]] = defaultdict(list)
    for row, draft in memory_drafts(read_jsonl(folder / "memories.jsonl")):
        by_store[row["store"]].append((row["id"], draft))
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
        dev = dev_query_ids(folder.name, queries)
        held_out = {q.qid for q in queries} - dev
        result: dict[str, Any] = {
            "dataset": folder.name,
            "memories": sum(1 for _ in read_jsonl(folder / "memories.jsonl")),
            "queries": len(queries),
            "held_out_queries": len(held_out),
            "load_s": round(load_s, 1),
            "settings": dataclasses.asdict(searcher.settings),
            "modes": {
                mode: evaluate(searcher, principals, queries, mode, held_out) for mode in modes
            },
        }
        if progress:
            for mode, m in result["modes"].items():
                o = m["overall"]
                progress(f"{mode}: recall@5 {o['recall@5']} abstention {o['abstention']}")
        searcher.close()
        return result
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()


def evaluate(
    searcher: Searcher,
    principals: dict[str, Principal],
    queries: list[Query],
    mode: str,
    held_out: set[str] | None = None,
) -> dict[str, Any]:
    """Every query through the pipeline in one mode; figures overall and per kind, and the
    same for the held-out queries alone when `held_out` (their qids) is given."""
    rows: list[tuple[Query, list[str]]] = []
    times: list[float] = []
    for q in queries:
        response = searcher.search(
            principals[q.store],
            q.text,
            K,
            10_000,
            mode,  # type: ignore[arg-type]
            use_cache=False,
        )
        times.append(response.took_ms)
        rows.append((q, [h.id for h in response.results]))
    out = figures(rows)
    out["search_ms"] = percentiles(times)
    if held_out is not None:
        held = figures([(q, r) for q, r in rows if q.qid in held_out])
        out["held_out"] = {"overall": held["overall"], "by_kind": held["by_kind"]}
    return out


def figures(rows: list[tuple[Query, list[str]]]) -> dict[str, Any]:
    scored = [(q, r) for q, r in rows if not q.exclude_recommended]
    kinds = sorted({q.kind for q, _ in rows})
    return {
        "overall": summarise(scored),
        "by_kind": {k: summarise([(q, r) for q, r in scored if q.kind == k]) for k in kinds},
        "excluded_recommended": summarise([(q, r) for q, r in rows if q.exclude_recommended]),
    }


def _cells(f: dict[str, Any], cols: tuple[str, ...]) -> list[str]:
    return ["–" if f.get(c) is None else str(f[c]) if c == "n" else f"{f[c]:.3f}" for c in cols]


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
        blocks = [(mode, m)]
        if "held_out" in m:
            blocks.append((f"{mode}, held-out", m["held_out"]))
        for label, b in blocks:
            for name, f in [("overall", b["overall"]), *b["by_kind"].items()]:
                lines.append(f"| {label} | {name} | " + " | ".join(_cells(f, cols)) + " |")
        if m.get("excluded_recommended", {}).get("n"):
            f = m["excluded_recommended"]
            lines.append(f"| {mode} | audit-excluded | " + " | ".join(_cells(f, cols)) + " |")
    lines.append("")
    lines.append("| mode | search p50 ms | p95 | p99 |")
    lines.append("|---|---|---|---|")
    for mode, m in result["modes"].items():
        s = m["search_ms"]
        lines.append(f"| {mode} | {s['p50']} | {s['p95']} | {s['p99']} |")
    return "\n".join(lines)
