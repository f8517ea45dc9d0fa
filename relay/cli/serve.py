"""`relay serve`: the server, its listening socket, and the first organisation and key."""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from relay import __version__
from relay.cli.common import check_database, pin_blas
from relay.errors import RelayError
from relay.settings import SERVER_SETTINGS, resolve

if TYPE_CHECKING:
    from relay.store import Store


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


@click.command()
@_setting_options
@click.option(
    "--org",
    "first_org",
    default="default",
    show_default=True,
    help="Name of the organisation created when the database has none.",
)
def serve(first_org: str, **given: Any) -> None:
    """Run the Relay server. On an empty database it creates a first organisation and admin
    key, and prints the key: as a service, whose stdout is its log, create the organisation
    first with 'relay org create' against the same database (docs/deployment.md)."""
    import logging

    import uvicorn

    from relay.server import asgi_app, build_services

    conf = resolve(SERVER_SETTINGS, given)
    pin_blas()
    logging.basicConfig(level=conf["log_level"].upper(), format="%(asctime)s %(name)s %(message)s")
    from relay.store import redact_url

    check_database(conf["db"], create=True)  # never Relay's tables in another program's file
    _refuse_read_only(conf["db"])
    listener = _listen(conf["host"], conf["port"])  # before anything is created or printed
    services = build_services(conf)
    store = services.store
    shown = redact_url(conf["db"])
    _warn_if_shared(conf["db"])
    if not store.list_orgs():
        _first_org(store, first_org, f"http://{conf['host']}:{conf['port']}", shown)
    click.echo(f"Relay {__version__} serving {shown} on http://{conf['host']}:{conf['port']}")
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from relay.connections import head_deadline, raise_open_files_limit

    raise_open_files_limit()
    config = uvicorn.Config(
        asgi_app(services, conf["max_inflight"], conf["max_body_bytes"], conf["body_timeout"]),
        host=conf["host"],
        port=conf["port"],
        log_level=conf["log_level"],
        access_log=False,
        http=head_deadline(AutoHTTPProtocol, conf["body_timeout"]),
    )
    uvicorn.Server(config).run(sockets=[listener])


def _first_org(store: Store, name: str, url: str, shown: str) -> None:
    """The first organisation and its admin key, printed; or, when another process (a
    replica started at the same moment) made the first organisation after this one looked,
    a line saying so instead of an error."""
    from relay.auth import mint_key

    org = store.create_first_org(name)
    if org is None:
        click.echo(
            f"Another process created the first organisation in {shown} as this server"
            " started, and printed its admin key; serving it"
        )
        return
    minted = mint_key(
        store, org.id, "admin", frozenset({"admin", "memory:read", "memory:write"}), frozenset()
    )
    relay = _relay_command()
    click.echo(
        f"\nCreated organisation {org.name!r} ({org.id}) in {shown}\n"
        f"Admin API key (shown once, store it now):\n\n    {minted.secret}\n\n"
        "Next, in another terminal, connect this machine and your agents, then add a memory:\n"
        f"    {relay} install --url {url} --key {minted.secret}\n"
        f'    {relay} remember "Staging is the blue cluster" --source team/infra\n'
        f"    {relay} doctor\n"
    )


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


def _refuse_read_only(db: str) -> None:
    """A SQLite file (or its folder) this user may not write is opened read-only without a
    word: the server would say it is healthy, answer every search and fail every write."""
    from relay.store import database_kind, sqlite_path

    if database_kind(db) != "sqlite" or not sqlite_path(db).is_file():
        return
    path = sqlite_path(db)
    for target, what in ((path, "the database"), (path.parent, "the folder of the database")):
        if not os.access(target, os.W_OK):
            raise RelayError(
                f"{what} {target} is read-only for this user (its permissions, an immutable"
                " flag or a read-only disk): the server writes every memory and key there,"
                " and SQLite its -wal and -shm files beside the database"
            )


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
