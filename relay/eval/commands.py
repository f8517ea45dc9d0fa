"""`relay eval replay` and `relay eval faults`: does recall help, and does it fail safely."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from relay.cli_types import StrictInt
from relay.errors import InvalidRequestError, RelayError
from relay.hook.config import DEADLINE_MAX_MS, DEADLINE_MIN_MS
from relay.hook_bench import BENCH
from relay.key_file import given_key

if TYPE_CHECKING:
    from relay.eval.conversations import Conversation

# Errors are RelayErrors, so `relay` prints them as every command does ("relay: error: ...",
# with the class's exit code); click's UsageError stays for options that do not fit together.


def _progress(message: str) -> None:
    click.echo(message, err=True)


@contextmanager
def _stoppable() -> Iterator[None]:
    """A terminated run still stops the server it started (finally blocks run on exit)."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fresh(folder: Path) -> Path:
    """An empty folder for the hooks' HOMEs: no session state left from an earlier run."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _meta(dataset: str, deadline_ms: int, **more: Any) -> dict[str, Any]:
    from relay.eval.harness import git_commit, load_average

    return {
        "dataset": dataset,
        "deadline_ms": deadline_ms,
        "commit": git_commit(),
        "load_average": load_average(),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        **more,
    }


def _conversations(source: Path, count: int | None, seed: int, turns: int) -> list[Conversation]:
    """The conversations to replay; a bad row is one line naming the file and its line."""
    from relay.eval.conversations import load_conversations

    try:
        return load_conversations(source, count, seed, turns)
    except (ValueError, KeyError, OSError) as exc:
        raise InvalidRequestError(f"{source}: {exc}") from None


def _check_config(path: Path) -> None:
    """--config must be a config the hook reads as written: the hook falls back to the default
    for a file or knob it cannot read (a typo must not break a prompt), so a replay would
    measure the defaults under the file's name."""
    from relay.hook import codec
    from relay.hook import config as hook_config

    # The hook's own reading of a file, as `relay doctor` and --apply judge it: a byte-order
    # mark is read past (Notepad writes one), NaN or a file over 64 KiB makes it ignore it all.
    problem = hook_config.file_problem(str(path))
    if problem:
        raise InvalidRequestError(f"--config {problem}")
    data = json.loads(path.read_bytes().removeprefix(codec.BOM))
    for name in data:  # the hook's own table of settings: it skips any other key unread
        why = hook_config.not_a_setting(name)
        if why:
            raise InvalidRequestError(f"--config {path}: the hook would ignore {name} ({why})")
    ignored: list[str] = []
    hook_config.load({"RELAY_CONFIG": str(path)}, ignored)
    if ignored:
        raise InvalidRequestError(f"--config {path}: the hook would ignore {ignored[0]}")


def _folder_option(name: str, help_text: str):  # noqa: ANN202
    return click.option(
        name, type=click.Path(exists=True, file_okay=False, path_type=Path), help=help_text
    )


common = [
    _folder_option(
        "--distractors",
        "A bench folder whose memories are loaded into every organisation as well "
        "(e.g. ../shared/bench/cursorrules_bullets).",
    ),
    click.option(
        "--seed",
        type=StrictInt(),
        default=0,
        show_default=True,
        help="Seed for built conversations.",
    ),
    click.option(
        "--turns",
        type=StrictInt(2, 200),
        default=20,
        show_default=True,
        help="Turns per built conversation (folders without sessions).",
    ),
    click.option(
        "--deadline-ms",
        type=StrictInt(DEADLINE_MIN_MS, DEADLINE_MAX_MS),
        default=400,
        show_default=True,
        help="The hook's DEADLINE_MS (what the hook accepts: a shorter one could never search).",
    ),
    click.option(
        "--json",
        "json_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Write the figures (the documented schema) here.",
    ),
    click.option(
        "--report-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("relay-eval"),
        show_default=True,
        help="Where the HTML report and the JSON behind it go.",
    ),
]


def _workdir_option(more: str):  # noqa: ANN202
    """--workdir, with what this command does with a database already there."""
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Keep the database, server log and hook state here: a new or empty folder, or "
        f"one a relay eval used before (default: a temporary folder); {more}",
    )


def _common(fn):  # noqa: ANN001, ANN202
    for option in reversed(common):
        fn = option(fn)
    return fn


def _check_json(path: Path | None) -> None:
    """--json is written after the run, minutes on: a path under a file, or where this user
    cannot write, is refused now (QA: a traceback once the replay was done)."""
    from relay.install_files import why_unchangeable

    if path is None:
        return
    target = Path(os.path.realpath(path))  # a folder still to be made is made, as --report-dir's
    held = next(p for p in target.parents if p.exists())
    why = f"{held} is a file" if not held.is_dir() else why_unchangeable(target, remove=False)
    if why:
        raise InvalidRequestError(f"--json {path} cannot be written: {why}")


def _write_figures(path: Path, figures: dict[str, Any]) -> None:
    """The --json file, in a folder made for it as --report-dir's is."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise RelayError(f"--json {path}: {exc.strerror or exc}") from None


def _holding(report_dir: Path, run: Callable[..., None], options: dict[str, Any]) -> None:
    """`run` with --report-dir held for it alone (`harness.Held`): a second run writing there
    at the same time would leave each printing a report path that holds the other's report."""
    from relay.eval.harness import Held

    _check_json(options["json_path"])
    with _stoppable():  # from the first step: a SIGTERM before the replay revokes its keys too
        held = Held(report_dir, "--report-dir")
        try:
            run(report_dir=report_dir, **options)
        finally:
            held.release()


@click.group("eval")
def eval_group() -> None:
    """Does recall help? Replays through the real hook and server, fault drills, advice."""


@eval_group.command("replay")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--conversations",
    "count",
    type=StrictInt(1),
    help="Conversations to replay [sessions and a team's prompts: all; built: one per store].",
)
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Relay config whose knobs the 'on' mode uses (e.g. after --apply; not with it) "
    "[default: the hook's defaults; with --apply, the knobs the hook runs with now].",
)
@click.option(
    "--url",
    help="The running server a JSONL of prompts replays against [default: RELAY_URL, else the "
    "config relay install wrote]; not for a bench folder, which gets a server of its own.",
)
@click.option(
    "--key",
    "key",
    multiple=True,
    help="Read keys for that server, one per mode that searches (on, ungated, the advice's "
    "probe), so none is served another's cached answers; or one admin key, from which the "
    "replay mints them and revokes them after [default: RELAY_API_KEY, else the config].",
)
@click.option(
    "--key-file",
    "key_files",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True),
    help="Read a --key from this file's first line instead (repeatable, in the same order;"
    " the command line shows in ps and shell history).",
)
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Write the knobs the advice changes to the Relay config ($RELAY_CONFIG, else "
    "~/.relay/config.json; its other keys kept) and the hook script beside it.",
)
@_common
@_workdir_option(
    "a replay reuses a database it loaded there from the same data (the same content of "
    "memories.jsonl and the distractors'), and its keys."
)
def replay_command(report_dir: Path, **options: Any) -> None:
    """Replay SOURCE's conversations with recall on, off and ungated; report and advise.

    SOURCE is a ../shared/bench-format folder (its memories are loaded into a
    fresh `relay serve`; its sessions replayed, or conversations built from its
    questions), or a team's JSONL of prompts replayed against its server (--url/--key or
    --key-file, RELAY_URL/RELAY_API_KEY(_FILE), or the config relay install wrote).
    """
    _holding(report_dir, _replay, options)


def _replay(
    source: Path,
    count: int | None,
    config: Path | None,
    url: str | None,
    key: tuple[str, ...],
    key_files: tuple[str, ...],
    apply_: bool,
    distractors: Path | None,
    seed: int,
    turns: int,
    deadline_ms: int,
    json_path: Path | None,
    report_dir: Path,
    workdir: Path | None,
) -> None:
    """The replay, its report and advice (`replay_command`)."""
    import http.client

    from relay.eval import advice as adv
    from relay.eval import replay as rp
    from relay.eval import report as rep
    from relay.eval import team
    from relay.eval.conversations import write_jsonl
    from relay.eval.harness import OrgKeys, Server, api, load_database
    from relay.eval.harness import workdir as make_workdir
    from relay.hook_bench import HOOK, compile_hook, warm_up

    if config is not None and apply_:
        # QA: the advice, fitted to FILE's knobs, had its changes merged into the config the
        # hook runs with, whose other knobs differ: a setting nothing measured
        raise click.UsageError(
            "--apply fits the advice to the knobs the hook runs with now and writes its changes "
            "there, and --config replays other knobs: give one or the other"
        )
    if config is not None:
        _check_config(config)
    key = tuple(str(given_key(None, f)) for f in key_files) or key
    bench = source.is_dir()
    if bench and not (source / "memories.jsonl").exists():
        raise click.UsageError(f"{source} has no memories.jsonl")
    if bench and (url or key):
        raise click.UsageError(
            "--url and --key are for a JSONL of prompts, replayed against a running server; "
            f"{source} is a bench folder, loaded into a server the replay starts itself"
        )
    client = None if bench else team.server(url, key[0] if key else None)
    conversations = _conversations(source, count, seed, turns)
    if not conversations:
        raise InvalidRequestError(f"{source}: no conversations to replay")
    refusal = adv.cannot_advise(conversations)
    if apply_ and refusal:  # before the replay: minutes of it would end in nothing to apply
        raise InvalidRequestError(f"--apply: no advice to apply: {refusal}")
    if apply_:
        adv.apply_target()  # and a config it could not read back or write, the same
    knobs = adv.knob_environ(config, apply_)
    team_keys: dict[str, str] = {}
    stores = {c.store for c in conversations}
    server = let_go = None
    try:
        if client is not None:  # minted in here, so whatever fails next revokes them
            team_keys = team.mode_keys(client, team.check_server(client), key[1:])
            team.check_gold(client.url, team_keys["probe"], conversations, source)
        work, let_go = make_workdir(workdir, "relay-eval-replay-")
        if bench:
            keys = load_database(
                work / "relay.db",
                source,
                distractors,
                (*rp.MODES, "probe"),
                _progress,
                stores,
                reuse=workdir is not None,
            )
            _progress("starting relay serve")
            server = Server(work / "relay.db", work / "server.log")
            base = server.url
        else:
            assert client is not None
            base = client.url
            mode_keys = {m: team_keys[m] for m in (*rp.MODES, "probe")}
            keys = {s: OrgKeys("", mode_keys, "") for s in stores}
        missing = stores - set(keys)
        if missing:
            raise InvalidRequestError(
                f"{source}: prompts name stores with no memories: {sorted(missing)}"
            )
        compile_hook()
        first = next(iter(stores))
        warm_up(  # with prompts of its own: none measured is answered from its cache
            base,
            keys[first].read["probe"],
            [t.prompt for t in conversations[0].turns],
            [str(HOOK)],
            deadline_ms,
            avoid={t.prompt for c in conversations for t in c.turns},
        )
        n_turns = sum(len(c.turns) for c in conversations)
        _progress(f"replaying {len(conversations)} conversations, {n_turns} turns, 3 modes")
        rows = rp.replay(
            conversations, base, keys, _fresh(work / "homes"), deadline_ms, knobs, _progress
        )
        result = rp.public(rows, len(conversations))
        more = rp.extras(rows, deadline_ms)
        current = adv.current_knobs(knobs)
        outage = rp.server_failures(rows)
        if refusal or outage:
            advice = adv.refused(outage or refusal or "", current)
        else:
            _progress(
                "advice: one search per distinct prompt, then the hook's gate replayed offline"
            )
            try:
                probes = adv.probe(
                    conversations,
                    lambda store, body: api(
                        base, "POST", "/v1/search", keys[store].read["probe"], body
                    ),
                    max(current["max_records"], *adv.GRID["max_records"]),
                )
            except (OSError, http.client.HTTPException, RelayError) as exc:
                raise RelayError(
                    f"{base}: the advice's searches failed after the replay: {exc}"
                ) from None
            advice = adv.advise(conversations, probes, rows, current)
    finally:
        if server is not None:
            server.stop()
        if client is not None:
            team.revoke(client, team_keys)
        if let_go is not None:
            let_go()
    report = {
        "figures": result,
        "extras": more,
        "advice": advice,
        "meta": _meta(
            str(source),
            deadline_ms,
            distractors=str(distractors) if distractors else None,
            seed=seed,
            config=None if knobs["RELAY_CONFIG"] == os.devnull else knobs["RELAY_CONFIG"],
            knobs=current,
        ),
        "conversations": [t.to_dict() for c in conversations for t in c.turns],
        "turns": rows,
    }
    html_path, report_json = rep.write(report_dir, "replay", report, rep.replay_page(report))
    write_jsonl(report_dir / "conversations.jsonl", conversations)
    if json_path:
        _write_figures(json_path, result)
    click.echo(rp.render(result, more, deadline_ms))
    click.echo(adv.render(advice, str(source)))
    click.echo(f"report: {html_path} (figures behind it: {report_json})")
    if outage:  # kept for a look at what failed, but no advice, nothing applied, no success
        raise RelayError(f"{base}: {outage}")
    if apply_ and not advice["changes"]:
        click.echo("applied nothing: the advised knobs are the ones the hook runs with")
    elif apply_:  # only the changes the advice printed; the user's other knobs stay theirs
        written = adv.apply(advice["changes"])
        click.echo(
            f"applied to {' and '.join(map(str, written))}: " + json.dumps(advice["changes"])
        )


@eval_group.command("faults")
@click.argument(
    "source",
    type=click.Path(exists=True, path_type=Path),
    default=BENCH / "coding_prompts",
    required=False,
)
@click.option(
    "--conversations",
    "count",
    type=StrictInt(1),
    default=2,
    show_default=True,
    help="Conversations replayed in each drill.",
)
@click.option(
    "--drill-prompts",
    type=StrictInt(1),
    default=6,
    show_default=True,
    help="Prompts in the deletion and revocation drills.",
)
@_common
@_workdir_option(
    "the drills always load a fresh database there, since they delete memories and revoke "
    "keys (and the next replay loads afresh too)."
)
def faults_command(report_dir: Path, **options: Any) -> None:
    """Replay SOURCE (default ../shared/bench/coding_prompts) while injecting faults: a hung
    connection, a slow body, a denied key, oversized content, invalid JSON, the server killed
    and restarted; then deletion and key revocation with warm caches, and a compaction.

    SOURCE is a bench-format folder (memories.jsonl and queries.jsonl, docs/eval.md),
    loaded into a server of the drills' own.
    """
    _holding(report_dir, _faults, options)


def _faults(
    source: Path,
    count: int,
    drill_prompts: int,
    distractors: Path | None,
    seed: int,
    turns: int,
    deadline_ms: int,
    json_path: Path | None,
    report_dir: Path,
    workdir: Path | None,
) -> None:
    """The drills and their report (`faults_command`)."""
    from relay.eval import faults as fl
    from relay.eval import report as rep
    from relay.eval.harness import Server, load_database
    from relay.eval.harness import workdir as make_workdir
    from relay.hook_bench import compile_hook

    if not source.is_dir():  # QA: "Directory 'prompts.jsonl' is a file" said not what to give
        raise click.UsageError(
            f"{source} is a file: the drills need a bench-format folder (memories.jsonl and "
            "queries.jsonl: docs/eval.md), loaded into a server of their own that they kill and "
            "restart; a JSONL of prompts replays against its server with relay eval replay"
        )
    if not (source / "memories.jsonl").exists():
        raise click.UsageError(f"{source} has no memories.jsonl")
    conversations = _conversations(source, count, seed, turns)
    work, let_go = make_workdir(workdir, "relay-eval-faults-")
    server = None
    try:
        used = {c.store for c in conversations}
        keys = load_database(work / "relay.db", source, distractors, fl.KINDS, _progress, used)
        server = Server(work / "relay.db", work / "server.log")
        compile_hook()
        drills = fl.run_drills(
            conversations,
            server,
            keys,
            _fresh(work / "homes"),
            deadline_ms,
            drill_prompts,
            _progress,
        )
    finally:
        if server is not None:
            server.stop()
        let_go()
    report = {
        "figures": fl.public(drills),
        "drills": {kind: d.details() for kind, d in drills.items()},
        "series": {kind: {"ms": d.ms} for kind, d in drills.items()},
        "meta": _meta(str(source), deadline_ms, conversations=len(conversations), seed=seed),
    }
    html_path, report_json = rep.write(report_dir, "faults", report, rep.faults_page(report))
    if json_path:
        _write_figures(json_path, fl.public(drills))
    click.echo(fl.render(drills, deadline_ms))
    click.echo(f"report: {html_path} (figures behind it: {report_json})")
    if missed := fl.shortfalls(drills):
        raise RelayError("not every drill passed: " + "; ".join(missed))
