"""Server settings: one table drives the flags, the environment variables, `--help` and checks."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.errors import InvalidRequestError
from relay.numerals import is_decimal, is_integer

# The embedding providers (relay.embedding.PROVIDERS, which loads numpy, maps them to classes).
EMBEDDERS = ("onnx", "sentence-transformers")


def default_db() -> str:
    return str(Path(os.environ.get("RELAY_HOME", Path.home() / ".relay")) / "relay.db")


@dataclass(frozen=True)
class Setting:
    name: str  # the flag is --name with dashes; the variable RELAY_NAME in upper case
    default: Any
    help: str
    type: Callable[[str], Any] = str

    @property
    def env(self) -> str:
        return "RELAY_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def fraction(text: str) -> float:
    """A number from 0 up to (not including) 1."""
    if not is_decimal(text):  # as every decimal option: RELAY_THRESHOLD=0_5 is no 0.5
        raise ValueError(f"{text!r} is not a decimal number")
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{text} is not in [0, 1)")
    return value


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number from `low` up to `high` (None: no upper bound)."""

    def parse(text: str) -> int:
        if not is_integer(text):  # as every integer option: RELAY_PORT=80_80 is no 8080
            raise ValueError(f"{text!r} is not a whole number")
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(
                f"{text} is not in {low}..{high}" if high is not None else f"{text} is below {low}"
            )
        return value

    parse.__name__ = "integer"  # what --help shows as the value's type
    return parse


def one_of(*names: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in names:
            raise ValueError(f"{text!r} is not one of {', '.join(names)}")
        return value

    parse.__name__ = "|".join(names)
    return parse


SERVER_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "db",
        None,
        "SQLite file path, or a postgresql:// URL (default $RELAY_HOME/relay.db; RELAY_HOME:"
        " ~/.relay)",
    ),
    Setting("host", "127.0.0.1", "address to listen on"),
    Setting("port", 8765, "port to listen on (1 to 65535)", whole(1, 65535)),
    Setting(
        "embedder",
        "onnx",
        "embedding provider: onnx (no torch) or sentence-transformers",
        one_of(*EMBEDDERS),
    ),
    Setting("embed_threads", 1, "threads the embedding model may use per call", whole(1, 64)),
    Setting(
        "cache_entries", 10_000, "search results kept in the in-process cache (0: off)", whole(0)
    ),
    Setting("max_body_bytes", 262_144, "largest request body accepted (1024 or more)", whole(1024)),
    Setting(
        "body_timeout",
        10,
        "seconds a request's head, then its body, may take to arrive before a 408 (1 to 600)",
        whole(1, 600),
    ),
    Setting("max_inflight", 64, "requests served at once before shedding load with 503", whole(1)),
    Setting(
        "log_level",
        "info",
        "log level: debug, info, warning or error",
        one_of("debug", "info", "warning", "error"),
    ),
    Setting(
        "threshold",
        None,
        "relevance threshold on the server's estimate that a query has an answer at all: 0"
        " answers every query; 0.7 refuses most questions about the wrong person, at some"
        " recall (default 0.1, the calibrated setting: docs/http-api.md)",
        fraction,
    ),
)


def resolve(
    settings: tuple[Setting, ...], given: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Flags beat environment variables beat defaults; values are converted and checked."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for s in settings:
        value = given.get(s.name)
        if value is None and s.env in env:
            try:
                value = s.type(env[s.env])
            except ValueError as exc:
                message = f"{s.env}={env[s.env]!r} is not a valid {s.name}: {exc}"
                raise InvalidRequestError(message) from exc
        out[s.name] = s.default if value is None else value
    if out.get("db") is None and any(s.name == "db" for s in settings):
        out["db"] = default_db()
    return out
