"""The hook's API key in words for a person: where it comes from, and why the hook sends
none though one was given (what it logs as `bad_key`, or `key_elsewhere`).

The hook reads its key's sources once, in `relay.hook.config.load`, and notes what it
found there (`Config.key_setting`, `Config.unsent_key`). This module words that note for
`relay` commands and `relay doctor`, so both describe the key the hook read, by its rule,
and the hook's hot path carries none of the wording.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from relay.hook.config import Config


class KeyProblem(NamedTuple):
    """What is wrong with the key given, and what to do about it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"


def setting_place(cfg: Config, setting: str, show: Callable[[str], str] = str) -> str:
    """Where `cfg` took `setting` from: `RELAY_<NAME>`, or `<setting> in <config file>`;
    `show` shortens a path (doctor's `~/`)."""
    where = cfg.origin.get(setting, "")
    return where if where.startswith("RELAY_") else f"{setting} in {show(where)}"


def elsewhere(cfg: Config, url: str | None = None) -> str | None:
    """Why `cfg` has no key for the server asked, when the config file's was kept from it
    (`cfg.key_kept_for`): "URL is not the server this machine's key is for (INSTALLED)",
    for the caller to add how to give that server's key; None when none was kept. `url`:
    the --url given, else RELAY_URL named the server."""
    if not cfg.key_kept_for:
        return None
    named = url.strip() if url else f"RELAY_URL ({cfg.url})"
    return f"{named} is not the server this machine's key is for ({cfg.key_kept_for})"


def key_problem(cfg: Config, show: Callable[[str], str] = str) -> KeyProblem | None:
    """Why the hook sends no key though `cfg` was given one (`cfg.bad_key`, or kept from
    the server RELAY_URL names), from what the hook read, and the fix; None when it has a
    key, or was given none."""
    kept = elsewhere(cfg)
    if kept:
        return KeyProblem(
            kept,
            "unset RELAY_URL, or set RELAY_API_KEY_FILE to a file holding that server's key",
        )
    if cfg.unsent_key is None:
        return None
    text, error = cfg.unsent_key
    if cfg.key_setting == "api_key":
        where = setting_place(cfg, "api_key", show)
        return KeyProblem(f"the API key in {where} {unsendable(text)}", f"fix {where}")
    path = show(os.path.expanduser(cfg.api_key_file))
    place = setting_place(cfg, "api_key_file", show)
    named = f"the key file {path} (named by {place})"
    # `relay install` writes ~/.relay/key, not a file RELAY_API_KEY_FILE names.
    other = (
        f"or set {place} to the right file, or unset it"
        if place.startswith("RELAY_")
        else "or run `relay install --key-file FILE`, which writes the key file afresh"
    )
    if isinstance(error, FileNotFoundError):
        return KeyProblem(
            f"{named} does not exist", f"write the API key on the first line of {path}, {other}"
        )
    if isinstance(error, IsADirectoryError):
        return KeyProblem(f"{named} is a directory", f"name the key file itself, {other}")
    if error is not None:
        return KeyProblem(
            f"{named} cannot be read ({error.strerror or error})",
            f"make it a file you can read (chmod 600 {path}), {other}",
        )
    if not text:
        return KeyProblem(
            f"{named} is empty", f"write the API key on the first line of {path}, {other}"
        )
    if text.startswith("\ufeff"):
        fix = f"save {path} without the mark (as plain ASCII), {other}"
    else:
        fix = f"write the key alone on the first line of {path}, {other}"
    return KeyProblem(f"{named} {unsendable(text)}", fix)


def unsendable(key: str) -> str:
    """What in `key` the hook will not send (printable ASCII only: it goes into a header)."""
    if key.startswith("\ufeff"):
        return (
            "starts with a byte-order mark (the bytes EF BB BF, which some editors put at the"
            " start of a UTF-8 file)"
        )
    at, bad = next((i, ch) for i, ch in enumerate(key + "\n") if not "!" <= ch <= "~")
    if at == len(key):
        return "is empty"
    if bad == "\ufffd":
        return f"holds bytes that are not UTF-8 text (character {at + 1})"
    if bad == " ":
        return f"holds a space (character {at + 1}), which no key has"
    return f"holds {bad!r} (character {at + 1}), not printable ASCII"
