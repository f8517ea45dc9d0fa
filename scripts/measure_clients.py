"""What the user feels of Relay in the real Claude Code: time to the model request and to the
first token, with no hook, with the Relay hook on a hit, on a skip, and against a hung server.

    .venv/bin/python scripts/measure_clients.py                 # 30 runs per condition
    .venv/bin/python scripts/measure_clients.py --runs 10 --json /tmp/clients.json

Needs the pinned clients (`npm ci --prefix e2e`, done by scripts/setup.sh --dev). Starts
`relay serve` on a temporary SQLite file with the `clients` suite's memories, the fake
Messages API from tests/clients_support.py (it answers at once, so the model's own latency is
zero), and runs `claude -p PROMPT --output-format json` in a fresh session per run, one run
of each condition in turn so that load on the machine falls on all of them alike:

- no_hook: a HOME where Relay was never installed;
- mcp_only: `relay install`ed, then Relay's two hook entries removed from settings.json: what
  the `relay mcp` server that Claude Code starts with every session costs by itself;
- hit: `relay install`ed, a prompt that needs a memory (the hook searches and injects it);
- skip: installed, "continue" (gated: too short to search; no network);
- hung: installed, the config pointing at a server that accepts and never answers, the
  breaker state removed before each run so every run meets the 400 ms deadline;
- hung_breaker_open (--with-breaker): the same without removing it, so after three
  failures the breaker skips the network.

Reported per condition: Claude Code's own `time_to_request_ms` (from the prompt's submission
to the request leaving; UserPromptSubmit hooks run in between) and `ttft_ms` (to the first
streamed token), median and p95 (nearest rank), and each median's difference to no_hook;
also the wall time from spawning `claude` to the request reaching the fake API (covers the
SessionStart hook too, and the client's own start-up) and the Relay hook's own time for the
prompt from its outcome log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from clients_support import (  # noqa: E402
    CLAUDE_VERSION,
    ClaudeClient,
    FakeModelApi,
    HungServer,
    client_bin,
    missing_clients_message,
)

NEEDED = "which cluster do we deploy staging to?"
SKIPPED = "continue"


def start_relay(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    from conftest import start_server  # tests/conftest.py: `relay serve` on a free port

    live = start_server(tmp / "relay.db")
    return live.process, live.url, live.admin_key


def seed(url: str, key: str) -> None:
    import httpx
    from test_real_clients import CLUSTERS, PROFILE, RUNBOOK

    for fields in (
        {"body": CLUSTERS, "title": "Clusters", "source": "team/infra"},
        {"body": RUNBOOK, "title": "Staging deploys", "source": "team/runbooks"},
        {"body": PROFILE, "title": "Workflow", "source": "team/process", "pinned": True},
    ):
        done = httpx.post(
            f"{url}/v1/memories",
            json=fields,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        done.raise_for_status()


def drop_hooks(home: Path) -> None:
    settings = home / ".claude/settings.json"
    doc = json.loads(settings.read_text())
    doc.pop("hooks")
    settings.write_text(json.dumps(doc))


def install(home: Path, url: str, key: str) -> None:
    (home / "work").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["HOME"] = str(home)
    relay = str(Path(sys.executable).parent / "relay")
    done = subprocess.run(
        [relay, "install", "--url", url, "--key", key, "--agent", "claude-code"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"relay install failed: {done.stderr}")


def point_at(home: Path, url: str) -> None:
    config = home / ".relay/config.json"
    doc = json.loads(config.read_text())
    doc["url"] = url
    config.write_text(json.dumps(doc))


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 1),
        "p95": round(pct(values, 95), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per condition (default 30)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--with-breaker", action="store_true", help="add hung_breaker_open (the breaker skips)"
    )
    args = parser.parse_args()
    if not client_bin("claude").exists():
        raise SystemExit(missing_clients_message(["claude"]))

    tmp = Path(tempfile.mkdtemp(prefix="relay-measure-clients-"))
    relay_proc, url, key = start_relay(tmp)
    api = FakeModelApi()
    hung = HungServer()
    client = ClaudeClient(api)
    try:
        seed(url, key)
        homes: dict[str, Path] = {}
        conditions = ["no_hook", "mcp_only", "hit", "skip", "hung"]
        if args.with_breaker:
            conditions.append("hung_breaker_open")
        for name in conditions:
            home = tmp / name
            if name == "no_hook":
                (home / "work").mkdir(parents=True)
            else:
                install(home, url, key)
            if name == "mcp_only":
                drop_hooks(home)
            if name.startswith("hung"):
                point_at(home, hung.url)
            homes[name] = home
        prompts = {name: SKIPPED if name == "skip" else NEEDED for name in conditions}
        samples: dict[str, dict[str, list[float]]] = {
            name: {
                "time_to_request_ms": [],
                "ttft_ms": [],
                "spawn_to_request_ms": [],
                "hook_ms": [],
            }
            for name in conditions
        }
        outcomes: dict[str, dict[str, int]] = {name: {} for name in conditions}
        load_before = os.getloadavg()
        started = time.monotonic()
        for i in range(args.runs):
            for name in conditions:
                home = homes[name]
                if name == "hung":
                    (home / ".relay/state/breaker.json").unlink(missing_ok=True)
                mark = api.mark()
                spawned = time.monotonic()
                turn = client.run(home, name, prompts[name])
                if turn.run.returncode != 0 or not turn.result:
                    raise SystemExit(f"run {i} of {name} failed:\n{turn.describe()}")
                calls = api.turns(mark)
                got = samples[name]
                got["time_to_request_ms"].append(turn.result["time_to_request_ms"])
                got["ttft_ms"].append(turn.result["ttft_ms"])
                if calls:
                    got["spawn_to_request_ms"].append((calls[0].at - spawned) * 1000)
                for logged in turn.outcomes:
                    if logged.get("event") == "prompt":
                        got["hook_ms"].append(logged["ms"]["total"])
                        key_ = logged["outcome"] + (
                            f"/{logged['reason']}" if logged.get("reason") else ""
                        )
                        outcomes[name][key_] = outcomes[name].get(key_, 0) + 1
            print(f"round {i + 1}/{args.runs} done", file=sys.stderr, flush=True)
        elapsed = time.monotonic() - started
        load_after = os.getloadavg()
    finally:
        api.close()
        hung.close()
        relay_proc.terminate()
        relay_proc.wait(10)

    figures = {
        name: {metric: summary(values) for metric, values in metrics.items()}
        for name, metrics in samples.items()
    }
    base = figures["no_hook"]
    rows = []
    for name in conditions:
        f = figures[name]

        def cell(metric: str, f: dict = f, name: str = name) -> str:
            s = f[metric]
            if not s["n"]:
                return "-"
            delta = s["median"] - base[metric]["median"] if base[metric]["n"] else 0
            sign = "" if name == "no_hook" else f" ({delta:+.0f})"
            return f"{s['median']:.0f}{sign} / {s['p95']:.0f}"

        hook = f["hook_ms"]
        hook_cell = f"{hook['median']:.0f} / {hook['p95']:.0f}" if hook["n"] else "-"
        outcome = ", ".join(f"{k} {v}" for k, v in sorted(outcomes[name].items())) or "-"
        rows.append(
            f"| {name} | {cell('time_to_request_ms')} | {cell('ttft_ms')} | "
            f"{cell('spawn_to_request_ms')} | {hook_cell} | {outcome} |"
        )
    print(
        f"\nClaude Code {CLAUDE_VERSION}, {args.runs} runs per condition, interleaved; "
        f"{elapsed:.0f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} cores)\n"
    )
    print(
        "| condition | time_to_request_ms median (Δ no hook) / p95 | ttft_ms median (Δ) / p95 "
        "| spawn → request at the API, ms, median (Δ) / p95 | Relay hook ms median / p95 "
        "| hook outcomes |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "claude_code": CLAUDE_VERSION,
                    "runs": args.runs,
                    "load_before": load_before,
                    "load_after": load_after,
                    "figures": figures,
                    "outcomes": outcomes,
                    "samples": samples,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
