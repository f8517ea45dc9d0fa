"""Load drill: hook-like search traffic with a write mix on loopback, then overload.

Phase 1 (soak): `workers` threads replay hook searches (k=6, deadline_ms=350, hybrid,
queries drawn from a pool so the cache sees repeats) with a share of writes, for
`seconds`; figures: qps, p50/p95/p99, error rate, server RSS at start, peak and end.
Phase 2 (overload): a server with a small `max_inflight` is flooded; every answer must
be 200 or a fast 503 with `Retry-After`, and the real hook, run meanwhile, must still
return within its deadline (plus process start-up slack on this busy machine).
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from relay.drills.common import BIN, Served, percentile, request

TOPICS = (
    "how do we run database migrations on staging",
    "which cluster hosts the billing ledger",
    "what is the rollout process for the canary deploy",
    "where is the pager runbook for queue latency alerts",
    "how do I rotate the cache worker credentials safely",
    "what is the backup and restore schedule for the schema index",
    "who owns the latency budget for the search api",
    "why does the worker queue back up on mondays",
)


def seed_memories(url: str, key: str, n: int, rng: random.Random) -> None:
    words = " ".join(TOPICS).split()
    items = [
        {
            "id": f"load-{i}",
            "body": " ".join(rng.choice(words) for _ in range(30)) + f" fact {i}.",
            "source": f"drill/load/{i % 20}",
        }
        for i in range(n)
    ]
    for start in range(0, n, 128):
        status, _, data = request(
            url,
            "POST",
            "/v1/memories/batch",
            key,
            {"items": items[start : start + 128]},
            timeout=300,
        )
        if status != 200:
            raise RuntimeError(f"seeding failed: {status} {data}")


def _queries(rng: random.Random, n: int) -> list[str]:
    return [
        f"{rng.choice(TOPICS)} {rng.choice(['', 'again', 'today', 'for the team'])}".strip()
        for _ in range(n)
    ]


def traffic(
    url: str | list[str],
    key: str,
    seconds: float,
    workers: int,
    write_share: float,
    seed: int,
    deadline_ms: float = 350,
) -> dict[str, Any]:
    """Closed-loop load: each worker sends its next request when the last one answers."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    statuses: dict[int, int] = {}
    shed_lat: list[float] = []
    missing_retry_after = 0
    lock = threading.Lock()

    urls = [url] if isinstance(url, str) else url

    def worker(wid: int) -> None:
        nonlocal missing_retry_after
        url = urls[wid % len(urls)]  # replicas share the workers, as behind a balancer
        rng = random.Random(seed * 1000 + wid)
        pool = _queries(rng, 40)
        n = 0
        while time.monotonic() < stop:
            n += 1
            t0 = time.perf_counter()
            try:
                if rng.random() < write_share:
                    status, headers, _ = request(
                        url,
                        "POST",
                        "/v1/memories",
                        key,
                        {"body": f"load drill note {wid}-{n}: {rng.choice(TOPICS)}."},
                        timeout=10,
                    )
                else:
                    status, headers, _ = request(
                        url,
                        "POST",
                        "/v1/search",
                        key,
                        {"query": rng.choice(pool), "k": 6, "deadline_ms": deadline_ms},
                        timeout=10,
                    )
            except OSError:
                status, headers = 0, {}
            took = (time.perf_counter() - t0) * 1000
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 503:
                    shed_lat.append(took)
                    if "retry-after" not in headers:
                        missing_retry_after += 1
                else:
                    lat.append(took)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    total = sum(statuses.values())
    errors = sum(c for s, c in statuses.items() if s not in (200, 201, 503))
    return {
        "requests": total,
        "qps": round(total / elapsed, 1),
        "ok_qps": round((statuses.get(200, 0) + statuses.get(201, 0)) / elapsed, 1),
        "p50_ms": round(percentile(lat, 50), 1),
        "p95_ms": round(percentile(lat, 95), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "error_rate": round(errors / max(total, 1), 4),
        "shed_503": statuses.get(503, 0),
        "shed_p99_ms": round(percentile(shed_lat, 99), 1),
        "shed_without_retry_after": missing_retry_after,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def hook_runs(url: str, key: str, runs: int, deadline_ms: int, home: str) -> list[float]:
    """Wall time of the real hook, process start to exit; each run has fresh state (no
    throttle, no open breaker), so every run really asks the overloaded server."""
    from relay.hook_bench import hook_env, prompt_payload

    walls = []
    for i in range(runs):
        run_home = Path(home) / str(time.time_ns())
        run_home.mkdir(parents=True)
        env = hook_env(str(run_home), url, key, deadline_ms)
        payload = prompt_payload(f"{TOPICS[i % len(TOPICS)]} run {i}", f"s{time.time_ns()}", home)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [str(BIN / "relay-hook")], input=payload, env=env, capture_output=True, timeout=30
        )
        walls.append((time.perf_counter() - t0) * 1000)
        if proc.returncode != 0:
            walls[-1] = float("inf")
        out = proc.stdout.strip()
        if out:
            json.loads(out)
    return walls


def run(
    seconds: float,
    workers: int,
    memories: int,
    seed: int,
    overload_seconds: float,
    hook_slack_ms: float = 600,
    progress: Any = None,
    db: str | None = None,
    replicas: int = 1,
) -> dict[str, Any]:
    """Soak then overload; `db` may be a postgresql:// URL (an empty database: the first
    server creates the organisation) and `replicas` servers then share it."""
    rng = random.Random(seed)
    tmp = tempfile.TemporaryDirectory(prefix="relay-drill-load-")
    folder = Path(tmp.name)
    db = db or str(folder / "relay.db")
    result: dict[str, Any] = {
        "seed": seed,
        "workers": workers,
        "memories": memories,
        "replicas": replicas,
        "store": "postgresql" if db.startswith("postgres") else "sqlite",
    }
    servers = [Served(db, folder / "serve.log").start()]
    servers += [Served(db, folder / f"serve{i}.log").start() for i in range(1, replicas)]
    server = servers[0]
    try:
        key = server.admin_key
        seed_memories(server.url, key, memories, rng)
        if progress:
            progress(f"seeded {memories} memories; soaking {seconds:.0f} s with {workers} workers")
        rss: list[int] = [sum(s.rss_kib() for s in servers)]  # all replicas together
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(1.0):
                rss.append(sum(s.rss_kib() for s in servers))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result["soak"] = traffic([s.url for s in servers], key, seconds, workers, 0.1, seed)
        sampling.set()
        sampler.join()
        rss.append(sum(s.rss_kib() for s in servers))
        # Growth over the soak's second half (after warm-up), the bound the drill holds.
        half = rss[len(rss) // 2]
        result["soak"]["rss_mib"] = {
            "start": round(rss[0] / 1024, 1),
            "peak": round(max(rss) / 1024, 1),
            "end": round(rss[-1] / 1024, 1),
            "mid": round(half / 1024, 1),
        }
        result["soak"]["rss_growth_second_half_mib"] = round((rss[-1] - half) / 1024, 1)
    finally:
        for s in servers:
            s.stop()
    # Overload: the same database behind a server that admits only 2 requests at once.
    small = Served(db, folder / "serve-overload.log", {"RELAY_MAX_INFLIGHT": "2"}).start()
    try:
        deadline_ms = 400
        walls: list[float] = []
        box: dict[str, Any] = {}
        flood = threading.Thread(
            target=lambda: box.update(
                traffic(small.url, key, overload_seconds, workers * 3, 0.0, seed + 1)
            ),
            daemon=True,
        )
        flood.start()
        time.sleep(min(1.0, overload_seconds / 4))
        while flood.is_alive():
            walls += hook_runs(small.url, key, 3, deadline_ms, str(folder / "hook-home"))
        flood.join()
        result["overload"] = box
        result["overload"]["hook_runs"] = len(walls)
        result["overload"]["hook_wall_ms"] = {
            "p50": round(percentile(walls, 50), 1),
            "p95": round(percentile(walls, 95), 1),
            "max": round(max(walls), 1) if walls else 0.0,
        }
        result["overload"]["hook_deadline_ms"] = deadline_ms
        result["overload"]["hook_over_deadline_plus_slack"] = sum(
            w > deadline_ms + hook_slack_ms for w in walls
        )
        result["overload"]["hook_slack_ms"] = hook_slack_ms
        outcomes: dict[str, int] = {}
        for log in (folder / "hook-home").glob("*/state/outcomes.jsonl"):
            for line in log.read_text().splitlines():
                o = json.loads(line).get("outcome", "?")
                outcomes[o] = outcomes.get(o, 0) + 1
        result["overload"]["hook_outcomes"] = outcomes
    finally:
        small.stop()
        tmp.cleanup()
    return result


def failures(result: dict[str, Any], max_rss_growth_mib: float = 64) -> list[str]:
    """What makes the drill fail."""
    out = []
    soak, over = result["soak"], result["overload"]
    if soak["error_rate"] > 0:
        out.append(f"soak error rate {soak['error_rate']}: {soak['statuses']}")
    if soak["rss_growth_second_half_mib"] > max_rss_growth_mib:
        out.append(f"server RSS grew {soak['rss_growth_second_half_mib']} MiB in the second half")
    if over["error_rate"] > 0:
        out.append(f"overload answered errors other than 503: {over['statuses']}")
    if over["shed_without_retry_after"]:
        out.append(f"{over['shed_without_retry_after']} 503s without Retry-After")
    if over["shed_503"] == 0:
        out.append("overload never shed load")
    if over["hook_over_deadline_plus_slack"]:
        out.append(f"hook over its deadline + slack {over['hook_over_deadline_plus_slack']} times")
    return out
