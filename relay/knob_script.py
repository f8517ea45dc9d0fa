"""The knob script, `~/.relay/relay-autosearch-hook.sh`: what `relay install` writes, and
the one reading of it that doctor, `relay eval replay --apply` and install share.

The agents run it on every prompt. Its first command is a guard (stderr to /dev/null,
exit status 0 whatever happens below); then a `while read` loop takes the knobs,
`NAME=value` lines of a here-document, as data, not as shell, and hands each to the hook
as `RELAY_<NAME>`; then it execs `relay-hook`. `read` follows that loop line by line, so
what doctor shows is what the hook gets. A script written before the guard set its knobs
as shell assignments: its lines are read with the same rule (`knob_line`), wherever they
are, and `relay install` rewrites it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay import agents
from relay.hook import config as hook_config

# The knobs the script owns: (its variable, the hook's setting, the comment above it).
SCRIPT_KNOBS = (
    (
        "THROTTLE_PROMPTS",
        "throttle_prompts",
        "No new search within this many prompts of the last one that injected something.",
    ),
    (
        "OVERLAP_THRESHOLD",
        "overlap_threshold",
        "Search again only when keyword overlap with the last search is below this (0..1).",
    ),
    ("MIN_PROMPT_LEN", "min_prompt_len", "Prompts shorter than this many characters never search."),
    (
        "DEADLINE_MS",
        "deadline_ms",
        "Whole budget per prompt in ms, from process start; then the prompt goes on"
        f" ({hook_config.DEADLINE_MIN_MS}..{hook_config.DEADLINE_MAX_MS}, else ignored).",
    ),
)
SCRIPT_VARS = tuple(var for var, _, _ in SCRIPT_KNOBS)
SETTING_OF = {var: name for var, name, _ in SCRIPT_KNOBS}
# The script's first command, before anything that can fail: whatever goes wrong below it
# (a typo, a relay-hook that moved), nothing reaches stderr and the exit status is 0, as an
# agent shows a hook's stderr and Claude Code blocks, and erases, a prompt whose hook exits
# 2. A syntax error or a failed `exec` runs the EXIT trap in dash; bash (macOS's sh)
# skips it on a failed `exec` unless `execfail` lets the script go on to its end.
SCRIPT_GUARD = "exec 2>/dev/null; trap 'exit 0' EXIT; [ -z \"$BASH_VERSION\" ] || shopt -s execfail"
KNOBS_END = "KNOBS"
# How the loop reads a knob line, mirrored in `knob_line`: `IFS='= <tab>' read` splits
# `NAME=value`, `NAME = value` and `NAME value` alike, trimmed; one quote is taken off each
# end, as `DEADLINE_MS="400"` would lose them in shell.
_KNOB_LINE = re.compile(r"[ \t]*([^=\s]*)(?:(?:[ \t]*=[ \t]*|[ \t]+)(.*?))?[ \t]*")
_LONE_SEPARATOR = re.compile(r"([^=\s]*)[ \t]*=")
# The loop's last line, which opens the here-document of knobs: `done <<'KNOBS'`.
_KNOBS_START = re.compile(r"[ \t]*done[ \t]*<<-?[ \t]*(['\"]?)(\w+)\1[ \t]*")
_PLAIN_ASSIGNMENT = re.compile(r"[ \t]*[A-Z_]+=[\w.+-]*[ \t]*(?:#.*)?")
SHELLS = frozenset({"sh", "dash", "bash", "ksh", "mksh", "zsh", "ash", "busybox"})
REWRITE = "run `relay install` to rewrite the script (knobs back to their defaults)"


def hook_script(relay_hook: str) -> str:
    """The installed hook script: knobs read as data, not run as shell, then `exec` of the
    hook; a typo in it can neither stop a prompt nor print anything (docs/integrations.md)."""
    names = " | ".join(SCRIPT_VARS)
    lines = [
        "#!/bin/sh",
        "# Whatever goes wrong below, the prompt goes on: no output on stderr, exit status 0.",
        SCRIPT_GUARD,
        "",
        "# Relay automatic recall: Claude Code and Codex run this on every prompt (and with",
        "# `session-start` when a session starts). Written by `relay install`, yours to edit:",
        "# edits apply from the next prompt, no restart; `relay install` restores the defaults.",
        "# Delete this file to turn automatic recall off; the agents then skip it silently.",
        "#",
        f"# The knobs, down to the {KNOBS_END} line, are NAME=value lines read as data, not run",
        "# as shell: a value the hook cannot use counts as no line at all (`relay doctor` names",
        "# it). Each reaches the hook as RELAY_<NAME> and beats ~/.relay/config.json; the same",
        "# variable in the agent's environment beats it (`RELAY_MIN_PROMPT_LEN=0 claude`).",
        "while IFS='= \t' read -r knob value; do",
        "  value=${value#[\\\"\\']}; value=${value%[\\\"\\']}",
        f"  case $knob in {names})",
        '    eval "export RELAY_$knob=\\"\\${RELAY_$knob:-\\$value}\\"" ;;',
        "  esac",
        f"done <<'{KNOBS_END}'",
    ]
    for var, name, help_text in SCRIPT_KNOBS:
        lines += [f"# {help_text}", f"{var}={knob_value(hook_config.DEFAULTS[name])}"]
    lines += [KNOBS_END, f'exec {shlex.quote(relay_hook)} "$@"', ""]
    return "\n".join(lines)


def deadline_after_install(environ: dict[str, str]) -> int:
    """The deadline (ms) the hook runs with once `relay install` has written its script, knobs
    at their defaults, for agents started with `environ`: RELAY_DEADLINE_MS when it sets a
    value the hook takes (it beats the script), else the script's DEADLINE_MS. Install
    registers the entries' timeout for it, and doctor offers install as a fix only for it."""
    handed = read(hook_script(agents.HOOK_NAME)).handed(dict(environ))
    return hook_config.load(handed).deadline_ms


def knob_value(value: Any) -> str:
    """A setting's value as the script writes it."""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _fields(line: str) -> tuple[str, str] | None:
    """(first field, value) as the loop's `read` splits `line`, one quote off each end."""
    found = _KNOB_LINE.fullmatch(line)
    if not found:
        return None
    value = found.group(2) or ""
    lone = _LONE_SEPARATOR.fullmatch(value)
    if lone:  # `450=`: read drops a trailing separator after the one field it leaves
        value = lone.group(1)
    value = value[1:] if value[:1] in ('"', "'") else value
    value = value[:-1] if value[-1:] in ('"', "'") else value
    return found.group(1), value


def knob_line(line: str) -> tuple[str, str] | None:
    """(VAR, value) when `line` sets one of the script's knobs, as the script reads it."""
    fields = _fields(line)
    return fields if fields and fields[0] in SCRIPT_VARS else None


@dataclass(frozen=True)
class Knob:
    """A line the script takes a knob from."""

    line: int  # 1-based
    text: str  # as written
    var: str  # DEADLINE_MS
    value: str  # what the script hands the hook from it


@dataclass
class Reading:
    """The script as it runs: its knob lines, the program it execs, and its shape."""

    data: bool = False  # knobs in the loop's here-document (else shell, from before the guard)
    guarded: bool = False  # SCRIPT_GUARD is one of its lines
    end: str = KNOBS_END  # the line that ends the knobs
    closed: bool = True  # that line is there (else the rest of the file is read as knobs)
    knobs: list[Knob] = field(default_factory=list)  # in the order the script reads them
    # (line, text): in the knobs, a line that is not one; outside them, a knob line, shell
    strays: list[tuple[int, str]] = field(default_factory=list)
    hook: str | None = None  # the program it execs

    def supplied(self) -> dict[str, Knob]:
        """The line each knob's value comes from: the first with a value, as the loop keeps
        `${RELAY_X:-$value}` once it is not empty (else the first, empty)."""
        out: dict[str, Knob] = {}
        for knob in self.knobs:
            if knob.var not in out or (not out[knob.var].value and knob.value):
                out[knob.var] = knob
        return out

    def handed(self, environ: dict[str, str]) -> dict[str, str]:
        """`environ` as the script hands it to the hook: each knob's `RELAY_<VAR>` from the
        script, unless `environ` already sets it to something."""
        out = dict(environ)
        for var, knob in self.supplied().items():
            if not out.get(f"RELAY_{var}"):
                out[f"RELAY_{var}"] = knob.value
        return out

    def suspect(self) -> Knob | None:
        """In a script whose knobs are shell (from before the guard), the first knob line sh
        may not take as written: sh reports an unclosed quote at the file's end, not there."""
        if self.data:
            return None  # the knobs are data: whatever sh cannot parse is elsewhere
        return next((k for k in self.knobs if not _PLAIN_ASSIGNMENT.fullmatch(k.text)), None)

    def problems(self, shown: str) -> list[Problem]:
        """The knob lines the script cannot use, each with what happens and its fix, in
        line order; `shown` names the script."""
        out: list[Problem] = []
        supplied = self.supplied()
        for knob in self.knobs:
            first = supplied[knob.var]
            if self.data and knob.line > first.line:
                out.append(
                    Problem(
                        knob.line,
                        f"line {knob.line} of {shown}, `{knob.text.strip()}`, is not used: line"
                        f" {first.line} sets {knob.var} first, and the script takes the first",
                        f"keep one {knob.var} line",
                    )
                )
        parsers = {name: parse for name, _, parse, _ in hook_config.SETTINGS}
        for knob in supplied.values():
            var, name = knob.var, SETTING_OF[knob.var]
            try:
                parsers[name](knob.value)
            except (ValueError, TypeError, OverflowError) as exc:
                out.append(
                    Problem(
                        knob.line,
                        f"the hook ignores {name} {knob.value!r} from line {knob.line} of "
                        f"{shown}, `{knob.text.strip()}` ({exc}), and takes config.json's "
                        "value or its default",
                        _value_fix(var, knob.value, str(exc)),
                    )
                )
        if self.closed:  # else the rest of the file is in the knobs, and that is the problem
            out += [self._stray(number, text, shown) for number, text in self.strays]
        return sorted(out, key=lambda problem: problem.line)

    def _stray(self, number: int, text: str, shown: str) -> Problem:
        where = f"line {number} of {shown}, `{text.strip()}`,"
        knob = knob_line(text)
        if knob:  # shell, below or above the knobs: a variable the hook never gets
            return Problem(
                number,
                f"{where} is not among the knobs: it is shell, and the script never hands "
                f"{knob[0]} to the hook",
                f"move it among the knobs, above the `{self.end}` line",
            )
        import difflib

        name, value = _fields(text) or (text.strip(), "")
        if name == "export":  # `export DEADLINE_MS=900`, as in shell
            name, value = _fields(value) or (name, value)
        setting = name.lower().removeprefix("relay_")
        meant = difflib.get_close_matches(setting.upper(), SCRIPT_VARS, n=1, cutoff=0.55)
        if meant:
            fix = f"write it as {meant[0]}={value}"
        elif setting in hook_config.DEFAULTS:
            fix = f"remove it, and set {setting} in config.json"
        else:
            fix = "remove it; the hook's other settings go in config.json (docs/hook.md)"
        knobs = ", ".join(SCRIPT_VARS[:-1]) + f" and {SCRIPT_VARS[-1]}"
        return Problem(number, f"{where} sets nothing: the script reads only {knobs}", fix)


def _value_fix(var: str, value: str, why: str) -> str:
    """The fix for a knob value the hook cannot use, after `why` it cannot."""
    if why.startswith("outside "):
        return f"set {var} to a value in {why.removeprefix('outside ')}, or {REWRITE}"
    if re.search(r"[\s#]", value):
        return (
            f"write {var}=VALUE with nothing after the value (a comment goes on a line of its"
            f" own), or {REWRITE}"
        )
    return f"give {var} a value the hook takes (this one is {why}), or {REWRITE}"


@dataclass(frozen=True)
class Problem:
    """A knob line the script cannot use."""

    line: int
    message: str
    fix: str


def read(text: str) -> Reading:
    """The script read as it runs: the knob lines of its here-document (or, in a script
    from before the guard, every line `knob_line` reads), and what it execs."""
    lines = text.splitlines()
    starts = [(i, m) for i, line in enumerate(lines) if (m := _KNOBS_START.fullmatch(line))]
    reading = Reading(data=bool(starts))
    block = range(0)
    if starts:
        start, opener = starts[0]
        reading.end = opener.group(2)
        stop = next((i for i in range(start + 1, len(lines)) if lines[i] == reading.end), None)
        reading.closed = stop is not None
        block = range(start + 1, len(lines) if stop is None else stop)
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("#"):
            continue
        knob = knob_line(line)
        if number - 1 in block:
            if knob:
                reading.knobs.append(Knob(number, line, *knob))
            elif line.strip():
                reading.strays.append((number, line))
        elif knob:
            if reading.data:  # shell outside the knobs: a variable the hook never gets
                reading.strays.append((number, line))
            else:
                reading.knobs.append(Knob(number, line, *knob))
        elif line.strip() == SCRIPT_GUARD:
            reading.guarded = True
        elif reading.hook is None:
            reading.hook = _exec_target(line)
    return reading


def _exec_target(line: str) -> str | None:
    """The program of an `exec PROGRAM ...` line (not `exec 2>/dev/null`, a redirection)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if len(words) > 1 and words[0] == "exec" and not re.match(r"\d*[<>]", words[1]):
        return words[1]
    return None


def read_file(script: Path) -> Reading | None:
    """The script at `script` read; None when it is missing or unreadable."""
    try:
        return read(script.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None


def set_script_knobs(script: Path, settings: dict[str, Any]) -> bool:
    """Write `settings`' values of the script's knobs into an installed hook script, whose
    values beat the config file's (`relay eval replay --apply`): each into the first line
    the script reads it from. False without a script."""
    from relay.install_files import write_atomic

    try:
        text = script.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    lines = text.splitlines(keepends=True)
    todo = {var: settings[name] for var, name, _ in SCRIPT_KNOBS if name in settings}
    for knob in read(text).knobs:
        if knob.var in todo:
            line = lines[knob.line - 1]
            ending = line[len(line.rstrip("\r\n")) :]
            lines[knob.line - 1] = f"{knob.var}={knob_value(todo.pop(knob.var))}{ending}"
    write_atomic(script, "".join(lines).encode(), 0o700)
    return True


def interpreter(first_line: str) -> str | None:
    """The program a `#!` line has the kernel run, read as Linux and macOS read it: after
    `#!` and any spaces or tabs, up to the next space or tab (a `\\r` is part of the name);
    None without a `#!` line, as sh then runs the file itself."""
    if not first_line.startswith("#!"):
        return None
    found = re.match(r"[ \t]*([^ \t\n]*)", first_line[2:])
    return found.group(1) if found else ""


def shebang_problem(script: Path) -> str | None:
    """Why the kernel cannot start the script through its `#!` line, else None: the program
    it names must be an executable file. The agent's sh then fails with status 127 ("not
    found") and shows that error on every prompt; the guard inside never runs."""
    try:
        with script.open("rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    program = interpreter(first)
    if program is None:
        return None
    line = first.rstrip("\r\n")
    if not program:
        return f"its first line, `{line}`, names no program to run it"
    if "\r" in program:
        return (
            f"its first line, `{line}`, ends in a carriage return (\\r): the file has Windows"
            f" (CRLF) line endings, so the kernel looks for a program named {program!r},"
            " which does not exist"
        )
    argument = first[2:].split(program, 1)[1].rstrip("\n").strip(" \t")
    if "\r" in argument:  # `#!/usr/bin/env sh\r`: the program runs, but is handed `sh\r`
        return (
            f"its first line, `{line}`, ends in a carriage return (\\r): the file has Windows"
            f" (CRLF) line endings, so {program} is handed {argument!r}"
        )
    path = Path(program)
    if not path.is_absolute():
        return f"its first line, `{line}`, names {program}, not an absolute path"
    if not path.is_file() or not os.access(path, os.X_OK):
        return (
            f"its first line, `{line}`, names {program}, which does not exist or is not executable"
        )
    return None


def syntax_error(script: Path) -> str | None:
    """What the script's shell says when it cannot parse the script (`sh -n`), else None;
    the shell is the one its `#!` line names when that is a shell, else /bin/sh."""
    try:
        first = script.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    argv = ["/bin/sh"]
    program = interpreter(first)
    if program:
        words = [program, *first[2:].split(program, 1)[1].split()]
        if words[-1].rsplit("/", 1)[-1] in SHELLS and Path(program).is_absolute():
            argv = words
    try:
        done = subprocess.run(
            [*argv, "-n", str(script)], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return None
    except OSError as exc:  # not "parses": nothing could read it (shebang_problem says why)
        return f"{argv[0]} cannot be run ({exc.strerror})"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
    said = said.removeprefix(f"{script}: ")
    return re.sub(r"^(\d+): ", r"line \1: ", said)
