"""`relay bench`: benchmarks; results go to BENCHMARKS.md with the command that made them."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from relay.cli.common import (
    echo_json,
    embedder_option,
    figures_json_option,
    pin_blas,
)
from relay.cli_types import StrictFloat, StrictInt
from relay.hook.config import DEADLINE_MAX_MS, DEADLINE_MIN_MS
from relay.key_file import given_key, key_file_option


@click.group()
def bench() -> None:
    """Benchmarks; results go to BENCHMARKS.md with the command that produced them."""
    pin_blas()  # here, before any subcommand's imports load numpy


def _bench_embedder(provider: str):  # noqa: ANN202
    from relay.embedding import load_embedder

    return load_embedder(provider, 1)


def _progress(message: str) -> None:
    click.echo(message, err=True)


@bench.command("recall")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@figures_json_option
@embedder_option
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(["hybrid", "lexical", "semantic"]),
    help="Modes to run (default: all three).",
)
def bench_recall(
    folder: Path, json_path: Path | None, embedder: str, modes: tuple[str, ...]
) -> None:
    """Recall@k, nDCG, MRR, abstention and search time on a ../shared/bench folder."""
    from relay import bench_recall as br

    for name in ("memories.jsonl", "queries.jsonl"):
        if not (folder / name).is_file():
            raise click.UsageError(f"{folder} has no {name}: is it a ../shared/bench folder?")

    result = br.run(
        folder,
        _bench_embedder(embedder),
        modes=modes or ("hybrid", "lexical", "semantic"),
        progress=_progress,
    )
    result["embedder"] = embedder
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(br.render_table(result))


def _integers(option: str, text: str) -> list[int]:
    """A comma-separated list of whole numbers of 1 or more, each read as an integer option
    reads one (`StrictInt`): int() took `1_000` as 1000, ` 2` or `+3` too, and a number past
    Python's 4,300-digit limit as a traceback."""
    one = StrictInt(min=1)
    try:
        return [one.convert(part, None, None) for part in text.split(",")]
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=option) from exc


@bench.command("search")
@click.option(
    "--store",
    "kind",
    type=click.Choice(["sqlite", "postgresql"]),
    default="sqlite",
    show_default=True,
    help="Store to measure.",
)
@click.option(
    "--layout",
    type=click.Choice(["one-org", "orgs100"]),
    help="one-org: all memories in one organisation (SQLite only; the default there). "
    "orgs100: 100 organisations, one holding 40%, one 1% (the default for postgresql); "
    "measures both, with recall, HTTP and two-replica throughput.",
)
@click.option(
    "--memories",
    "n",
    type=StrictInt(1),
    default=100_000,
    show_default=True,
    help="Memories in all (one passage each).",
)
@click.option(
    "--sizes",
    help="orgs100: comma-separated sizes measured in turn as one database grows "
    "(e.g. 100000,300000); overrides --memories.",
)
@figures_json_option
@embedder_option
@click.option(
    "--db",
    help="Keep the database here and reuse it (a size already loaded is not ingested "
    "again; rows from before token matrices get theirs first): a SQLite file, or for "
    "postgresql a postgresql:// URL or a folder where a local pgserver keeps its data. "
    "Default: a throwaway one.",
)
@click.option(
    "--bench-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The shared bench folder (default ../shared/bench).",
)
@click.option(
    "--clients",
    default="4,16,32",
    show_default=True,
    help="orgs100: concurrent clients per throughput level (two replicas).",
)
@click.option(
    "--seconds",
    type=StrictFloat(0.1),
    default=15.0,
    show_default=True,
    help="orgs100: seconds per throughput level.",
)
@click.option(
    "--rounds",
    type=StrictInt(1),
    default=1,
    show_default=True,
    help="orgs100: passes over the queries in-process.",
)
def bench_search(
    kind: str,
    layout: str | None,
    n: int,
    sizes: str | None,
    json_path: Path | None,
    embedder: str,
    db: str | None,
    bench_dir: Path | None,
    clients: str,
    seconds: float,
    rounds: int,
) -> None:
    """Search latency (in-process and over HTTP) and server memory at scale.

    SQLite by default, one organisation. With --layout orgs100 (always for postgresql)
    the memories are spread over 100 organisations and each search stage, the small
    and big orgs' recall against exact search, the HTTP round trip and the throughput
    of two `relay serve` replicas are measured; the load average is recorded with them.
    """
    from relay import bench_search as bs

    layout = layout or ("orgs100" if kind == "postgresql" else "one-org")
    if layout == "one-org":
        if kind != "sqlite":
            raise click.UsageError("--layout one-org is SQLite's; postgresql uses orgs100")
        if sizes:
            raise click.UsageError("--sizes needs --layout orgs100; use --memories")
        result = bs.run(n, _bench_embedder(embedder), bench_dir or bs.BENCH, db, progress=_progress)
    else:
        from relay import bench_orgs

        sizes_list = _integers("--sizes", sizes or str(n))
        client_levels = tuple(_integers("--clients", clients))
        if min(sizes_list) < bench_orgs.ORGS:
            raise click.UsageError(f"orgs100 needs at least {bench_orgs.ORGS} memories")
        result = bench_orgs.run(
            kind,
            sizes_list,
            _bench_embedder(embedder),
            bench_dir or bs.BENCH,
            db,
            progress=_progress,
            clients=client_levels,
            seconds=seconds,
            rounds=rounds,
        )
    result["embedder"] = embedder
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    echo_json(result)


@bench.command("hook")
@click.option("--url", help="A running server to measure against (default: start one).")
@click.option("--key", help="A memory:read key for --url.")
@key_file_option
@click.option(
    "--memories",
    type=StrictInt(1),
    default=None,
    help="Memories in the server started here [default 10000]; with --url, a label for the report.",
)
@click.option("--runs", type=StrictInt(0), default=200, show_default=True, help="Latency rounds.")
@click.option(
    "--fault-runs",
    type=StrictInt(0),
    default=100,
    show_default=True,
    help="Runs per fault kind.",
)
@click.option(
    "--deadline-ms",
    type=StrictInt(DEADLINE_MIN_MS, DEADLINE_MAX_MS),
    default=400,
    show_default=True,
    help="The hook's DEADLINE_MS (what the hook accepts: a shorter one could never search).",
)
@figures_json_option
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="Build the bench database here and keep it; reuse it when it exists.",
)
def bench_hook(
    url: str | None,
    key: str | None,
    key_file: str | None,
    memories: int | None,
    runs: int,
    fault_runs: int,
    deadline_ms: int,
    json_path: Path | None,
    db: str | None,
) -> None:
    """Recall hook wall time (hit, skip) beside curl and Python floors, and the fault drill."""
    from relay.hook_bench import public, render, run

    key = given_key(key, key_file)
    if url and not key:
        raise click.UsageError("--url needs --key or --key-file")
    # A terminated benchmark must still stop the server it started (finally blocks run on exit).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    progress = lambda message: click.echo(message, err=True)  # noqa: E731
    try:
        result = run(memories, url, key, runs, fault_runs, deadline_ms, progress, db)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if json_path:
        json_path.write_text(json.dumps(public(result), indent=2) + "\n")
    click.echo(render(result, deadline_ms))
    bad = [k for k, f in result.get("faults", {}).items() if f["ok"] != f["runs"]]
    if bad:
        raise click.ClickException(f"fault runs not ok: {', '.join(bad)}")
