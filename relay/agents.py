"""What `relay install` writes into each agent's settings, as pure edits on their contents.

Claude Code and Codex share one hook layout (`{"hooks": {Event: [{"matcher"?,
"hooks": [{"type": "command", "command", "timeout"}]}]}}`): Claude Code in
`~/.claude/settings.json` (or a project's `.claude/settings.json`), Codex in
`~/.codex/hooks.json` (or a project's `.codex/hooks.json`). MCP servers are
registered in `~/.claude.json` (`mcpServers`, the user scope that `claude mcp add
--scope user` writes) and in `~/.codex/config.toml` (`[mcp_servers.relay]`).

Every function here takes a file's current content and returns the new content,
so the installer can plan every change, refuse on the first unreadable file and
write nothing, and the tests can check each edit on its own. Relay's entries are
recognised by the hook script's name in the command, or a command that starts
`relay-hook` itself (registered by hand, as docs/hook.md shows), and by the
`relay` server name, so a re-run replaces them instead of adding more, and
uninstall removes only them.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

from relay import json_text
from relay.errors import InvalidRequestError
from relay.hook.codec import NotJSONNumber, finite, no_constant

SCRIPT_NAME = "relay-autosearch-hook.sh"
HOOK_NAME = "relay-hook"  # the console script the knob script execs
# The `timeout` registered with each entry, in seconds in both agents (Claude Code takes any
# number, Codex whole seconds; both kill the hook when it runs out, and default to 600). A
# backstop only: the hook keeps its own deadline (400 ms by default, up to 10,000), then
# needs HOOK_EXIT_MS to log its outcome and exit.
HOOK_TIMEOUT_S = 5  # the least registered, whatever the deadline
HOOK_EXIT_MS = 100
TIMEOUT_MARGIN_S = 1  # beyond the deadline and exit: a loaded machine's slow start and reap
EVENTS = ("UserPromptSubmit", "SessionStart")
SERVER_NAME = "relay"
TOML_BEGIN = "# >>> relay: added by `relay install`; `relay uninstall` removes this block"
TOML_END = "# <<< relay"
TOML_FEATURE_MARK = "# added by relay install"
# What `relay mcp` reads from its environment, as the hook does. Claude Code starts an MCP
# server with the agent's whole environment; Codex only with a few variables (HOME, PATH,
# ...) and those its entry's `env_vars` names: without these, Codex's `relay mcp` read
# ~/.relay/config.json while the hook read the config install wrote at $RELAY_CONFIG.
MCP_ENV_VARS = ("RELAY_CONFIG", "RELAY_URL", "RELAY_API_KEY", "RELAY_API_KEY_FILE")


class SettingsFileError(InvalidRequestError):
    """An agent's settings file cannot be read or edited safely; nothing was written."""


# -- hook commands -----------------------------------------------------------------
def hook_command(script: str, event: str) -> str:
    """The command registered for `event`: runs the script if it exists, else exits 0 quietly.

    `exec` keeps one process from the agent's shell to the Python hook, so the hook's
    deadline (counted from process start) covers this wrapper too. `script` may be
    `"$HOME/..."` (expanded by the shell) for project settings shared by a team.
    """
    quoted = script if script.startswith('"$HOME/') else shlex.quote(script)
    arg = " session-start" if event == "SessionStart" else ""
    return f"[ -x {quoted} ] && exec {quoted}{arg} || exit 0"


def command_words(command: str) -> list[str] | None:
    """`command` split as sh splits it into words and operators (`;`, `&&`, `>`, ...);
    None when it cannot be split (an unclosed quote)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


_REDIRECTS = frozenset({"<", ">", ">>", "<&", ">&", "<>", ">|"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def started_in_command(command: str) -> tuple[str, list[str]] | None:
    """(program, arguments) of the Relay hook that `command` starts: the knob script, or
    `relay-hook` itself, in a command word's place (first, after an operator, after
    `exec` or variable assignments). None when it starts neither."""
    words = command_words(command) or []
    for i, word in enumerate(words):
        if word.rsplit("/", 1)[-1] not in (SCRIPT_NAME, HOOK_NAME):
            continue
        j = i
        while j > 0 and _ASSIGNMENT.match(words[j - 1]):
            j -= 1
        if j and not (words[j - 1] == "exec" or _is_operator(words[j - 1])):
            continue  # an argument, as in `[ -x SCRIPT ]`
        args: list[str] = []
        rest = iter(words[i + 1 :])
        for arg in rest:
            if arg in _REDIRECTS:
                next(rest, None)  # its target
                if args and args[-1].isdigit():
                    args.pop()  # `2>/dev/null`: the descriptor, split off by the lexer
            elif _is_operator(arg):
                break
            else:
                args.append(arg)
        return word, args
    return None


def _is_operator(word: str) -> bool:
    return bool(word) and all(ch in "();<>|&" for ch in word)


def is_relay_handler(handler: object) -> bool:
    """A hook handler that runs Relay's recall hook: through the knob script, or by
    starting `relay-hook` directly as docs/hook.md shows (install replaces either with
    its own entry, so the hook never runs twice per prompt)."""
    if not isinstance(handler, dict):
        return False
    command = str(handler.get("command", ""))
    if SCRIPT_NAME in command:
        return True
    words = command_words(command)
    if words is None:
        return re.search(rf"(^|[\s/'\"]){HOOK_NAME}($|[\s'\";&|)])", command) is not None
    return any(w.rsplit("/", 1)[-1] == HOOK_NAME for w in words)


def _hooks_table(doc: dict[str, Any], where: str) -> dict[str, Any] | None:
    hooks = doc.get("hooks")
    if hooks is None:
        return None
    if not isinstance(hooks, dict):
        raise SettingsFileError(f"{where}: 'hooks' is not an object; fix it by hand first")
    for event in EVENTS:
        groups = hooks.get(event)
        if groups is not None and not (
            isinstance(groups, list) and all(isinstance(g, dict) for g in groups)
        ):
            raise SettingsFileError(
                f"{where}: hooks.{event} is not a list of matcher groups; fix it by hand first"
            )
    return hooks


def strip_hooks(doc: dict[str, Any], where: str = "settings") -> dict[str, Any]:
    """`doc` without Relay's hook handlers; containers that only held them are dropped."""
    out = copy.deepcopy(doc)
    hooks = _hooks_table(out, where)
    if hooks is None:
        return out
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept = []
        touched = False
        for group in groups:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            if isinstance(handlers, list) and any(is_relay_handler(h) for h in handlers):
                touched = True
                handlers = [h for h in handlers if not is_relay_handler(h)]
                if not handlers:
                    continue
                group = {**group, "hooks": handlers}
            kept.append(group)
        if touched and not kept:
            del hooks[event]
        elif touched:
            hooks[event] = kept
    if not hooks and "hooks" in doc and doc["hooks"]:
        del out["hooks"]
    return out


def hook_timeout_s(deadline_ms: int) -> int:
    """The `timeout` (whole seconds) registered for a hook whose deadline is `deadline_ms`:
    5 s, or for a deadline that 5 s could not outlast (the knob takes up to 10,000 ms: a 5 s
    timeout killed the hook mid-search, and the agent showed an error), the deadline and the
    exit rounded up to whole seconds, and a second more."""
    needed = math.ceil((deadline_ms + HOOK_EXIT_MS) / 1000) + TIMEOUT_MARGIN_S
    return max(HOOK_TIMEOUT_S, needed)


def add_hooks(
    doc: dict[str, Any],
    script: str,
    where: str = "settings",
    timeout_s: int = HOOK_TIMEOUT_S,
) -> dict[str, Any]:
    """`doc` with exactly one Relay entry per event (no matcher: every prompt, every source),
    each with `timeout_s` (`hook_timeout_s` of the deadline the hook will run with)."""
    out = strip_hooks(doc, where)
    if out.get("hooks") is None:  # absent, or JSON null: none registered yet
        out["hooks"] = {}
    hooks = out["hooks"]
    for event in EVENTS:
        handler = {
            "type": "command",
            "command": hook_command(script, event),
            "timeout": timeout_s,
        }
        if hooks.get(event) is None:
            hooks[event] = []
        hooks[event].append({"hooks": [handler]})
    return out


@dataclass(frozen=True)
class RelayHandler:
    """One Relay handler as registered: its event, its group's matcher (None when the
    group has none), and the handler itself (`type`, `command`, `timeout`, ...)."""

    event: str
    matcher: object
    handler: dict[str, Any]

    @property
    def command(self) -> str:
        return str(self.handler.get("command", ""))


def relay_handlers(doc: dict[str, Any]) -> list[RelayHandler]:
    """Every Relay handler in a hooks document, in file order (for `relay doctor`)."""
    found: list[RelayHandler] = []
    hooks = doc.get("hooks")
    if not isinstance(hooks, dict):
        return found
    for event, groups in hooks.items():
        for group in groups if isinstance(groups, list) else []:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            for h in handlers if isinstance(handlers, list) else []:
                if is_relay_handler(h):
                    found.append(RelayHandler(event, group.get("matcher"), h))
    return found


# Where a session can start from, as each agent tells its SessionStart hooks (`source`).
SESSION_SOURCES = {
    "claude-code": ("startup", "resume", "clear", "compact"),
    "codex": ("startup", "resume", "clear"),
}


def matcher_matches(matcher: object, value: str) -> bool:
    """Whether a group's `matcher` lets `value` through, as both agents read it: absent,
    empty or `*` matches everything; letters, digits, `_` and `|` name exact values;
    anything else is a regular expression."""
    if matcher is None:
        return True
    if not isinstance(matcher, str):
        return False
    pattern = matcher.strip()
    if pattern in ("", "*"):
        return True
    if re.fullmatch(r"[A-Za-z0-9_|]+", pattern):
        return value in (part.strip() for part in pattern.split("|"))
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return False


def relay_hook_commands(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Event -> the Relay commands registered for it."""
    found: dict[str, list[str]] = {}
    for h in relay_handlers(doc):
        found.setdefault(h.event, []).append(h.command)
    return found


def normalise_hooks(doc: dict[str, Any]) -> dict[str, Any]:
    """For comparing contents: empty or null event lists and an empty or null `hooks` mean
    nothing."""
    out = copy.deepcopy(doc)
    hooks = out.get("hooks")
    if isinstance(hooks, dict):
        for event in [e for e, groups in hooks.items() if groups in ([], None)]:
            del hooks[event]
    if "hooks" in out and not out["hooks"]:
        del out["hooks"]
    return out


# -- MCP registration: Claude Code (JSON) -------------------------------------------
def mcp_entry(relay_bin: str) -> dict[str, Any]:
    return {"type": "stdio", "command": relay_bin, "args": ["mcp"], "env": {}}


def is_relay_server(entry: object) -> bool:
    """A server entry that runs Relay's CLI (`<...>/relay`): ours to replace or remove,
    whatever its arguments, so that install repairs an entry whose `args` were edited
    away from `["mcp"]` instead of leaving it broken."""
    if not isinstance(entry, dict):
        return False
    return str(entry.get("command", "")).rsplit("/", 1)[-1] == "relay"


def runs_relay_mcp(entry: object) -> bool:
    """A server entry that starts `<...>/relay mcp`, as install registers it."""
    return is_relay_server(entry) and isinstance(entry, dict) and entry.get("args") == ["mcp"]


def add_mcp_server(doc: dict[str, Any], relay_bin: str, where: str) -> tuple[dict[str, Any], str]:
    """(`doc` with mcpServers.relay, note). A foreign `relay` entry is left alone."""
    out = copy.deepcopy(doc)
    servers = out.get("mcpServers")
    if servers is not None and not isinstance(servers, dict):
        raise SettingsFileError(f"{where}: 'mcpServers' is not an object; fix it by hand first")
    if servers is None:  # absent, or JSON null: none registered yet
        servers = out["mcpServers"] = {}
    current = servers.get(SERVER_NAME)
    if current is not None and not is_relay_server(current):
        return doc, f"left mcpServers.{SERVER_NAME} as it was: it does not run `relay mcp`"
    servers[SERVER_NAME] = mcp_entry(relay_bin)
    return out, ""


def strip_mcp_server(doc: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
    """`doc` without Relay's server; an entry the original file had is put back instead."""
    out = copy.deepcopy(doc)
    servers = out.get("mcpServers")
    if not isinstance(servers, dict) or not is_relay_server(servers.get(SERVER_NAME)):
        return out
    before = (original or {}).get("mcpServers")
    if isinstance(before, dict) and SERVER_NAME in before:
        servers[SERVER_NAME] = before[SERVER_NAME]
    else:
        del servers[SERVER_NAME]
        if not servers and not isinstance(before, dict):
            if original and "mcpServers" in original:
                out["mcpServers"] = before  # null, as it was
            else:
                del out["mcpServers"]
    return out


# -- Codex config.toml: minimal text edits ------------------------------------------
# A config.toml may open with a UTF-8 byte order mark (Notepad and PowerShell write one):
# Codex reads past it, as the `toml` crate's lexer skips one leading mark (a second is a
# parse error; tests/test_real_clients.py runs the hooks of such a file). tomllib does not
# ("Invalid statement"), so it is read past here too, and the edits keep it in its place.
def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text.removeprefix(json_text.BOM))
    except tomllib.TOMLDecodeError as exc:
        raise SettingsFileError(f"{where} is not valid TOML ({exc}); nothing was changed") from None


def _toml_str(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes (ensure_ascii off: no surrogates).
    return json.dumps(value, ensure_ascii=False)


# The lines `add_codex_config` writes inside its block.
_BLOCK_LINE = re.compile(
    rf'\[features\]|hooks = true|\[mcp_servers\.{SERVER_NAME}\]|command = ".*"|args = \["mcp"\]'
    r"|env_vars = \[.*\]"
)


def strip_codex_config(text: str) -> str:
    """`text` without Relay's marked block and marked feature line, everything else untouched.
    A block whose end marker was deleted ends at the first line Relay does not write there:
    taking all that follows took the user's own tables with it."""
    bom, text = _split_bom(text)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    inside = closed = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped == TOML_BEGIN:
            inside = True
            closed = any(later.strip() == TOML_END for later in lines[i + 1 :])
            if out and out[-1].strip() == "" and (len(out) < 2 or out[-2].strip() != ""):
                out.pop()  # the blank line install put before the block
            continue
        if inside:
            if stripped == TOML_END:
                inside = False
                continue
            if closed or _BLOCK_LINE.fullmatch(stripped):
                continue
            inside = False
        if stripped.endswith(TOML_FEATURE_MARK) and stripped.split("=")[0].strip() == "hooks":
            continue
        out.append(line)
    return bom + "".join(out)


def _split_bom(text: str) -> tuple[str, str]:
    """(the byte order mark `text` opens with, or "", the rest): the line edits work on
    the rest, and the mark goes back in front of what they make."""
    rest = text.removeprefix(json_text.BOM)
    return text[: len(text) - len(rest)], rest


# A header line as splitlines(keepends=True) gives it: CRLF files end it in "\r\n".
_FEATURES_HEADER = re.compile(r"^[ \t]*\[[ \t]*features[ \t]*\][ \t]*(#[^\r\n]*)?\r?$")


def add_codex_config(
    text: str, relay_bin: str | None, where: str, want_feature: bool = True
) -> tuple[str, list[str]]:
    """(new text, notes): `[features] hooks = true` where needed and `[mcp_servers.relay]`.

    Appends one marked block, or inserts one marked line under an existing
    `[features]` header; never rewrites what the user wrote. The result is parsed
    again and checked before it is returned.
    """
    parse_toml(text, where)
    bom, text = _split_bom(text)
    base = strip_codex_config(text)
    data = parse_toml(base, where)
    notes: list[str] = []
    block: list[str] = []
    features = data.get("features")
    features = features if isinstance(features, dict) else {}
    enabled = features.get("hooks", features.get("codex_hooks"))
    feature_line_at = None
    if want_feature and enabled is False:
        notes.append(
            "Codex hooks are turned off in config.toml ([features] hooks = false); "
            "Relay's recall hook will not run in Codex until you set it to true"
        )
    elif want_feature and enabled is None:
        # The first line that reads as the [features] header and is one: a line inside a
        # multi-line string (`developer_instructions = """...`) may read the same, and the
        # flag written under it went into the user's text, leaving hooks off.
        wanted = {**data, "features": {**features, "hooks": True}}
        feature_line_at = next(
            (
                i + 1
                for i, line in enumerate(base.splitlines(keepends=True))
                if _FEATURES_HEADER.match(line) and _reads_as(_flag_under(base, i + 1), wanted)
            ),
            None,
        )
        if feature_line_at is None and "features" in data:
            notes.append(
                "config.toml defines [features] in a form relay install does not edit; add "
                "`hooks = true` under [features] if your Codex version needs it"
            )
        elif feature_line_at is None:
            block += ["[features]", "hooks = true"]
    servers = data.get("mcp_servers")
    servers = servers if isinstance(servers, dict) else {}
    current = servers.get(SERVER_NAME)
    if relay_bin is not None:
        if current is None and not _takes_table(base, f"mcp_servers.{SERVER_NAME}"):
            # `mcp_servers = { ... }` on one line: TOML lets no table extend it. The file is
            # valid; it was refused as "not valid TOML", and the whole install with it.
            notes.append(
                "config.toml defines mcp_servers as an inline table, which relay install does"
                f' not edit; add relay = {{ command = {_toml_str(relay_bin)}, args = ["mcp"] }}'
                " to it for explicit recall"
            )
        elif current is None:
            block += [
                f"[mcp_servers.{SERVER_NAME}]",
                f"command = {_toml_str(relay_bin)}",
                'args = ["mcp"]',
                f"env_vars = [{', '.join(map(_toml_str, MCP_ENV_VARS))}]",
            ]
        elif current.get("command") != relay_bin or current.get("args") != ["mcp"]:
            notes.append(
                f"left [mcp_servers.{SERVER_NAME}] in config.toml as it was (not written by "
                f"relay install); make it run `{relay_bin} mcp` for explicit recall"
            )
    new = base if feature_line_at is None else _flag_under(base, feature_line_at)
    nl = _line_end(base)
    if block:
        if new and not new.endswith("\n"):
            new += nl
        sep = nl if new.strip() else ""
        new += sep + nl.join([TOML_BEGIN, *block, TOML_END]) + nl
    check = parse_toml(new, where)  # never hand back text that Codex could not read
    if relay_bin is not None and f"[mcp_servers.{SERVER_NAME}]" in block:
        assert check["mcp_servers"][SERVER_NAME] == codex_mcp_entry(relay_bin)
    return bom + new, notes


def _line_end(text: str) -> str:
    return "\r\n" if text.split("\n", 1)[0].endswith("\r") else "\n"  # the file's own


def _flag_under(text: str, at: int) -> str:
    """`text` with Relay's marked `hooks = true` line inserted as its line number `at`."""
    nl = _line_end(text)
    lines = text.splitlines(keepends=True)
    if not lines[at - 1].endswith("\n"):
        lines[at - 1] += nl
    lines.insert(at, f"hooks = true  {TOML_FEATURE_MARK}{nl}")
    return "".join(lines)


def _takes_table(text: str, name: str) -> bool:
    """Whether a `[name]` table appended to `text` (valid TOML) leaves it valid."""
    try:
        tomllib.loads(f"{text}\n[{name}]\n")
    except tomllib.TOMLDecodeError:
        return False
    return True


def _reads_as(text: str, wanted: dict[str, Any]) -> bool:
    try:
        return tomllib.loads(text) == wanted
    except tomllib.TOMLDecodeError:
        return False


def codex_mcp_entry(relay_bin: str) -> dict[str, Any]:
    """The `[mcp_servers.relay]` table install writes into Codex's config.toml."""
    return {"command": relay_bin, "args": ["mcp"], "env_vars": list(MCP_ENV_VARS)}


def codex_hooks_enabled(config: dict[str, Any]) -> bool | None:
    """The `[features] hooks` (or legacy `codex_hooks`) flag of a parsed config.toml; None
    when unset. (The caller parses: a file that is not TOML is its own finding.)"""
    features = config.get("features")
    if not isinstance(features, dict):
        return None
    value = features.get("hooks", features.get("codex_hooks"))
    return value if isinstance(value, bool) else None


# -- JSON helpers ---------------------------------------------------------------------
def parse_json(
    text: str, where: str, rerun: str | None = "relay install", bom_ok: bool = True
) -> dict[str, Any]:
    """A settings file's object. Refused, in one line naming `where` and the command to
    `rerun` once the file is fixed (install's, unless uninstall is reading it; None for a
    reader that changes nothing, as doctor): what is not JSON, and a number past a double's
    range, which the rewrite would write as `Infinity`, losing the whole file for the agent.
    A leading UTF-8 byte order mark is read past, as Claude Code does (`json_text.render`
    keeps it), unless not `bom_ok`: Codex runs none of the hooks of a hooks.json with one
    (tests/test_real_clients.py)."""
    then = f", then run {rerun} again. Nothing was changed" if rerun else ""
    if text.startswith(json_text.BOM) and not bom_ok:  # Python's words: "decode using utf-8-sig"
        raise SettingsFileError(
            f"{where} starts with a UTF-8 byte order mark (BOM), and Codex runs none of the"
            f" hooks of such a file, Relay's included. Save it as UTF-8 without a BOM{then}"
        )
    text = text.removeprefix(json_text.BOM)
    if not text.strip():
        return {}
    try:
        doc = json.loads(text, parse_float=finite, parse_constant=no_constant)
    except NotJSONNumber as exc:
        literal, infinite = exc.args
        why = (
            "past a double's range: read, it is infinity, which JSON cannot write back"
            if infinite  # JSON.parse reads 1e400 as Infinity, which JSON cannot spell
            else "no JSON number: the agents cannot read this file"
        )
        raise SettingsFileError(
            f"{where} holds the number {literal}, {why}; write it as a string or a finite"
            f" number{then}"
        ) from None
    except ValueError as exc:
        extras = json_text.jsonc_extras(text)
        if extras:  # JSON with comments, which Claude Code refuses whole ("malformed JSON")
            raise SettingsFileError(
                f"{where} holds {' and '.join(what for what, _ in extras)}, which JSON does"
                " not allow: the agents and Relay's hook read their files as JSON, and skip"
                f" all of one that has them. Take out {' and '.join(r for _, r in extras)}"
                f"{then}"
            ) from None
        raise SettingsFileError(
            f"{where} is not valid JSON ({exc}); fix or move it{then}"
        ) from None
    if not isinstance(doc, dict):
        raise SettingsFileError(
            f"{where} does not hold a JSON object" + ("; nothing was changed" if rerun else "")
        )
    return doc
