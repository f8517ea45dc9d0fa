"""`--key-file FILE`: the API key read from a file, for every command that takes `--key`. A
key typed on the command line shows in `ps` and the shell's history; a file keeps it out
of both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from relay.errors import InvalidRequestError


def key_file_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--key-file FILE` option, read with `key_from_file`."""
    return click.option(
        "--key-file",
        type=click.Path(dir_okay=False, exists=True),
        help="Read the API key from this file's first line (instead of --key, which ps and"
        " shell history show; beats RELAY_API_KEY).",
    )(fn)


def key_from_file(key_file: str) -> str:
    """The key the `--key-file` given names (`read_key_file`). It beats RELAY_API_KEY, as
    a flag beats the environment; beside a --key typed it is refused."""
    ctx = click.get_current_context()
    typed = ctx.get_parameter_source("key") is click.core.ParameterSource.COMMANDLINE
    if typed and ctx.params.get("key"):
        raise click.UsageError("give --key or --key-file, not both")
    return read_key_file(key_file)


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
