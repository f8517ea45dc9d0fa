"""The installed knob script (`~/.relay/relay-autosearch-hook.sh`) read the way sh runs it,
for `relay doctor`: whether sh can parse it, what it exports to the hook, which lines are
not plain assignments, and the `relay-hook` it execs.

The script is the user's to edit, and sh reads it, not Relay: a line sh cannot parse
stops it before it starts the hook, and `NAME = value` (spaces around `=`) is a command
to sh, not an assignment. So the values are read from what the script really does, the
`export` line included (`RELAY_X="${RELAY_X:-$X}"` hands the hook `$X` unless the
environment sets `RELAY_X`), whatever the template `relay install` writes. A line that
is not a plain assignment is reported, never guessed at.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SHELLS = frozenset({"sh", "dash", "bash", "ksh", "mksh", "zsh", "ash", "busybox"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# `${RELAY_X:-$X}`, `${RELAY_X:-${X}}`, or without the colon: the environment first.
_DEFAULTED = re.compile(
    r"^\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*):?-\$(?:\{(?P<b>[A-Za-z_]\w*)\}|(?P<s>[A-Za-z_]\w*))\}$"
)


@dataclass
class Export:
    """One variable the script hands the hook."""

    variable: str  # RELAY_DEADLINE_MS
    value: str | None  # what the hook gets from the script; None: unset, or not plain text
    source: str | None  # the script's own variable it comes from (DEADLINE_MS), if any
    line: int  # where that value is set
    env_first: bool  # a value already in the environment wins (`${RELAY_X:-$X}`)


@dataclass
class Unreadable:
    """A line doctor cannot read as `NAME=value` that sets, or seems to set, a knob."""

    line: int
    text: str
    spaced: bool  # `NAME = value`: sh runs NAME as a command and the knob stays unset


@dataclass
class Reading:
    exports: dict[str, Export] = field(default_factory=dict)
    unreadable: list[Unreadable] = field(default_factory=list)
    hook: str | None = None  # the program the script execs


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash-newline continuations joined, as sh does."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
            if line.lstrip().startswith("#"):
                continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending.append(line[:-1])
            continue
        out.append((start, "".join(pending) + line))
        pending = []
    if pending:
        out.append((start, "".join(pending)))
    return out


def _words(line: str) -> list[str] | None:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def _commands(words: list[str]) -> list[list[str]]:
    """The simple commands of a line split on `;`."""
    out: list[list[str]] = [[]]
    for word in words:
        if word == ";":
            out.append([])
        else:
            out[-1].append(word)
    return out


def _readable(command: list[str]) -> bool:
    """Nothing, `exec PROGRAM ...`, `export NAME[=value] ...` or `NAME=value ...`."""
    if not command or command[0] == "exec":
        return True
    if command[0] == "export":
        return all("=" in w or _NAME.match(w) for w in command[1:])
    return all(_assignment(w) for w in command)


def _plain(value: str) -> bool:
    return "$" not in value and "`" not in value


def read(text: str) -> Reading:
    """What the script hands the hook, read statically as sh would run it."""
    reading = Reading()
    shell: dict[str, tuple[str | None, int]] = {}  # the script's own variables
    others: list[tuple[int, str, list[str] | None]] = []
    execs = False
    for number, line in _logical_lines(text):
        words = _words(line)
        commands = _commands(words) if words is not None else []
        if words is None or not all(_readable(c) for c in commands):
            others.append((number, line, words))
            continue
        for command in filter(None, commands):
            if command[0] == "exec":
                reading.hook = command[1] if len(command) > 1 else None
                execs = True
                break
            if command[0] == "export":
                for word in command[1:]:
                    _export(reading, shell, word, number)
            else:
                for word in command:
                    name, value = word.split("=", 1)
                    shell[name] = (value if _plain(value) else None, number)
        if execs:
            break  # sh runs nothing after exec
    knobs = {e.variable for e in reading.exports.values()}
    knobs |= {e.source for e in reading.exports.values() if e.source}
    for name, (got, number) in shell.items():
        if got is None and name in knobs:  # `DEADLINE_MS=$SLOW`: set, but to what?
            line = text.splitlines()[number - 1]
            others.append((number, line, _words(line)))
    for number, line, words in sorted(others, key=lambda other: other[0]):
        named = _names_in(words) if words is not None else set(re.findall(r"\w+", line))
        if named & knobs:
            spaced = bool(words and len(words) > 1 and words[1] == "=" and words[0] in knobs)
            reading.unreadable.append(Unreadable(number, line.strip(), spaced))
    return reading


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(_NAME.match(name))


def _names_in(words: list[str]) -> set[str]:
    return {w.partition("=")[0] for w in words}


def _export(
    reading: Reading, shell: dict[str, tuple[str | None, int]], word: str, number: int
) -> None:
    name, eq, value = word.partition("=")
    if not eq:  # `export NAME`: the script's own value, if it set one
        if name in shell:
            got, line = shell[name]
            reading.exports[name] = Export(name, got, name, line, False)
        return
    defaulted = _DEFAULTED.match(value)
    if defaulted and defaulted["var"] == name:
        source = defaulted["b"] or defaulted["s"]
        got, line = shell.get(source, (None, number))
        reading.exports[name] = Export(name, got, source, line, True)
    else:
        reading.exports[name] = Export(name, value if _plain(value) else None, None, number, False)


def hook_environ(reading: Reading | None, environ: dict[str, str]) -> dict[str, str]:
    """`environ` as the script hands it to the hook (an unset knob is left out: the hook
    then takes the config file's value, or its default, as it does for an empty one)."""
    out = dict(environ)
    for e in (reading.exports if reading else {}).values():
        if e.value is None or (e.env_first and out.get(e.variable)):
            continue
        out[e.variable] = e.value
    return out


def syntax_error(script: Path) -> str | None:
    """What the script's shell says when it cannot parse the script (`sh -n`), else None."""
    try:
        first = script.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    interpreter = ["/bin/sh"]
    if first.startswith("#!"):
        words = first[2:].split()
        if words and words[-1].rsplit("/", 1)[-1] in SHELLS and Path(words[0]).is_absolute():
            interpreter = words
    try:
        done = subprocess.run(
            [*interpreter, "-n", str(script)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
    said = said.removeprefix(f"{script}: ")
    return re.sub(r"^(\d+): ", r"line \1: ", said)
