"""`--key-file FILE`: the API key read from a file, for every command that takes `--key`. A
key typed on the command line shows in `ps` and the shell's history; a file keeps it out
of both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from relay.errors import InvalidRequestError
from relay.hook.config import sendable
from relay.key_source import unsendable


def key_file_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--key-file FILE` option, read with `given_key`."""
    return click.option(
        "--key-file",
        type=click.Path(dir_okay=False, exists=True),
        help="Read the API key from this file's first line (instead of --key, which ps and"
        " shell history show; beats RELAY_API_KEY).",
    )(fn)


def given_key(key: str | None, key_file: str | None) -> str | None:
    """The key a command was given: `--key-file` (`read_key_file`), which beats
    RELAY_API_KEY as a flag beats the environment and is refused beside a --key typed; else
    `--key` or RELAY_API_KEY. One that cannot go into an HTTP header (a byte-order mark, a
    character not printable ASCII) is refused here, in words, as a bad RELAY_API_KEY_FILE is
    (`key_source.unsendable`): http.client raised UnicodeEncodeError on it."""
    ctx = click.get_current_context()
    typed = ctx.get_parameter_source("key") is click.core.ParameterSource.COMMANDLINE
    if key_file:
        if typed and ctx.params.get("key"):
            raise click.UsageError("give --key or --key-file, not both")
        key, named = read_key_file(key_file), f"the key file {key_file}"
    else:
        named = "the API key given by --key" if typed else "the API key in RELAY_API_KEY"
    if key and not sendable(key):
        raise InvalidRequestError(f"{named} {unsendable(key)}")
    return key


def read_key_file(path: str) -> str:
    """The API key from the first line of `path` that holds anything."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidRequestError(f"cannot read the key file {path}: {why}") from None
    lines = text.strip().splitlines()
    if not lines:
        raise InvalidRequestError(
            f"the key file {path} is empty: the API key goes on its first line"
        )
    return lines[0].strip()
