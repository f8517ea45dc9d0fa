"""`relay drill ...`: reliability and security drills that print figures and exit 1 on any
loss or leak. Fast variants of each run in the test suite (tests/test_drills.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from relay.cli_types import StrictFloat, StrictInt


def _finish(title: str, result: dict[str, Any], problems: list[str]) -> None:
    click.echo(json.dumps(result, indent=2, default=str))
    if problems:
        click.echo(f"{title}: FAILED, {len(problems)} problem(s):", err=True)
        for p in problems[:20]:
            click.echo(f"  {p}", err=True)
        sys.exit(1)
    click.echo(f"{title}: ok", err=True)


def _progress(message: str) -> None:
    click.echo(message, err=True)


@click.group("drill")
def drill() -> None:
    """Reliability and security drills (load, crash, isolation, fuzz, safety)."""


@drill.command("isolation")
@click.option(
    "--ops", type=StrictInt(1), default=5000, show_default=True, help="Random operations to run."
)
@click.option(
    "--seed",
    type=StrictInt(),
    default=7,
    show_default=True,
    help="Random seed (the run is repeatable).",
)
@click.option("--db", help="Store URL (default: a fresh SQLite file; a postgresql:// URL works).")
def isolation_command(ops: int, seed: int, db: str | None) -> None:
    """Model-based isolation check: every search, read and history against a reference model."""
    from relay.drills import isolation

    result = isolation.run(ops, seed, db)
    _finish("isolation", result, result["leak_examples"] if result["leaks"] else [])


@drill.command("crash")
@click.option("--kills", type=StrictInt(1), default=50, show_default=True, help="kill -9 rounds.")
@click.option("--seed", type=StrictInt(), default=7, show_default=True, help="Random seed.")
def crash_command(kills: int, seed: int) -> None:
    """kill -9 `relay serve` during writes; check every acknowledged write after each restart."""
    from relay.drills import crash

    result = crash.run(kills, seed, progress=_progress)
    _finish("crash", result, result["loss_examples"] if result["losses"] else [])


# A phase's length in seconds, more than none: 0 or less measured nothing, or failed in sleep().
_LENGTH = StrictFloat(0, min_open=True)


@drill.command("load")
@click.option("--seconds", type=_LENGTH, default=600.0, show_default=True, help="Soak length.")
@click.option(
    "--workers", type=StrictInt(1), default=8, show_default=True, help="Concurrent client threads."
)
@click.option(
    "--memories", type=StrictInt(0), default=2000, show_default=True, help="Memories seeded first."
)
@click.option(
    "--overload-seconds", type=_LENGTH, default=30.0, show_default=True, help="Overload length."
)
@click.option(
    "--max-rss-growth-mib",
    type=StrictFloat(0),
    default=64.0,
    show_default=True,
    help="Allowed server RSS growth over the soak's second half.",
)
@click.option("--seed", type=StrictInt(), default=7, show_default=True, help="Random seed.")
@click.option("--db", help="An empty postgresql:// database to serve from (default: SQLite).")
@click.option(
    "--replicas", type=StrictInt(1), default=1, show_default=True, help="Servers sharing --db."
)
def load_command(
    seconds: float,
    workers: int,
    memories: int,
    overload_seconds: float,
    max_rss_growth_mib: float,
    seed: int,
    db: str | None,
    replicas: int,
) -> None:
    """Hook-like traffic soak with a write mix, then overload: 503 + Retry-After, hook on time."""
    from relay.drills import load

    result = load.run(
        seconds,
        workers,
        memories,
        seed,
        overload_seconds,
        progress=_progress,
        db=db,
        replicas=replicas,
    )
    _finish("load", result, load.failures(result, max_rss_growth_mib))


@drill.command("fuzz")
@click.option(
    "--examples",
    type=StrictInt(1),
    default=2000,
    show_default=True,
    help="Hypothesis inputs for the API.",
)
@click.option(
    "--hook-examples",
    type=StrictInt(1),
    default=300,
    show_default=True,
    help="Hypothesis inputs for the hook's stdin and again for its responses.",
)
@click.option(
    "--schemathesis-examples",
    type=StrictInt(0),
    default=50,
    show_default=True,
    help="Examples per operation for schemathesis (0: skip it).",
)
@click.option("--seed", type=StrictInt(), default=7, show_default=True, help="Random seed.")
def fuzz_command(examples: int, hook_examples: int, schemathesis_examples: int, seed: int) -> None:
    """Bad input: Hypothesis on the API and the hook, schemathesis from /openapi.json."""
    import tempfile
    from pathlib import Path

    from relay.drills import fuzz
    from relay.drills.common import Served

    result: dict[str, Any] = {
        "api": fuzz.api(examples, seed),
        "hook": fuzz.hook(hook_examples, seed),
    }
    problems = result["api"]["problems"] + result["hook"]["problems"]
    if schemathesis_examples:
        with tempfile.TemporaryDirectory(prefix="relay-drill-st-") as tmp:
            server = Served(str(Path(tmp) / "relay.db"), Path(tmp) / "serve.log").start()
            try:
                st = fuzz.schemathesis_run(
                    server.url,
                    server.admin_key,
                    schemathesis_examples,
                    seed,
                    Path(tmp) / "schemathesis.ndjson",
                )
            finally:
                server.stop()
        result["schemathesis"] = st
        if st["exit"] != 0:
            problems.append("schemathesis found failures (see its summary)")
    _finish("fuzz", result, problems)


@drill.command("safety")
def safety_command() -> None:
    """Secrets and safety: no key in any log, secrets refused, recalled text quoted, files 0600."""
    from relay.drills import safety

    result = safety.run()
    _finish("safety", result, result["problems"])
