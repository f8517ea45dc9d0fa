"""Explore search settings on the development split only (see calibrate.py for the split).

    cd scripts && ../.venv/bin/python tune.py locomo_observations threshold=0.1,0.2,0.3
    cd scripts && ../.venv/bin/python tune.py locomo_turns hybrid.gate.rival=-1,-3
    cd scripts && ../.venv/bin/python tune.py rules

Loads the folder once, then prints dev-split figures for each setting given
(one at a time, the others at their defaults). `hybrid.ranker.NAME`,
`hybrid.gate.NAME`, `hybrid.on_ranker` (and the same under `pooled.`, `lexical.`)
change one weight of a relevance model.

`rules` applies, in order, the rules that set the defaults after calibrate.py
has fitted the weights (BENCHMARKS.md "Recall"), printing every grid point:

1. the wrong-person gate (`topic_elsewhere`, `words_elsewhere`, in every model's gate),
   tried with thresholds: of the pairs that cost at most 1 point of dev recall@3 on both
   LoCoMo folders against no threshold and abstain on at least 0.9 of their dev
   foreign-conversation questions, the gate of the one with the most dev adversarial
   abstention on locomo_observations (then the most dev recall@3); for each gate,
   thresholds are tried upward until one costs more;
1b. `threshold`: at that gate, the lowest that abstains on at least 0.9 of both LoCoMo
   folders' dev foreign-conversation questions. The default threshold does what the issue
   asks of it and no more: near misses are the strict point's job, and spending the whole
   point of dev recall@3 on them (session 6: threshold 0.2) overshot it on held-out
   questions (-1.4), since dev (6 questions a point) cannot tell 0.1 from 0.2;
2. `relative`: the highest share that costs at most 0.5 point of dev recall@5 on every
   folder;
3. `min_score`: with that `relative`, the highest floor on a hit's score for which the two
   together still cost at most 0.5 point of dev recall@5 on every folder.

Then it prints the strict point: the lowest threshold, at that gate, with at least 0.8
dev adversarial abstention on locomo_observations.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from calibrate import BENCH, dev_split

from relay.bench_recall import K, Query, evaluate, figures, load_folder, load_queries
from relay.embedding import load_embedder
from relay.ranking import Model, judge
from relay.search import Searcher, SearchSettings, answer
from relay.store.sqlite import SQLiteStore


def with_setting(name: str, value: float) -> SearchSettings:
    return _replaced(SearchSettings(), name.split("."), value)


def _replaced(obj, path: list[str], value: float):  # noqa: ANN001, ANN202
    """`obj` with the field at the dotted `path` set to `value`, nested dataclasses rebuilt."""
    head, *rest = path
    if rest:
        return dataclasses.replace(obj, **{head: _replaced(getattr(obj, head), rest, value)})
    field = {f.name: f for f in dataclasses.fields(obj)}[head]
    return dataclasses.replace(obj, **{head: int(value) if field.type == "int" else value})


THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
STRICT = (0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
GATES = [(t, w) for t in (3, 5, 7, 9, 12, 15, 20) for w in (0, 2, 4, 6)]
RELATIVE = (0.02, 0.05, 0.1, 0.2, 0.3)
MIN_SCORES = (0.01, 0.02, 0.03, 0.05, 0.1)
LOCOMO = ("locomo_observations", "locomo_turns")


def with_gate(base: SearchSettings, topic: float, words: float) -> SearchSettings:
    def gate(m: Model) -> Model:
        g = dataclasses.replace(m.gate, topic_elsewhere=-topic, words_elsewhere=-words)
        return dataclasses.replace(m, gate=g)

    return dataclasses.replace(
        base, hybrid=gate(base.hybrid), pooled=gate(base.pooled), lexical=gate(base.lexical)
    )


def judged(name: str, embedder, tmp: Path) -> list[tuple[Query, list]]:  # noqa: ANN001
    """Every dev query of a folder with its inspected candidates (passage, features): none
    of the settings `rules` chooses changes which candidates are inspected, so each grid
    point replays only the judging (`relay.ranking.judge`, `answer`)."""
    store = SQLiteStore(tmp / f"{name}.db")
    principals = load_folder(store, embedder, BENCH / name)
    searcher = Searcher(store, embedder, dataclasses.replace(SearchSettings(), threshold=0.0))
    seen: list = []
    searcher.observe = lambda q, scored, pool: seen.append([(p, f) for p, f, _ in scored])
    out = []
    for q in dev_split(name, load_queries(BENCH / name)):
        seen.clear()
        searcher.search(principals[q.store], q.text, K, 10_000, use_cache=False)
        out.append((q, seen[0]))
    searcher.close()
    store.close()
    return out


def abstention(result: dict, kind: str) -> float | None:
    return result["by_kind"].get(kind, {}).get("abstention")


def rules() -> None:
    embedder = load_embedder("onnx", 2)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {name: judged(name, embedder, Path(tmp)) for name in (*LOCOMO, "coding_prompts")}

        def run(s: SearchSettings, names: tuple[str, ...] = LOCOMO) -> dict[str, dict]:
            out = {}
            for name in names:
                rows = []
                for q, cands in loaded[name]:
                    scores = judge([f for _, f in cands], s)
                    hits = answer([(p, x) for (p, _), x in zip(cands, scores, strict=True)], s, K)
                    rows.append((q, [h.id for h in hits]))
                out[name] = figures(rows)
            print(
                f"  {s.threshold=} {s.relative=} {s.min_score=} "
                f"gate={s.hybrid.gate.topic_elsewhere},"
                f"{s.hybrid.gate.words_elsewhere}: "
                + " ".join(
                    f"{n}: r3={r['overall']['recall@3']} r5={r['overall']['recall@5']} "
                    f"adversarial={abstention(r, 'adversarial')} "
                    f"foreign={abstention(r, 'foreign-conversation')}"
                    for n, r in out.items()
                ),
                flush=True,
            )
            return out

        def r3(result: dict[str, dict], name: str) -> float:
            return result[name]["overall"]["recall@3"]

        def adversarial(result: dict[str, dict]) -> float:
            return abstention(result["locomo_observations"], "adversarial")

        plain = dataclasses.replace(SearchSettings(), relative=0.0, min_score=0.0)
        base = run(with_gate(dataclasses.replace(plain, threshold=0.0), 0, 0))
        best: tuple[float, float, tuple[int, int], float] | None = None
        for topic, words in [(0, 0), *GATES]:
            for t in THRESHOLDS:
                r = run(with_gate(dataclasses.replace(plain, threshold=t), topic, words))
                if any(r3(base, n) - r3(r, n) > 0.01 + 1e-9 for n in LOCOMO):
                    break
                if any(abstention(r[n], "foreign-conversation") < 0.9 for n in LOCOMO):
                    continue
                key = (adversarial(r), r3(r, "locomo_observations"), (topic, words), t)
                best = max(best, key) if best else key
        assert best is not None, "no threshold keeps to 1 point of recall@3"
        topic, words = best[2]
        print(f"gate -{topic}, -{words} (chosen at threshold {best[3]})", flush=True)
        threshold = next(
            (
                t
                for t in THRESHOLDS
                if all(
                    abstention(r, "foreign-conversation") >= 0.9
                    for r in run(
                        with_gate(dataclasses.replace(plain, threshold=t), topic, words)
                    ).values()
                )
            ),
            None,
        )
        assert threshold is not None, "no threshold refuses 0.9 of foreign questions"
        print(f"threshold {threshold}", flush=True)
        gated = with_gate(dataclasses.replace(plain, threshold=threshold), topic, words)
        names = tuple(loaded)
        none = run(gated, names)

        def within_budget(s: SearchSettings) -> bool:
            r = run(s, names)
            return all(
                none[n]["overall"]["recall@5"] - r[n]["overall"]["recall@5"] <= 0.005 + 1e-9
                for n in names
            )

        relative = max(
            (x for x in RELATIVE if within_budget(dataclasses.replace(gated, relative=x))),
            default=0.0,
        )
        print(f"relative {relative}", flush=True)
        shared = dataclasses.replace(gated, relative=relative)
        min_score = max(
            (x for x in MIN_SCORES if within_budget(dataclasses.replace(shared, min_score=x))),
            default=0.0,
        )
        print(f"min_score {min_score}", flush=True)
        final = dataclasses.replace(shared, min_score=min_score)
        for t in STRICT:
            if adversarial(run(dataclasses.replace(final, threshold=t))) >= 0.8:
                print(f"strict threshold {t}", flush=True)
                break


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
