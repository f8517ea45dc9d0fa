"""The hook's settings: one table drives the config file, the environment and the docs.

The config file is JSON, at `$RELAY_CONFIG` or else `~/.relay/config.json`, with
the setting names below as keys (`{"url": "http://relay:8080", "api_key_file":
"~/.relay/key"}`). Each setting is overridden by `RELAY_<NAME>` in the
environment. A value that does not parse, or is out of range, falls back to the
default: a typo in a knob must never break a prompt. A token budget past what the hook
can print is capped instead.

The config file's key is for the config file's server: a RELAY_URL naming another (a stale
export, a teammate's .envrc) gets no key from it (`Config.key_kept_for`), only one this
environment names itself (RELAY_API_KEY, RELAY_API_KEY_FILE).
"""

from __future__ import annotations

import os

from relay.hook import codec
from relay.hook.client import parse_url
from relay.hook.pack import MAX_BUDGET_TOKENS, MIN_BUDGET_TOKENS, OUTPUT_MAX_CHARS
from relay.numerals import is_decimal, is_integer

TYPE_CHECKING = False  # `import typing` would cost the hook a few milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    Number = TypeVar("Number", int, float)

    Parser = Callable[[object], object]


def _bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | float):
        return raw != 0
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _number(
    kind: Callable[[Any], Number],
    written: Callable[[str], bool],
    what: str,
    low: Number,
    high: Number,
) -> Callable[[object], Number]:
    """A parser of numbers from `low` to `high`: a JSON number of its `kind` (int, or float,
    which takes an int too), or text `written` as the CLI's options write one
    (`relay.numerals`): int() and float() also took `4_00` as 400, ` 400 `, `+400` and other
    scripts' digits."""

    def parse(raw: object) -> Number:
        if isinstance(raw, bool):
            raise ValueError(f"a boolean, not {what}")
        if not (isinstance(raw, int | kind) or isinstance(raw, str) and written(raw)):
            raise ValueError(f"not {what}")
        value = kind(raw)
        if not low <= value <= high:  # also rejects NaN
            raise ValueError(f"outside {low}..{high}")
        return value

    return parse


def _int(low: int, high: int) -> Callable[[object], int]:
    return _number(int, is_integer, "a whole number", low, high)


def _float(low: float, high: float) -> Callable[[object], float]:
    return _number(float, is_decimal, "a number", low, high)


class Capped(ValueError):
    """A value past its setting's ceiling: the setting takes `value`, the ceiling, not the
    layer below (more of a budget cannot be spent; a default would be far less)."""

    def __init__(self, value: object, why: str) -> None:
        super().__init__(why)
        self.value = value


def _budget(raw: object) -> int:
    """A token budget: MIN_BUDGET_TOKENS..MAX_BUDGET_TOKENS (more is capped), and why."""
    value = _int(0, 1 << 62)(raw)
    if value < MIN_BUDGET_TOKENS:
        raise ValueError(
            f"outside {MIN_BUDGET_TOKENS}..{MAX_BUDGET_TOKENS}: less could never carry a record"
        )
    if value > MAX_BUDGET_TOKENS:
        raise Capped(
            MAX_BUDGET_TOKENS,
            "Claude Code cuts hook output over 10,000 characters to a 2,000-character preview,"
            f" so the hook never prints more than {OUTPUT_MAX_CHARS:,}, about"
            f" {MAX_BUDGET_TOKENS} tokens",
        )
    return value


def _text(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError("expected a string")
    return raw.strip()


# The budget's fixed parts (docs/hook.md, Deadline). The server is told the budget left
# minus PACK_RESERVE_S (for transfer, validation and packing), and a search is not sent
# with less than MIN_SERVER_MS for the server. Before it goes, the process has started and
# passed the gates: about 20 ms on an idle machine (docs/hook.md, Measuring), and the start
# time read from /proc errs early by up to one 10 ms tick. A deadline below their sum can
# never search, so it is out of range like any other bad value (and the layer below applies).
PACK_RESERVE_S = 0.050
MIN_SERVER_MS = 20
START_FLOOR_MS = 30
DEADLINE_MIN_MS = round(PACK_RESERVE_S * 1000) + MIN_SERVER_MS + START_FLOOR_MS
DEADLINE_MAX_MS = 10_000

# name, default, parser, help. Environment variable: RELAY_<NAME upper-cased>.
SETTINGS: tuple[tuple[str, object, Parser, str], ...] = (
    ("url", "", _text, "Base URL of the Relay server, http:// or https://."),
    ("api_key", "", _text, "API key (relay_<id>_<secret>); prefer api_key_file."),
    (
        "api_key_file",
        "",
        _text,
        "File holding the API key (first line); used when api_key is unset, and as"
        " RELAY_API_KEY_FILE over the config file's api_key.",
    ),
    ("state_dir", "~/.relay/state", _text, "Session state, breaker and outcome log."),
    ("memory_off", False, _bool, "Kill switch: 1 disables recall entirely."),
    (
        "deadline_ms",
        400,
        _int(DEADLINE_MIN_MS, DEADLINE_MAX_MS),
        "Whole budget from process start, in milliseconds; less than"
        f" {DEADLINE_MIN_MS} could never search.",
    ),
    ("min_prompt_len", 15, _int(0, 100_000), "Prompts shorter than this never search."),
    (
        "throttle_prompts",
        2,
        _int(0, 1000),
        "No new search within this many prompts of the last that injected (or failed).",
    ),
    (
        "overlap_threshold",
        0.30,
        _float(0.0, 2.0),
        "Search again only when keyword overlap (Jaccard) with the last search is below this.",
    ),
    (
        "min_score",
        0.2,
        _float(0.0, 1.0),
        "Drop results the server scored below this (0: keep all it returns). The hook injects"
        " unasked, so it keeps a higher floor than the server's threshold (0.1), which serves"
        " asked-for searches: in a small org, unrelated prompts scored 0.11 to 0.16.",
    ),
    ("max_records", 3, _int(1, 20), "Most records injected per prompt."),
    (
        "max_tokens",
        600,
        _budget,
        f"Most tokens injected per prompt, labels included, {MIN_BUDGET_TOKENS}.."
        f"{MAX_BUDGET_TOKENS}: less could never carry a record, and more is capped at"
        f" {MAX_BUDGET_TOKENS}, as the hook's output stays under {OUTPUT_MAX_CHARS:,} characters"
        " (Claude Code cuts longer output to a preview).",
    ),
    ("profile", True, _bool, "SessionStart injects the team profile (pinned memories)."),
    ("profile_max_records", 5, _int(1, 20), "Most pinned records injected at SessionStart."),
    (
        "profile_max_tokens",
        800,
        _budget,
        f"Most tokens injected at SessionStart, {MIN_BUDGET_TOKENS}..{MAX_BUDGET_TOKENS} like"
        " max_tokens.",
    ),
    (
        "breaker_failures",
        3,
        _int(1, 1000),
        "Consecutive timeout/unavailable outcomes that open the breaker.",
    ),
    (
        "breaker_cooldown_s",
        30.0,
        _float(0.0, 86_400.0),
        "Seconds the open breaker skips retrieval.",
    ),
    (
        "log_prompt_text",
        False,
        _bool,
        "Also write the prompt text to the outcome log (off: hash only).",
    ),
    ("log_max_bytes", 1_048_576, _int(4096, 1 << 30), "Outcome log size that triggers rotation."),
    ("log_keep", 3, _int(1, 50), "Rotated outcome logs kept (outcomes.jsonl.1 ... .N)."),
)

DEFAULTS: dict[str, object] = {name: default for name, default, _, _ in SETTINGS}


class Config(dict):
    """Resolved settings; attribute access for readability at call sites."""

    # The config file is there but unusable (not a JSON object, unreadable): its settings
    # are lost, which is not the same as a machine never configured (`bad_config`).
    bad_file: bool = False
    # The setting the key was looked for in: "api_key", else "api_key_file" (which names the
    # file holding it); "" when neither was given.
    key_setting: str = ""
    # A key given that the hook cannot send, as `_resolve_key` read it: (its text, "" for
    # none; the OSError that kept the key file from being read, else None). None when the
    # hook has a key, or was given none. `relay.key_source` words it for a person.
    unsent_key: tuple[str, OSError | None] | None = None
    # The config file's url, when its key was kept from the other server RELAY_URL names
    # (`api_key` is then ""; logged `key_elsewhere`): "" when the key goes where `url` says.
    key_kept_for: str = ""
    # Where each setting's value came from (the config file's path or RELAY_<NAME>), for
    # messages; a setting at its default is not in it.
    origin: dict[str, str]

    url: str
    api_key: str
    api_key_file: str
    state_dir: str
    memory_off: bool
    deadline_ms: int
    min_prompt_len: int
    throttle_prompts: int
    overlap_threshold: float
    min_score: float
    max_records: int
    max_tokens: int
    profile: bool
    profile_max_records: int
    profile_max_tokens: int
    breaker_failures: int
    breaker_cooldown_s: float
    log_prompt_text: bool
    log_max_bytes: int
    log_keep: int

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def bad_key(self) -> bool:
        """A key was given that the hook cannot send: logged `bad_key`, not `not_configured`."""
        return self.unsent_key is not None


def not_a_setting(name: str) -> str | None:
    """Why the hook skips key `name` of a config file unread (`not a setting; did you mean
    max_records?`), for `relay doctor` and `relay eval replay --config`; None for a setting,
    or a key starting with `_`, a comment (`relay install` writes `_comment`)."""
    if name in DEFAULTS or name.startswith("_"):
        return None
    import difflib

    near = difflib.get_close_matches(name, DEFAULTS, n=1)
    if near:
        return f"not a setting; did you mean {near[0]}?"
    # A key of the user's own (a note kept beside the settings): the `_` keeps it unread
    # without a warning from doctor or a refusal from `relay eval replay --config`.
    return f"not a setting; docs/hook.md lists them; a note of your own: name it _{name}"


def config_path(environ: Mapping[str, str]) -> str:
    """Where the config file lives: $RELAY_CONFIG, else ~/.relay/config.json."""
    return os.path.expanduser(environ.get("RELAY_CONFIG") or "~/.relay/config.json")


FILE_MAX_BYTES = 65_536


def _read_file(path: str) -> tuple[dict, bool]:
    """(the file's settings, whether it is there but unusable); a missing file is no error."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(FILE_MAX_BYTES)
    except FileNotFoundError:
        return {}, False
    except OSError:
        return {}, True
    try:
        parsed = codec.loads(data)
    except ValueError:
        return {}, True
    return (parsed, False) if isinstance(parsed, dict) else ({}, True)


def file_problem(path: str) -> str | None:
    """Why the config file at `path` cannot be used, in words for a person, with the JSON
    parser's line and column; None when it is missing or fine. For `relay` commands: it
    imports `json`, which the hook does not."""
    import json

    try:
        with open(path, "rb") as fh:
            data = fh.read(FILE_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}): fix its permissions"
    if len(data) > FILE_MAX_BYTES:
        return f"{path} is over {FILE_MAX_BYTES // 1024} KiB, so it is not read: fix the file"

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        parsed = json.loads(data.removeprefix(codec.BOM).decode("utf-8"), parse_constant=refuse)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}"
        return f"{path} is not valid JSON ({where}): fix the file"
    except ValueError as exc:  # not UTF-8, or NaN/Infinity, which the hook refuses
        return f"{path} is not valid JSON ({exc}): fix the file"
    if not isinstance(parsed, dict):
        return f"{path} is JSON but not an object of settings: fix the file"
    return None


def load(
    environ: Mapping[str, str] | None = None,
    ignored: list[str] | None = None,
    capped: list[str] | None = None,
) -> Config:
    """Defaults, then the config file, then RELAY_* variables; a bad value keeps the layer
    below, and is described in `ignored` when given, one past its ceiling takes the ceiling,
    described in `capped` (`relay doctor` shows them)."""
    environ = os.environ if environ is None else environ
    path = config_path(environ)
    from_file, bad_file = _read_file(path)
    resolved = Config()
    resolved.bad_file = bad_file
    resolved.origin = {}
    for name, default, parse, _ in SETTINGS:
        value = default
        variable = "RELAY_" + name.upper()
        for where, layer in ((path, from_file.get(name)), (variable, environ.get(variable))):
            if layer is None:
                continue
            try:
                value = parse(layer)
            except Capped as exc:
                value = exc.value
                if capped is not None:
                    capped.append(f"{name} {layer!r} in {where} at {value} ({exc})")
            except (ValueError, TypeError, OverflowError) as exc:
                if ignored is not None:
                    ignored.append(f"{name} {layer!r} in {where} ({exc})")
                continue
            resolved.origin[name] = where
        resolved[name] = value
    resolved["state_dir"] = os.path.expanduser(resolved["state_dir"] or "~/.relay/state")
    resolved["api_key"] = _resolve_key(resolved)
    _keep_key_home(resolved, from_file.get("url"))
    return resolved


def _keep_key_home(cfg: Config, own_url: object) -> None:
    """Withhold the config file's key from a URL the environment put in place of the file's
    own (`own_url`) when that is another server: the key is the team's memories to whoever
    holds it. A key this environment names (RELAY_API_KEY, RELAY_API_KEY_FILE) is its own
    choice for its URL; a file naming no url pairs its key with none."""
    if not (cfg["api_key"] and cfg["url"]) or cfg.origin.get("url") != "RELAY_URL":
        return
    if cfg.origin.get(cfg.key_setting, "").startswith("RELAY_"):
        return
    if isinstance(own_url, str) and own_url.strip() and not same_server(cfg["url"], own_url):
        cfg.key_kept_for = own_url.strip()
        cfg["api_key"] = ""


# Names of this machine's loopback: `localhost` is what the hook connects to as 127.0.0.1,
# then [::1] (`relay.hook.client.resolve`), so it is the same server as either.
_LOOPBACK = ("127.0.0.1", "::1")


def same_server(url: str, other: str) -> bool:
    """Whether two URLs reach one server, so one key may go to both: the same scheme, host
    and port, a default port spelled out or not (`http://h` is `http://h:80`), a path and a
    trailing slash aside (the key reaches the host whatever the path), a host in any case,
    with or without its final dot, and `localhost` the same as 127.0.0.1 or [::1] (though
    127.0.0.1 is not [::1]: two sockets). Else False, as for a URL the hook cannot use."""
    if url.strip() == other.strip():
        return True
    try:
        (scheme, host, port, _), (scheme2, host2, port2, _) = parse_url(url), parse_url(other)
    except ValueError:
        return False
    hosts = {host.lower().rstrip("."), host2.lower().rstrip(".")}
    local = "localhost" in hosts and hosts <= {"localhost", *_LOOPBACK}
    return scheme == scheme2 and port == port2 and (len(hosts) == 1 or local)


def sendable(key: str) -> bool:
    """Whether `key` can go into the Authorization header: printable ASCII, no space. Every
    key a command or the hook sends is held to this (`relay.key_file.given_key` too)."""
    return all("!" <= ch <= "~" for ch in key)


def _resolve_key(cfg: Config) -> str:
    """The key the hook sends: `api_key`, else the first line of the file `api_key_file`
    names (first when RELAY_API_KEY_FILE names one and only the config file has `api_key`,
    as every RELAY_* outranks the file; an empty one names no file); "" when they give none
    it can send. The one reading of the key's sources: what it found is noted in `cfg`
    (`key_setting`, `unsent_key`) for messages to word."""
    key, error = cfg["api_key"], None
    env_file = cfg["api_key_file"] and cfg.origin.get("api_key_file", "").startswith("RELAY_")
    if env_file and not cfg.origin.get("api_key", "").startswith("RELAY_"):
        key = ""  # this environment's key file outranks a key the config file spells out
    cfg.key_setting = "api_key" if key else ""
    if not key and cfg["api_key_file"]:
        cfg.key_setting = "api_key_file"  # named and missing: a broken install, not none made
        try:
            with open(os.path.expanduser(cfg["api_key_file"]), "rb") as fh:
                lines = fh.read(4096).decode("utf-8", "replace").strip().splitlines()
            key = lines[0].strip() if lines else ""
        except OSError as exc:
            error = exc.with_traceback(None)  # kept for its words, without the frames
    if key and sendable(key):
        return key
    if cfg.key_setting:
        cfg.unsent_key = (key, error)
    return ""
