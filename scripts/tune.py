"""Explore search settings on the development split only (see calibrate.py for the split).

    cd scripts && ../.venv/bin/python tune.py locomo_observations threshold=0.1,0.2,0.3
    cd scripts && ../.venv/bin/python tune.py locomo_turns hybrid.rival=-1,-3 rrf_k=5,20
    cd scripts && ../.venv/bin/python tune.py rules

Loads the folder once, then prints dev-split figures for each setting given
(one at a time, the others at their defaults). `hybrid.NAME` / `lexical.NAME`
change one weight of the relevance model.

`rules` applies, in order, the three rules that set the defaults after calibrate.py
has fitted the weights (BENCHMARKS.md "Recall"), printing every grid point:

1. `threshold`: the highest that costs at most 1 point of dev recall@3 on both LoCoMo
   folders, against no threshold (wrong-person gate off);
2. the gate (`topic_elsewhere`, `words_elsewhere`, in every weight set): the most dev
   adversarial abstention on locomo_observations that costs at most 2 points of dev
   recall@3 on either LoCoMo folder at that threshold;
3. `relative`: the highest share that costs at most 0.5 point of dev recall@5 on every
   folder.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from calibrate import BENCH, dev_split

from relay.bench_recall import evaluate, load_folder, load_queries
from relay.embedding import load_embedder
from relay.search import Searcher, SearchSettings, Weights
from relay.store.sqlite import SQLiteStore


def with_setting(name: str, value: float) -> SearchSettings:
    base = SearchSettings()
    if "." in name:
        group, weight = name.split(".", 1)
        weights = dataclasses.replace(getattr(base, group), **{weight: value})
        return dataclasses.replace(base, **{group: weights})
    field = {f.name: f for f in dataclasses.fields(base)}[name]
    return dataclasses.replace(base, **{name: int(value) if field.type == "int" else value})


THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
GATES = [(t, w) for t in (3, 5, 7, 9, 12) for w in (2, 4, 6)]
RELATIVE = (0.1, 0.2, 0.3, 0.4, 0.5)
LOCOMO = ("locomo_observations", "locomo_turns")


def with_gate(base: SearchSettings, topic: float, words: float) -> SearchSettings:
    def gate(w: Weights) -> Weights:
        return dataclasses.replace(w, topic_elsewhere=-topic, words_elsewhere=-words)

    return dataclasses.replace(
        base, hybrid=gate(base.hybrid), pooled=gate(base.pooled), lexical=gate(base.lexical)
    )


def rules() -> None:
    embedder = load_embedder("onnx", 2)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {}
        for name in (*LOCOMO, "coding_prompts"):
            store = SQLiteStore(Path(tmp) / f"{name}.db")
            queries = dev_split(name, load_queries(BENCH / name))
            loaded[name] = (store, load_folder(store, embedder, BENCH / name), queries)

        def run(s: SearchSettings, names: tuple[str, ...] = LOCOMO) -> dict[str, dict]:
            out = {}
            for name in names:
                store, principals, queries = loaded[name]
                out[name] = evaluate(Searcher(store, embedder, s), principals, queries, "hybrid")
            print(
                f"  {s.threshold=} {s.relative=} gate={s.hybrid.topic_elsewhere},"
                f"{s.hybrid.words_elsewhere}: "
                + " ".join(
                    f"{n}: r3={r['overall']['recall@3']} r5={r['overall']['recall@5']} "
                    f"adversarial={r['by_kind'].get('adversarial', {}).get('abstention')}"
                    for n, r in out.items()
                ),
                flush=True,
            )
            return out

        def r3(result: dict[str, dict], name: str) -> float:
            return result[name]["overall"]["recall@3"]

        plain = with_gate(dataclasses.replace(SearchSettings(), relative=0.0), 0, 0)
        base = run(dataclasses.replace(plain, threshold=0.0))
        threshold = 0.0
        for t in THRESHOLDS:
            r = run(dataclasses.replace(plain, threshold=t))
            if all(r3(base, n) - r3(r, n) <= 0.01 + 1e-9 for n in LOCOMO):
                threshold = t
        print(f"threshold {threshold}", flush=True)
        at = dataclasses.replace(plain, threshold=threshold)
        ungated = run(at)
        best: tuple[float, float, tuple[int, int]] | None = None
        for topic, words in GATES:
            r = run(with_gate(at, topic, words))
            if all(r3(ungated, n) - r3(r, n) <= 0.02 + 1e-9 for n in LOCOMO):
                key = (
                    r["locomo_observations"]["by_kind"]["adversarial"]["abstention"],
                    r3(r, "locomo_observations"),
                    (topic, words),
                )
                best = max(best, key) if best else key
        assert best is not None
        print(f"gate -{best[2][0]}, -{best[2][1]}", flush=True)
        gated = with_gate(at, *best[2])
        names = tuple(loaded)
        none = run(gated, names)
        relative = 0.0
        for share in RELATIVE:
            r = run(dataclasses.replace(gated, relative=share), names)
            if all(
                none[n]["overall"]["recall@5"] - r[n]["overall"]["recall@5"] <= 0.005 + 1e-9
                for n in names
            ):
                relative = share
        print(f"relative {relative}", flush=True)


def main() -> None:
    if sys.argv[1:] == ["rules"]:
        rules()
        return
    folder = BENCH / sys.argv[1]
    grid = []
    for spec in sys.argv[2:]:
        name, values = spec.split("=")
        grid += [(name, float(v)) for v in values.split(",")]
    embedder = load_embedder("onnx", 2)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "t.db")
        principals = load_folder(store, embedder, folder)
        queries = dev_split(folder.name, load_queries(folder))
        for name, value in grid or [("threshold", SearchSettings().threshold)]:
            settings = with_setting(name, value)
            r = evaluate(Searcher(store, embedder, settings), principals, queries, "hybrid")
            o = r["overall"]
            slices = " ".join(
                f"{k}:r3={v['recall@3']} abst={v['abstention']}" for k, v in r["by_kind"].items()
            )
            print(
                f"{name}={value}: r1={o['recall@1']} r3={o['recall@3']} r5={o['recall@5']} "
                f"abst={o['abstention']} fe={o['false_empty']} | {slices}",
                flush=True,
            )


if __name__ == "__main__":
    main()
