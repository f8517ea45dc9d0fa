"""The `relay` command.

Server-side administration (`serve`, `org`, `key`) works on the database
directly (`--db` / RELAY_DB); everything about memories talks to a running
server over HTTP with the user's key (`--url`/`--key`, RELAY_URL/RELAY_API_KEY,
or ~/.relay/config.json written by `relay install`), so it goes through the
same authorization as every agent.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shlex
import socket
import sys
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import click

from relay import __version__
from relay.errors import InvalidRequestError, RelayError
from relay.settings import SERVER_SETTINGS, resolve


def main() -> None:
    """Entry point: Relay errors become one clear line on stderr and their exit code."""
    try:
        cli.main(standalone_mode=False, prog_name="relay")
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RelayError as exc:
        click.echo(f"relay: error: {exc.message}", err=True)
        sys.exit(exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="relay")
def cli() -> None:
    """Relay: team memory for coding agents."""


# -- shared options -------------------------------------------------------------
def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        envvar="RELAY_DB",
        help="SQLite path or postgresql:// URL (default ~/.relay/relay.db).",
    )(fn)


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    @click.option(
        "--url", envvar="RELAY_URL", help="Relay server URL (default: from relay install)."
    )
    @click.option("--key", envvar="RELAY_API_KEY", help="API key (default: from relay install).")
    @functools.wraps(fn)
    def wrapper(url: str | None, key: str | None, **kwargs: Any) -> Any:
        from relay.client import RelayClient

        return fn(client=RelayClient.from_config(url, key), **kwargs)

    return wrapper


def _open_store(db: str | None, create: bool = False):  # noqa: ANN202
    """The store `--db` (or RELAY_DB, or the default) names. Only `create` may make a new
    SQLite file, and none may write Relay's tables into a file that is not a Relay store:
    a mistyped path would otherwise leave an empty database (and its folders) behind, or
    change someone else's database, and report 'no organisation'."""
    from relay.store import database_kind, open_relay_file, open_store, sqlite_path

    url = resolve(SERVER_SETTINGS, {"db": db}, {})["db"] if db is None else db
    if database_kind(url) == "sqlite":
        if sqlite_path(url).exists():
            open_relay_file(url).close()
        elif not create:
            raise InvalidRequestError(
                f"no Relay database at {sqlite_path(url)} (relay serve or relay org create "
                "makes one; check --db or RELAY_DB)"
            )
    return open_store(url)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _pin_blas() -> None:
    """One BLAS thread: the vector product is small, and a second spinning BLAS thread takes
    the core the other requests need (measured at 100k memories: CPU per search p50
    47 -> 35 ms, p95 181 -> 71 ms). Must run before numpy loads."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


# -- serve ----------------------------------------------------------------------
def _setting_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for s in reversed(SERVER_SETTINGS):
        fn = click.option(
            s.flag,
            s.name,
            type=s.type if s.type is not str else None,
            default=None,
            help=f"{s.help} [env {s.env}"
            + ("]" if s.default is None else f"; default {s.default}]"),
        )(fn)
    return fn


@cli.command()
@_setting_options
@click.option(
    "--org",
    "first_org",
    default="default",
    show_default=True,
    help="Name of the organisation created when the database has none.",
)
def serve(first_org: str, **given: Any) -> None:
    """Run the Relay server (creates a first organisation and admin key on an empty database)."""
    import logging

    import uvicorn

    from relay.server import asgi_app, build_services

    conf = resolve(SERVER_SETTINGS, given)
    _pin_blas()
    logging.basicConfig(level=conf["log_level"].upper(), format="%(asctime)s %(name)s %(message)s")
    from relay.store import redact_url

    listener = _listen(conf["host"], conf["port"])  # before anything is created or printed
    services = build_services(conf)
    store = services.store
    shown = redact_url(conf["db"])
    _warn_if_shared(conf["db"])
    if not store.list_orgs():
        from relay.auth import mint_key

        org = store.create_org(first_org)
        minted = mint_key(
            store, org.id, "admin", frozenset({"admin", "memory:read", "memory:write"}), frozenset()
        )
        url = f"http://{conf['host']}:{conf['port']}"
        relay = _relay_command()
        click.echo(
            f"\nCreated organisation {org.name!r} ({org.id}) in {shown}\n"
            f"Admin API key (shown once, store it now):\n\n    {minted.secret}\n\n"
            "Next, in another terminal, connect this machine and your agents, then add a memory:\n"
            f"    {relay} install --url {url} --key {minted.secret}\n"
            f'    {relay} remember "Staging is the blue cluster" --source team/infra\n'
            f"    {relay} doctor\n"
        )
    click.echo(f"Relay {__version__} serving {shown} on http://{conf['host']}:{conf['port']}")
    config = uvicorn.Config(
        asgi_app(services, conf["max_inflight"], conf["max_body_bytes"]),
        host=conf["host"],
        port=conf["port"],
        log_level=conf["log_level"],
        access_log=False,
    )
    uvicorn.Server(config).run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the database is touched: a port already
    taken is one line, not an organisation and key made for a server that never ran."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = (
            ": is another server running? choose another port with --port or RELAY_PORT"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise RelayError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    return sock


def _relay_command() -> str:
    """`relay` as the user ran it (`.venv/bin/relay` from a clone), for commands to copy."""
    ran = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "relay" else "relay"
    return shlex.quote(ran)


def _warn_if_shared(db: str) -> None:
    """A SQLite file other users may read gives them every audience's memories."""
    from relay.store import database_kind, sqlite_path

    if database_kind(db) != "sqlite":
        return
    path = sqlite_path(db)
    if not path.is_file():  # ":memory:", or a file still to be made
        return
    mode = path.stat().st_mode & 0o777
    if mode & 0o044:
        click.echo(
            f"warning: {path} is readable by other users of this machine (mode {mode:o}), and "
            f"it holds every audience's memories; make it yours alone: chmod 600 {path}*",
            err=True,
        )


# -- organisations and keys -----------------------------------------------------
@cli.group()
def org() -> None:
    """Create and list organisations (on the database directly)."""


@org.command("create")
@click.argument("name")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def org_create(name: str, db: str | None, as_json: bool) -> None:
    """Create an organisation and its first admin key. NAME may not read as an
    organisation id (org_ and hex digits): --org takes either, and an id comes first."""
    from relay.auth import mint_key

    store = _open_store(db, create=True)
    new = store.create_org(name)
    minted = mint_key(
        store, new.id, "admin", frozenset({"admin", "memory:read", "memory:write"}), frozenset()
    )
    if as_json:
        _echo_json({"org": {"id": new.id, "name": new.name}, "admin_key": minted.secret})
    else:
        click.echo(f"organisation {new.name} ({new.id})\nadmin key (shown once): {minted.secret}")


@org.command("list")
@db_option
def org_list(db: str | None) -> None:
    """List organisations."""
    orgs = _open_store(db).list_orgs()
    for o in orgs:
        click.echo(f"{o.id}\t{o.name}")
    if not orgs:
        click.echo(
            "no organisations yet (relay serve or relay org create makes the first)", err=True
        )


@cli.group()
def key() -> None:
    """Create, list and revoke API keys (on the database directly)."""


def _org_id(store, name_or_id: str) -> str:  # noqa: ANN001
    found = store.find_org(name_or_id)
    if found is None:
        from relay.errors import NotFoundError

        raise NotFoundError(f"no organisation {name_or_id!r} (see 'relay org list')")
    return found.id


@key.command("create")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@click.option("--name", required=True, help="What the key is for, e.g. 'alice laptop'.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    default=("memory:read",),
    show_default=True,
    type=click.Choice(["memory:read", "memory:write", "admin"]),
    help="Repeatable.",
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    help="Audience the key may read, named as memories' audiences are (lowercase letters, "
    "digits, _ . -; stored lower-cased); repeatable.",
)
@click.option(
    "--expires-in-days",
    type=click.IntRange(1, 36500),
    help="Expire the key after N days (at most 100 years).",
)
@db_option
def key_create(
    org_name: str,
    name: str,
    scopes: tuple[str, ...],
    roles: tuple[str, ...],
    expires_in_days: int | None,
    db: str | None,
) -> None:
    """Create an API key; its secret is printed once."""
    from relay.auth import mint_key

    store = _open_store(db)
    expires = datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days else None
    minted = mint_key(
        store, _org_id(store, org_name), name, frozenset(scopes), frozenset(roles), expires
    )
    click.echo(
        f"key {minted.key.id} ({', '.join(sorted(scopes))}; roles: "
        f"{', '.join(sorted(minted.key.roles)) or 'none'})\nsecret (shown once): {minted.secret}"
    )


@key.command("list")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@db_option
def key_list(org_name: str, db: str | None) -> None:
    """List an organisation's keys (never their secrets)."""
    store = _open_store(db)
    click.echo("id\tstate\tname\tscopes\troles\texpires")
    for k in store.list_keys(_org_id(store, org_name)):
        state = (
            "revoked"
            if k.revoked_at
            else "expired"
            if k.expires_at and k.expires_at < datetime.now(UTC)
            else "active"
        )
        expires = k.expires_at.isoformat(timespec="seconds") if k.expires_at else "never"
        roles = ",".join(sorted(k.roles)) or "-"
        click.echo(f"{k.id}\t{state}\t{k.name}\t{','.join(sorted(k.scopes))}\t{roles}\t{expires}")
        _warn_unaddressable_roles(k.id, k.roles)


def _warn_unaddressable_roles(key_id: str, roles: frozenset[str]) -> None:
    """Keys made before roles were held to the audience rule may hold one no memory can
    name ("Platform": audiences are lower-case); such a key reads what is for `all` alone."""
    from relay.hygiene import check_roles

    for role in sorted(roles):
        try:
            fixed = check_roles([role])
        except InvalidRequestError as exc:
            why = exc.message
        else:
            if fixed == {role}:
                continue
            meant = next(iter(fixed))
            why = f"role {role!r} is not lower-case, as audiences are; did you mean {meant!r}?"
        click.echo(
            f"warning: key {key_id} holds a role no memory can name, so it reads only what is for"
            f" all: {why} Create a key with the role you meant and revoke this one.",
            err=True,
        )


@key.command("revoke")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@click.argument("key_id")
@db_option
def key_revoke(org_name: str, key_id: str, db: str | None) -> None:
    """Revoke a key at once, everywhere."""
    store = _open_store(db)
    org_id = _org_id(store, org_name)
    before = next((k.revoked_at for k in store.list_keys(org_id) if k.id == key_id), None)
    store.revoke_key(org_id, key_id)  # refuses a key this org does not hold
    if before is not None:  # judged by the row, not by a clock the database may not share
        click.echo(f"{key_id} was already revoked, at {before.isoformat(timespec='seconds')}")
    else:
        click.echo(f"revoked {key_id}")


# -- memories (over HTTP) -------------------------------------------------------
def _memory_fields(
    title, source, audiences, tags, valid_until, supersedes, pinned
) -> dict[str, Any]:  # noqa: ANN001
    fields: dict[str, Any] = {}
    if valid_until is not None and not valid_until.strip():
        raise click.UsageError(
            "--valid-until needs an ISO 8601 date or time, like 2027-01-31 or "
            "2027-01-31T18:00:00Z (relay edit --no-valid-until removes one)"
        )
    for name, value in (("title", title), ("source", source), ("valid_until", valid_until)):
        if value is not None:
            fields[name] = value
    for name, value in (("audiences", audiences), ("tags", tags), ("supersedes", supersedes)):
        if value:
            fields[name] = list(value)
    if pinned is not None:
        fields["pinned"] = pinned
    return fields


def memory_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The fields of a new memory."""
    return _memory_options(fn, "default all")


def edit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same fields for an edit: each one given replaces the memory's, the rest stay;
    a --no-FIELD flag, listed after its field, removes a list or the end date."""
    return _memory_options(fn, "replaces its audiences; kept if not given", clears=True)


def _clear_option(field: str, help_text: str) -> Callable[..., Any]:
    return click.option(
        f"--no-{field.replace('_', '-')}", f"clear_{field}", is_flag=True, help=help_text
    )


def _memory_options(
    fn: Callable[..., Any], audience_default: str, clears: bool = False
) -> Callable[..., Any]:
    options = [
        click.option("--title", help="Short title."),
        click.option("--source", help="Provenance, path-like (e.g. team/infra/clusters)."),
        click.option(
            "--audience",
            "audiences",
            multiple=True,
            help=f"Role allowed to see it (repeatable; {audience_default}).",
        ),
        click.option(
            "--tag",
            "tags",
            multiple=True,
            help="Tag (repeatable"
            + ("; replaces its tags; kept if not given)." if clears else ")."),
        ),
        clears and _clear_option("tags", "Remove all its tags."),
        click.option(
            "--valid-until",
            help="ISO 8601 date-time after which recall (search, hook, MCP) never returns it.",
        ),
        clears
        and _clear_option(
            "valid_until",
            "Remove its valid_until: it has no end date, and recall returns it again.",
        ),
        click.option(
            "--supersedes", multiple=True, help="Id of a memory this one replaces (repeatable)."
        ),
        clears
        and _clear_option(
            "supersedes",
            "Remove its supersedes links (links to memories this key cannot read stay).",
        ),
        click.option(
            "--pinned/--not-pinned",
            default=None,
            help="Part of the team profile shown at session start.",
        ),
    ]
    for opt in reversed([o for o in options if o]):
        fn = opt(fn)
    return fn


def _progress_bar(length: int, label: str) -> Any:
    """A bar on stderr; without a terminal none (it was one lone label line, even before an
    error)."""
    return click.progressbar(
        length=length, label=label, file=sys.stderr, hidden=not sys.stderr.isatty()
    )


def _memory_path(memory_id: str, rest: str = "") -> str:
    from relay.client import memory_path  # imported when used: the CLI starts light

    return memory_path(memory_id, rest)


def _read_body(body: str | None) -> str | None:
    if body != "-":
        return body
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"stdin is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None


@cli.command()
@click.argument("body")
@memory_options
@click.option("--json", "as_json", is_flag=True, help="Print the stored memory as JSON.")
@client_options
def remember(client, body: str, as_json: bool, **opts: Any) -> None:  # noqa: ANN001
    """Add a memory (BODY, or - to read it from stdin)."""
    memory = client.post("/v1/memories", {"body": _read_body(body), **_memory_fields(**opts)})
    if as_json:
        _echo_json(memory)
    else:
        click.echo(f"remembered {memory['id']} (revision {memory['revision']})")


@cli.command()
@click.argument("memory_id")
@click.option("--body", help="New text (or - for stdin).")
@edit_options
@click.option("--expected-revision", type=int, help="Fail if the memory moved on meanwhile.")
@client_options
def edit(
    client,  # noqa: ANN001
    memory_id: str,
    body: str | None,
    expected_revision: int | None,
    clear_valid_until: bool,
    clear_tags: bool,
    clear_supersedes: bool,
    **opts: Any,
) -> None:
    """Edit a memory: every edit is a new revision. A field not given keeps its value;
    --title "" and --source "" remove them, --no-tags, --no-supersedes and --no-valid-until
    remove those. The key needs memory:read as well as memory:write."""
    fields = _memory_fields(**opts)
    # (field, its --no- flag's value, the option that sets it)
    cleared = (
        ("valid_until", clear_valid_until, "--valid-until"),
        ("tags", clear_tags, "--tag"),
        ("supersedes", clear_supersedes, "--supersedes"),
    )
    for name, clear, option in cleared:
        if not clear:
            continue
        if name in fields:
            raise click.UsageError(f"give {option} or --no-{name.replace('_', '-')}, not both")
        fields[name] = None  # null clears it (docs/http-api.md, PATCH)
    if body is not None:
        fields["body"] = _read_body(body)
    if expected_revision is not None:
        fields["expected_revision"] = expected_revision
    if not fields:
        raise click.UsageError("nothing to change: pass --body or another field")
    memory = client.request("PATCH", _memory_path(memory_id), fields)
    click.echo(f"{memory['id']} is now at revision {memory['revision']}")


@cli.command()
@click.argument("memory_id")
@client_options
def forget(client, memory_id: str) -> None:  # noqa: ANN001
    """Delete a memory everywhere at once (its history keeps a tombstone, not the text)."""
    client.request("DELETE", _memory_path(memory_id))
    click.echo(f"forgot {memory_id}")


@cli.command()
@click.argument("memory_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@client_options
def history(client, memory_id: str, as_json: bool) -> None:  # noqa: ANN001
    """Show every revision of a memory."""
    items = client.get(_memory_path(memory_id, "/revisions"))["items"]
    if as_json:
        _echo_json(items)
        return
    before: dict[str, Any] = {}
    for r in items:
        if r.get("withheld"):
            text = "(withheld: written for audiences this key cannot read)"
        else:
            text = r["body"] if r["body"] is not None else "(deleted: text removed)"
        head = f"rev {r['revision']}  {r['action']:<6} {r['recorded_at']}  {r['title'] or ''}"
        click.echo(f"{head}\n    {text}")
        if r.get("withheld") or r["action"] == "delete":
            continue
        # What else this revision changed: an edit of a tag or a date is a revision too.
        fields = {name: r.get(name) for name in _HISTORY_FIELDS}
        changed = [
            f"{name}: {_shown(value)}"
            for name, value in fields.items()
            if value != before.get(name, [] if isinstance(value, list) else None)
        ]
        if changed:
            click.echo("    (" + "; ".join(changed) + ")")
        before = fields


_HISTORY_FIELDS = ("source", "audiences", "tags", "valid_until", "supersedes")


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "none"
    return ", ".join(value) if isinstance(value, list) else str(value)


@cli.command()
@click.argument("query")
@click.option("-k", "k", default=5, show_default=True, type=click.IntRange(1, 12), help="Results.")
@click.option(
    "--mode",
    type=click.Choice(["hybrid", "lexical", "semantic"]),
    default="hybrid",
    show_default=True,
    help="Ranking signals to use.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw response.")
@client_options
def search(client, query: str, k: int, mode: str, as_json: bool) -> None:  # noqa: ANN001
    """Search team memory through the server's pipeline, as the recall hook does.

    Lists everything the server returns above its threshold; the hook then injects at
    most its max_records of these, scoring at least its min_score (docs/hook.md)."""
    response = client.post(
        "/v1/search", {"query": query, "k": k, "mode": mode, "deadline_ms": 2000}
    )
    if as_json:
        _echo_json(response)
        return
    if not response["results"]:
        click.echo("nothing relevant")
    for r in response["results"]:
        head = f"[{r['score']:.2f}] {r['id']} rev {r['revision']}  {r['source'] or ''}"
        click.echo(f"{head}  {r['title'] or ''}\n    {r['text']}")


@cli.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Make sources relative to this folder instead (no repository name).",
)
@click.option(
    "--source-prefix",
    metavar="NAME",
    help="Name that starts every source, in place of the repository's (or of ~ or /"
    " outside a git work tree; '' for none).",
)
@click.option(
    "--audience",
    "audiences",
    multiple=True,
    help="Audience for every memory written (repeatable; default: a memory imported before"
    " keeps its own, a new one is for all).",
)
@click.option(
    "--keep-removed",
    is_flag=True,
    help="Keep the memories of sections no longer in a file (default: forget them).",
)
@client_options
def import_(
    client,  # noqa: ANN001
    paths: tuple[Path, ...],
    root: Path | None,
    source_prefix: str | None,
    audiences: tuple[str, ...],
    keep_removed: bool,
) -> None:
    """Import Markdown, CLAUDE.md, AGENTS.md, .cursorrules and .mdc files: one memory per
    section or rule.

    Any other text file named explicitly (CONVENTIONS.txt, .windsurfrules) is read as
    Markdown. Structured data (JSON, JSON lines, CSV, TSV, YAML, TOML, XML) is refused
    and nothing is imported.

    \b
    Each memory's source names its file the same way from any folder:
      - in a git work tree: <repository>/<path in the repository>, the repository
        named by its origin remote (acme/shop-backend/AGENTS.md), else by its folder;
      - elsewhere: where it sits on this machine, ~/notes/CLAUDE.md under your
        home folder, else its absolute path (warned about: a teammate's copy
        sits elsewhere; --root FOLDER --source-prefix NAME names it for all);
      - with --root: the path relative to that folder.
    Ids derive from the source and the section, so re-importing is idempotent; a
    section keeps its memory wherever it moves in the file, and an edit to it is a
    new revision (a rule rewritten into another is a new memory).
    Re-importing a file forgets the memories of sections it no longer has, and
    importing a folder of a git work tree forgets those of its files deleted or renamed
    since (not with --keep-removed); memories from other files or written by hand are
    never touched. The file is the source of truth: a relay edit of an imported memory
    is undone and a section deleted by hand comes back; the summary counts both."""
    from relay.import_writer import ImportTally, check_drafts, import_files, vanished
    from relay.importer import (
        drafts_from_path,
        folder_prefixes,
        iter_import_files,
        named_by_folder,
        named_by_place,
        source_for,
    )

    drafts_by_source, failed = {}, []
    unnamed: dict[Path, None] = {}  # work trees named by their folder alone, in order
    placed: list[str] = []  # sources of files named by where they sit on this machine
    files_by_source: dict[str, Path] = {}
    for f in iter_import_files(paths):
        work_tree = named_by_folder(f, root, source_prefix)
        if work_tree is not None:
            unnamed[work_tree] = None
        try:
            drafts = drafts_from_path(f, root, source_prefix)
        except RelayError as exc:  # one unreadable file must not sink the rest
            failed.append(f)
            click.echo(f"relay: skipped {f}: {exc.message}", err=True)
            continue
        source = source_for(f, root, source_prefix)
        if source in files_by_source:  # one would overwrite and retire the other's memories
            raise InvalidRequestError(
                f"{files_by_source[source]} and {f} would both be recorded as {source}, and"
                " importing one would overwrite and retire the other's memories; nothing was"
                " imported: import them apart, each with its own --source-prefix",
                path=str(f),
            )
        files_by_source[source] = f
        if named_by_place(f, root):
            placed.append(source)
        drafts_by_source[source] = drafts
        if not drafts:
            click.echo(f"relay: note: {f} holds no section with text: nothing to import", err=True)
    if not drafts_by_source and not failed:
        raise click.UsageError("no importable files found")
    drafts = [d for file_drafts in drafts_by_source.values() for d in file_drafts]
    check_drafts(drafts, audiences)
    for work_tree in unnamed:  # said once everything is checked, just before writing
        click.echo(
            f"relay: warning: {work_tree} has no origin remote, so its sources are named by"
            f" its folder ({work_tree.name}/...): another repository in a folder of that name"
            " would share them, and importing it would overwrite and retire these; name it"
            " with --source-prefix",
            err=True,
        )
    if placed:
        more = f" and {len(placed) - 1} more" if len(placed) > 1 else ""
        click.echo(
            "relay: warning: outside any git work tree, a source names where the file sits"
            f" on this machine ({placed[0]}{more}): a teammate's copy elsewhere becomes"
            " memories of its own, and a different file at that place on their machine would"
            " overwrite and retire these; to name a folder the same on every machine, import"
            " it with --root FOLDER --source-prefix NAME",
            err=True,
        )
    gone = (
        {}
        if keep_removed or root
        else vanished(client, folder_prefixes(paths, source_prefix), drafts_by_source)
    )
    tally = ImportTally()
    try:
        with _progress_bar(len(drafts), "importing") as bar:
            import_files(client, drafts_by_source, audiences, keep_removed, bar.update, gone, tally)
    except KeyboardInterrupt:
        click.echo(
            f"relay: interrupted with {tally.written + tally.unchanged} of {len(drafts)} memories"
            f" imported ({tally.written} new or changed, {tally.unchanged} unchanged) and"
            f" {tally.retired} retired; running the same import again finishes it",
            err=True,
        )
        raise click.Abort() from None

    # Not errors (the file is the source of truth), but neither should come as a surprise.
    for d in tally.overwritten:
        click.echo(
            f"relay: note: {d.source} › {d.title or d.id}: edited since this text was"
            f" imported; the file's text replaced the edit (relay history {d.id} shows it)",
            err=True,
        )
    for d, was in tally.revived:
        click.echo(
            f"relay: note: {d.source} › {d.title or d.id}: its id {was} is taken (its memory"
            " was deleted, by relay forget or when it left the file, or is one this key cannot"
            f" read); imported again as {d.id}",
            err=True,
        )
    also = ""
    if n := len(tally.overwritten):
        it = "it was" if n == 1 else "they were"
        also += f"; {n} edited since {it} imported {'was' if n == 1 else 'were'} overwritten"
    if n := len(tally.revived):
        also += (
            f"; {n} deleted before (or hidden from this key)"
            f" {'was' if n == 1 else 'were'} imported again"
        )
    click.echo(
        f"imported {len(drafts)} memories: {tally.written} new or changed,"
        f" {tally.unchanged} unchanged, {tally.retired} retired{also}"
    )
    if failed:
        raise click.ClickException(f"{len(failed)} file(s) could not be imported (see above)")


@cli.command()
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default="-",
    help="File to write (default stdout); replaced only once the whole export is read.",
)
@client_options
def export(client, output: Path) -> None:  # noqa: ANN001
    """Export every memory the key may read as JSONL (relay restore reads it back).

    Expired and superseded memories are included; deleted ones are not. A file is
    written beside its final name (readable by you alone) and renamed into place at
    the end: an export that fails midway leaves an earlier backup as it was."""
    if str(output) == "-":
        _export_pages(client, sys.stdout)
        return
    import tempfile

    try:
        fd, partial = tempfile.mkstemp(
            prefix=f".{output.name}.", suffix=".partial", dir=output.resolve().parent
        )
    except OSError as exc:
        raise RelayError(f"cannot write {output}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _export_pages(client, fh)
        os.replace(partial, output)
    except BaseException:
        os.unlink(partial)
        raise


def _export_pages(client, out: TextIO) -> None:  # noqa: ANN001
    cursor = None
    while True:
        query = "" if cursor is None else "&cursor=" + urllib.parse.quote(cursor)
        page = client.get("/v1/memories?limit=500" + query)
        for item in page["items"]:
            out.write(json.dumps(item, ensure_ascii=False) + "\n")
        cursor = page["next_cursor"]
        if not cursor:
            break


@cli.command()
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)
@client_options
def restore(client, file: Path) -> None:  # noqa: ANN001
    """Restore the memories of a relay export file (FILE, or - for stdin).

    \b
    Each memory is written back under its id with its title, body, source,
    audiences, tags, valid_until, supersedes and pinned, through the checks every
    write passes: the key writes only what it may, and each audience must be a role
    some key of the organisation carries. Restoring again changes nothing.
    Not carried: revision history and authorship. A memory new to the organisation
    starts at revision 1, written by this key, dated now.
    \b
    - memories already expired (or expiring within 5 minutes) are skipped and counted;
    - a memory is written after the memories of the file it supersedes;
    - a supersedes link to a memory neither in the file nor readable with this key
      here (deleted since, or outside the exporting key's audiences) is dropped and
      counted, unless the server shows that link, which is then kept (it keeps the
      links it holds to memories this key cannot read, and does not show them);
    - a malformed line stops the restore, naming it, before anything is written;
    - it also stops at a memory deleted here since (deleted ids are never reused) or
      held here for audiences this key lacks, and at a batch the server refuses (an
      unknown audience): the batches before stay written, and running the restore
      again once fixed finishes it."""
    from relay.restore import read_export, restore_memories

    name = "<stdin>" if str(file) == "-" else str(file)
    try:
        text = sys.stdin.read() if name == "<stdin>" else file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{name} is not UTF-8 text") from None
    memories = read_export(text, name)
    with _progress_bar(len(memories), "restoring") as bar:
        tally = restore_memories(client, memories, name, bar.update)
    links = "".join(
        [
            f", {tally.dropped_links} supersedes link(s) to memories not here dropped"
            if tally.dropped_links
            else "",
            f", {tally.unseen_links} supersedes link(s) to memories this key cannot read"
            " left as the server holds them"
            if tally.unseen_links
            else "",
        ]
    )
    click.echo(
        f"restored {tally.restored} memories: {tally.written} new or changed,"
        f" {tally.unchanged} unchanged, {tally.expired} expired skipped{links}"
    )


# -- benchmarks ------------------------------------------------------------------
@cli.group()
def bench() -> None:
    """Benchmarks; results go to BENCHMARKS.md with the command that produced them."""
    _pin_blas()  # here, before any subcommand's imports load numpy


def _bench_embedder(provider: str):  # noqa: ANN202
    from relay.embedding import load_embedder

    return load_embedder(provider, 1)


def _progress(message: str) -> None:
    click.echo(message, err=True)


@bench.command("recall")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the figures as JSON here.",
)
@click.option(
    "--embedder",
    default="onnx",
    show_default=True,
    type=click.Choice(["onnx", "sentence-transformers"]),
    help="Embedding provider.",
)
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
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Memories in all (one passage each).",
)
@click.option(
    "--sizes",
    help="orgs100: comma-separated sizes measured in turn as one database grows "
    "(e.g. 100000,300000); overrides --memories.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the figures as JSON here.",
)
@click.option(
    "--embedder",
    default="onnx",
    show_default=True,
    type=click.Choice(["onnx", "sentence-transformers"]),
    help="Embedding provider.",
)
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
    type=click.FloatRange(0.1),
    default=15.0,
    show_default=True,
    help="orgs100: seconds per throughput level.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
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

        try:
            sizes_list = [int(s) for s in (sizes or str(n)).split(",")]
            client_levels = tuple(int(c) for c in clients.split(","))
        except ValueError as exc:
            raise click.UsageError(f"--sizes and --clients take integers: {exc}") from exc
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
    _echo_json(result)


def _register() -> None:
    """Commands that live beside the concept they serve."""
    from relay.doctor import doctor
    from relay.drills import drill
    from relay.eval.commands import eval_group
    from relay.hook_bench import hook as bench_hook
    from relay.hook_stats import stats
    from relay.install import install, uninstall
    from relay.mcp_server import mcp_command
    from relay.migrate import migrate
    from relay.skill import skill

    cli.add_command(stats)
    cli.add_command(migrate)
    cli.add_command(eval_group)
    cli.add_command(drill)
    bench.add_command(bench_hook)
    for command in (install, uninstall, doctor, skill, mcp_command):
        cli.add_command(command)


_register()
