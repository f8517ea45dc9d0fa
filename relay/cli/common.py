"""What the `relay` commands share: the database and server options, JSON output, a
progress bar."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from relay.errors import InvalidRequestError, RelayError
from relay.key_file import given_key, key_file_option
from relay.settings import EMBEDDERS, SERVER_SETTINGS, resolve


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        envvar="RELAY_DB",
        help="SQLite path or postgresql:// URL [default: RELAY_DB, else $RELAY_HOME/relay.db;"
        " RELAY_HOME: ~/.relay].",
    )(fn)


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    # RELAY_URL is read with the hook's settings (`RelayClient.from_config`), not by click:
    # a refusal to send the installed key there then names the variable, not a flag.
    @click.option("--url", help="Relay server URL [default: RELAY_URL, else from relay install].")
    @click.option(
        "--key",
        envvar="RELAY_API_KEY",
        help="API key [default: RELAY_API_KEY, else from relay install].",
    )
    @key_file_option
    @functools.wraps(fn)
    def wrapper(url: str | None, key: str | None, key_file: str | None, **kwargs: Any) -> Any:
        from relay.client import RelayClient

        client = RelayClient.from_config(url, given_key(key, key_file))
        return fn(client=client.require_key(), **kwargs)

    return wrapper


def open_store(db: str | None, create: bool = False):  # noqa: ANN202
    """The store `--db` (or RELAY_DB, or the default) names (see `check_database`)."""
    from relay.store import open_store

    url = resolve(SERVER_SETTINGS, {"db": db}, {})["db"] if db is None else db
    check_database(url, create)
    return open_store(url)


def check_database(url: str, create: bool) -> None:
    """Only `create` may make a new SQLite file, and nothing may write Relay's tables into a
    file that is not a Relay store: a mistyped path would otherwise leave an empty database
    (and its folders) behind, or change someone else's database, and report 'no
    organisation'."""
    from relay.store import database_kind, open_relay_file, sqlite_path

    if database_kind(url) == "sqlite":
        if sqlite_path(url).exists():
            open_relay_file(url).close()
        elif not create:
            raise InvalidRequestError(
                f"no Relay database at {sqlite_path(url)} (relay serve or relay org create "
                "makes one; check --db or RELAY_DB)"
            )


def one_line(message: str) -> str:
    """`message` with any line break or other control character escaped (`\\n`): a value
    echoed from the user or a file must not split an error into lines that read as two."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)


def error_line(message: str) -> str:
    """`message` as `relay: error:` prints it: one line, and no key's secret in it (a key
    typed where another value goes is echoed back by many a refusal)."""
    from relay.auth import withhold_secrets

    return one_line(withhold_secrets(message))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def pin_blas() -> None:
    """One BLAS thread: the vector product is small, and a second spinning BLAS thread takes
    the core the other requests need (measured at 100k memories: CPU per search p50
    47 -> 35 ms, p95 181 -> 71 ms). Must run before numpy loads."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def progress_bar(length: int, label: str) -> Any:
    """A bar on stderr; without a terminal none (it was one lone label line, even before an
    error)."""
    return click.progressbar(
        length=length, label=label, file=sys.stderr, hidden=not sys.stderr.isatty()
    )


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, a unit stopped, `kill`) ends a bulk write as Ctrl-C does,
    saying how far it got: by default it ended the process without a word."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_interrupted(done: str, again: str) -> NoReturn:
    """Ctrl-C in a bulk write: one line saying how far it got (`done`), and exit 1 without
    click's 'aborted' after it."""
    click.echo(
        f"relay: interrupted with {done}; running the same {again} again finishes it", err=True
    )
    sys.exit(1)


def failed_midway(exc: RelayError, done: str, again: str) -> RelayError:
    """`exc`, the error a bulk write stopped at, saying how far it got (`done`) and that
    running the same command (`again`) finishes it."""
    return type(exc)(
        f"{exc.message}; the {again} stopped there, with {done}; once that is dealt with,"
        f" running the same {again} again finishes it",
        **exc.details,
    )


def sent_unanswered(in_flight: int, exc: BaseException | None = None) -> int:
    """How many of the batch on its way (`in_flight` items) the server may still write: it
    commits a batch it has read even when the client is gone; an answered refusal wrote
    none of it."""
    from relay.client import ConnectionFailedError

    if exc is not None and not (isinstance(exc, ConnectionFailedError) and exc.sent):
        return 0
    return in_flight


def maybe_written(in_flight: int, exc: BaseException | None = None) -> str:
    """What to say of the batch that was on its way (`sent_unanswered`)."""
    if not (n := sent_unanswered(in_flight, exc)):
        return ""
    return f", and {n} more sent that the server may still write"


def figures_json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json PATH` of a benchmark: where its figures go (`json_path`)."""
    return click.option(
        "--json",
        "json_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Write the figures as JSON here.",
    )(fn)


def embedder_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--embedder",
        default=EMBEDDERS[0],
        show_default=True,
        type=click.Choice(EMBEDDERS),
        help="Embedding provider.",
    )(fn)
