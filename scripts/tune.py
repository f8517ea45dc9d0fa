"""Explore search settings on the development split only (see calibrate.py for the split).

    cd scripts && ../.venv/bin/python tune.py locomo_observations threshold=0.1,0.2,0.3
    cd scripts && ../.venv/bin/python tune.py locomo_turns hybrid.rival=-1,-3 rrf_k=5,20

Loads the folder once, then prints dev-split figures for each setting given
(one at a time, the others at their defaults). `hybrid.NAME` / `lexical.NAME`
change one weight of the relevance model.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from calibrate import BENCH, dev_split

from relay.bench_recall import evaluate, load_folder, load_queries
from relay.embedding import load_embedder
from relay.search import Searcher, SearchSettings
from relay.store.sqlite import SQLiteStore


def with_setting(name: str, value: float) -> SearchSettings:
    base = SearchSettings()
    if "." in name:
        group, weight = name.split(".", 1)
        weights = dataclasses.replace(getattr(base, group), **{weight: value})
        return dataclasses.replace(base, **{group: weights})
    field = {f.name: f for f in dataclasses.fields(base)}[name]
    return dataclasses.replace(base, **{name: int(value) if field.type == "int" else value})


def main() -> None:
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
