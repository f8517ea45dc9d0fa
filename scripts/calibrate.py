"""Fit the relevance model's weights on development splits only, and print them.

    .venv/bin/python scripts/calibrate.py            # all three folders

Runs the real pipeline with the threshold at 0 on the *development* split of
each bench folder (the first 3 stores in sorted order for LoCoMo, the
odd-numbered conversations of coding_prompts) and fits, in two steps, one
logistic model over `relay.search.Features`:

1. a ranker over every inspected candidate (relevant or not; for unanswerable
   queries every candidate is a negative), which orders a query's candidates;
2. a gate over each query's top candidate (by the ranker): "is there anything
   to answer?", with answerable queries whose top 5 hold a relevant memory as
   positives and unanswerable queries as negatives. It sees the ranker's score
   and the features again, so it can weigh differently what tells a near miss
   from an answer (the names, the background) than what orders candidates.

Both are linear in the features, so they collapse into one set of weights:
sigmoid(g0 + g1 * (r0 + r.x) + g.x). That is the calibrated relevance the
threshold is applied to, and what a hit's score reports. The lexical-only
model (no cosine) is fitted the same way on lexical-mode runs, and the
cosine-only one (no MaxSim, for a query whose candidates' token matrices are
not backfilled yet) on the hybrid runs without that feature. The benchmark
then reports every store, with the held-out figures beside the overall ones.

The wrong-person gate (`topic_elsewhere`, `words_elsewhere`, query-level) is not fitted:
a likelihood fit, dominated by the many answerable questions, gives it about a third of
the weight at which it starts to abstain on near misses. Its weights are settings chosen
on the dev split with scripts/tune.py and are carried over unchanged from `relay.search`.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

from relay.bench_recall import Query, load_folder, load_queries
from relay.embedding import load_embedder
from relay.search import Features, Searcher, SearchSettings, Weights
from relay.store.sqlite import SQLiteStore

BENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "bench"
FOLDERS = ["locomo_observations", "locomo_turns", "coding_prompts"]
DENSE = ("cosine", "lift", "gap", "maxsim")
GATE = ("topic_elsewhere", "words_elsewhere")  # chosen on dev by tune.py, not fitted
NAMES = tuple(f.name for f in dataclasses.fields(Weights) if f.name not in ("bias", *GATE))


def dev_split(folder: str, queries: list[Query]) -> list[Query]:
    """The development queries of a folder (the same rule as `relay.bench_recall.is_dev`)."""
    from relay.bench_recall import dev_query_ids

    dev = dev_query_ids(folder, queries)
    return [q for q in queries if q.qid in dev]


def vector(f: Features, names: tuple[str, ...]) -> list[float]:
    return [float(getattr(f, n) or 0.0) for n in names]


def collect(folder: Path, embedder, tmp: Path) -> dict[str, list]:  # noqa: ANN001
    """Per mode, [(query, [(memory_id, features)])] for every dev query, threshold 0."""
    store = SQLiteStore(tmp / f"{folder.name}.db")
    principals = load_folder(store, embedder, folder)
    searcher = Searcher(store, embedder, dataclasses.replace(SearchSettings(), threshold=0.0))
    current: dict[str, list] = {}
    searcher.observe = lambda q, scored: current.__setitem__("scored", scored)
    out: dict[str, list] = {"hybrid": [], "lexical": []}
    for q in dev_split(folder.name, load_queries(folder)):
        if q.exclude_recommended:
            continue
        for mode, rows in out.items():
            current.clear()
            searcher.search(principals[q.store], q.text, 10, 10_000, mode, use_cache=False)  # type: ignore[arg-type]
            rows.append((q, [(p.memory_id, f) for p, f, _ in current.get("scored", [])]))
    searcher.close()
    store.close()
    return out


def fit(rows, names: tuple[str, ...], fixed: Weights) -> Weights:  # noqa: ANN001
    from sklearn.linear_model import LogisticRegression

    x = np.array([vector(f, names) for q, cands in rows for _, f in cands])
    y = np.array([int(m in q.relevant) for q, cands in rows for m, _ in cands])
    ranker = LogisticRegression(C=10.0, max_iter=5000).fit(x, y)
    gx, gy = [], []
    for q, cands in rows:
        if not cands:
            continue
        feats = np.array([vector(f, names) for _, f in cands])
        s = ranker.decision_function(feats)
        order = np.argsort(-s)
        if q.answerable and not any(cands[j][0] in q.relevant for j in order[:5]):
            continue  # nothing findable: teaches the gate nothing either way
        gx.append(np.r_[s[order[0]], feats[order[0]]])
        gy.append(int(q.answerable))
    gate = LogisticRegression(C=10.0, max_iter=5000).fit(np.array(gx), np.array(gy))
    g1, g = gate.coef_[0][0], gate.coef_[0][1:]
    bias = gate.intercept_[0] + g1 * ranker.intercept_[0]
    w = g1 * ranker.coef_[0] + g
    return Weights(
        bias=round(float(bias), 3),
        **{n: round(float(v), 3) for n, v in zip(names, w, strict=True)},
        **{n: getattr(fixed, n) for n in GATE},
    )


def main() -> None:
    embedder = load_embedder("onnx", 2)
    hybrid, lexical = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[1:] or FOLDERS:
            rows = collect(BENCH / name, embedder, Path(tmp))
            hybrid += rows["hybrid"]
            lexical += rows["lexical"]
            n = sum(len(c) for _, c in rows["hybrid"])
            print(f"{name}: {len(rows['hybrid'])} queries, {n} candidates", file=sys.stderr)
    s = SearchSettings()
    print(f"HYBRID_WEIGHTS = {fit(hybrid, NAMES, s.hybrid)!r}")
    print(f"POOLED_WEIGHTS = {fit(hybrid, tuple(n for n in NAMES if n != 'maxsim'), s.pooled)!r}")
    print(
        f"LEXICAL_WEIGHTS = {fit(lexical, tuple(n for n in NAMES if n not in DENSE), s.lexical)!r}"
    )


if __name__ == "__main__":
    main()
