"""`relay doctor`'s checks of the hooks registered in Claude Code and Codex, and of what
they start: each entry as the agent reads it, the knob script (its shebang, whether sh
parses it, the `relay-hook` it execs), and the switches that turn the agents' hooks off.

`HookChecks` is a part of `relay.doctor.Doctor`, kept apart to keep each module readable
in one sitting; it records its findings with the Doctor's `add`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay import agents, knob_script
from relay.errors import RelayError
from relay.hook import config as hook_config

if TYPE_CHECKING:
    from relay.doctor import Finding
    from relay.install_paths import Paths

# Claude Code's managed settings, deployed by an organisation: they beat every other file.
MANAGED_SETTINGS = Path(
    "/Library/Application Support/ClaudeCode/managed-settings.json"
    if sys.platform == "darwin"
    else "/etc/claude-code/managed-settings.json"
)
AGENT_LABELS = {"claude-code": "Claude Code", "codex": "Codex"}
# A knob script behind its guard that never reaches relay-hook: nothing tells the user.
SILENTLY_OFF = "recall is silently off on every prompt (exit status 0, nothing shown)"


class HookChecks:
    """The hooks part of the Doctor: what the agents run on each prompt, and whether it can."""

    environ: dict[str, str]
    paths: Paths
    manifest: dict[str, Any]
    cfg: hook_config.Config | None
    findings: list[Finding]
    _scripts_checked: dict[Path, bool]

    if TYPE_CHECKING:

        def add(self, level: str, area: str, message: str, fix: str = "") -> None: ...
        def home(self, path: Path | str) -> str: ...
        def _recorded_or_usual(self, role: str, usual: Path) -> list[Path]: ...
        def _codex_config(self, area: str, path: Path) -> dict[str, Any] | None: ...
        def _note_gone(self, area: str, roles: tuple[str, ...]) -> None: ...
        @property
        def _gone_records(self) -> dict[Path, str]: ...

    def _hook_files(self) -> list[tuple[str, Path, bool]]:
        """(agent, hooks file, expected): from the install record, else the usual places."""
        out: list[tuple[str, Path, bool]] = []
        installed = bool(self.manifest.get("files"))  # not a record of skill install's alone
        recorded = {
            Path(p)
            for p, rec in self.manifest.get("files", {}).items()
            if rec.get("role") == "hooks-json" and Path(p) not in self._gone_records
        }
        for agent, path in (
            ("claude-code", self.paths.claude_settings),
            ("codex", self.paths.codex_hooks),
        ):
            candidates = {path} | {p for p in recorded if _agent_of(p) == agent and p != path}
            # As if never installed, for an agent whose every recorded file is gone
            unrecorded = not installed or (
                not any(_agent_of(p) == agent for p in recorded)
                and any(
                    _agent_of(p) == agent and role == "hooks-json"
                    for p, role in self._gone_records.items()
                )
            )
            for p in sorted(candidates):
                expected = p in recorded or (unrecorded and p.parent.exists())
                out.append((agent, p, expected))
        return out

    @functools.cached_property
    def _hook_docs(self) -> list[tuple[str, Path, bool, dict[str, Any] | Exception]]:
        """Each hooks file parsed once (or why it cannot be): (agent, path, expected, doc)."""
        out: list[tuple[str, Path, bool, dict[str, Any] | Exception]] = []
        for agent, path, expected in self._hook_files():
            try:
                text = path.read_text() if path.exists() else ""
                doc = agents.parse_json(text, str(path), None, bom_ok=agent != "codex")
            except (OSError, RelayError) as exc:
                out.append((agent, path, expected, exc))
            else:
                out.append((agent, path, expected, doc))
        return out

    def _relay_entries(self) -> list[agents.RelayHandler]:
        """Every Relay entry registered in the hooks files doctor reads."""
        return [
            h
            for _, _, _, doc in self._hook_docs
            if isinstance(doc, dict)
            for h in agents.relay_handlers(doc)
        ]

    def _script_in_use(self) -> bool:
        """Whether the hook runs through the knob script: a registered Relay entry starts it,
        or none is registered to say otherwise (`relay-hook` registered by hand skips it)."""
        started = [agents.started_in_command(h.command) for h in self._relay_entries()]
        programs = [s[0].rsplit("/", 1)[-1] for s in started if s]
        return not programs or agents.SCRIPT_NAME in programs

    @functools.cached_property
    def _script_reading(self) -> knob_script.Reading | None:
        """The installed knob script as it runs; None when it is missing or unreadable."""
        return knob_script.read_file(self.paths.script)

    def _reading_of(self, script: Path) -> knob_script.Reading:
        if script == self.paths.script:
            return self._script_reading or knob_script.Reading()
        return knob_script.read_file(script) or knob_script.Reading()

    def check_hooks(self) -> None:
        any_ok = False
        for agent, path, expected, doc in self._hook_docs:
            label = AGENT_LABELS[agent]
            if not isinstance(doc, dict):
                # One Relay installed no hooks in is the agent's trouble, not recall's: a warning.
                why, fix = (
                    ("the agent ignores it", "fix the file, then `relay install`")
                    if expected
                    else (
                        f"{label} ignores all of it, and Relay installed no hooks there",
                        f"fix the file, then `relay install --agent {agent}` for recall in {label}",
                    )
                )
                where = f"{label}: {self.home(path)} is unreadable ({doc}); {why}"
                self.add("fail" if expected else "warn", "hooks", where, fix)
                continue
            handlers = agents.relay_handlers(doc)
            missing = [e for e in agents.EVENTS if e not in {h.event for h in handlers}]
            if missing == list(agents.EVENTS):
                if expected:
                    self.add(
                        "fail",
                        "hooks",
                        f"{label}: no Relay hooks in {self.home(path)}: no automatic recall",
                        f"run `relay install --agent {agent}`",
                    )
                continue
            if missing:
                self.add(
                    "fail",
                    "hooks",
                    f"{label}: {self.home(path)} lacks the {' and '.join(missing)} hook",
                    f"run `relay install --agent {agent}`",
                )
            self._check_duplicates(label, path, handlers)
            sound = self._check_entries(agent, path, handlers)
            if self._check_targets(label, path, handlers, sound) and len(sound) == len(handlers):
                any_ok = True
            if agent == "codex":
                self._check_codex_flag(path)
        if any(
            agent == "claude-code" and isinstance(doc, dict) and agents.relay_handlers(doc)
            for agent, _, _, doc in self._hook_docs
        ):
            self._check_claude_hooks_switch()
        if not any_ok and not any(f.area == "hooks" for f in self.findings):
            self.add(
                "fail",
                "hooks",
                "no agent has Relay's hooks: no automatic recall anywhere",
                "run `relay install`",
            )
        self._note_gone("hooks", ("hooks-json", "codex-config"))

    def _check_claude_hooks_switch(self) -> None:
        """`"disableAllHooks": true` in Claude Code's settings: it runs no hooks at all. In
        managed settings it beats everything; else the setting of the highest of a project's
        settings.local.json, its settings.json and the user's settings.json applies."""
        managed = _setting(MANAGED_SETTINGS, "disableAllHooks")
        if managed is True:
            self.add(
                "fail",
                "hooks",
                f'Claude Code: the managed settings {MANAGED_SETTINGS} set "disableAllHooks": '
                "true: Claude Code runs no hooks at all, Relay's included: no automatic recall",
                "ask whoever manages Claude Code on this machine: no setting of yours beats it",
            )
            return
        # The projects whose settings come above the user's: --project's, else every
        # project install recorded (a project's own `true` switches off its hooks alone).
        projects = [self.paths.project] if self.paths.project else self._recorded_projects()
        users = [self.paths.claude_dir / "settings.json"] + [
            path
            for agent, path, _, _ in self._hook_docs
            if agent == "claude-code" and not any(path.is_relative_to(p) for p in projects)
        ]
        scopes = [
            [project / ".claude" / "settings.local.json", project / ".claude" / "settings.json"]
            for project in projects
        ]
        if not self.paths.project:
            scopes.insert(0, [])  # outside every project: the user's settings alone
        off: dict[Path, None] = {}  # the files whose `true` applies, in order
        for layers in scopes:
            for user in users:
                values = [(layer, _setting(layer, "disableAllHooks")) for layer in [*layers, user]]
                decided = next(((lay, v) for lay, v in values if isinstance(v, bool)), None)
                if decided and decided[1] is True:
                    off[decided[0]] = None
        for path in off:
            self.add(
                "fail",
                "hooks",
                f'Claude Code: {self.home(path)} sets "disableAllHooks": true: Claude Code runs'
                " no hooks, Relay's included: no automatic recall",
                f'remove "disableAllHooks" from {self.home(path)}, or set it to false',
            )

    def deadline_source(self) -> str:
        """Where the hook's deadline is set, to change it there: RELAY_DEADLINE_MS when this
        shell sets it (it beats the script's knob), else DEADLINE_MS in the script."""
        if self.environ.get("RELAY_DEADLINE_MS"):
            return "RELAY_DEADLINE_MS, set in this shell, which beats the script's DEADLINE_MS"
        return f"DEADLINE_MS in {self.home(self.paths.script)}"

    def _recorded_projects(self) -> list[Path]:
        """The projects `relay install --project` wired Claude Code into, as recorded
        (`PROJECT/.claude/settings.json`), other than those deleted since."""
        return [
            path.parent.parent
            for name, record in self.manifest.get("files", {}).items()
            if record.get("role") == "hooks-json"
            and (path := Path(name)).name == "settings.json"
            and path.parent.name == ".claude"
            and path.parent != self.paths.claude_dir
            and path.parent.exists()
        ]

    def _check_duplicates(
        self, label: str, path: Path, handlers: list[agents.RelayHandler]
    ) -> None:
        for event in agents.EVENTS:
            count = sum(h.event == event for h in handlers)
            if count > 1:
                self.add(
                    "warn",
                    "hooks",
                    f"{label}: {self.home(path)} registers Relay's {event} hook {count} times:"
                    " each one runs the hook again",
                    "run `relay install`: it keeps one entry per event",
                )

    def _check_entries(
        self, agent: str, path: Path, handlers: list[agents.RelayHandler]
    ) -> list[agents.RelayHandler]:
        """What the agent reads before it runs a Relay entry's command: its `type`, its
        `timeout` (seconds, in both agents) and, for SessionStart, its group's matcher.
        Returns the entries the agent runs (a matcher only narrows when)."""
        label = AGENT_LABELS[agent]
        deadline = (self.cfg or hook_config.load(self.environ)).deadline_ms
        fix = "run `relay install` to rewrite the entry"
        sound = []
        for h in handlers:
            where = f"{label}: the Relay {h.event} entry in {self.home(path)}"
            runs = True
            kind = h.handler.get("type")
            if kind != "command":
                what = f'"type": {json.dumps(kind)}' if "type" in h.handler else "no type"
                self.add(
                    "fail",
                    "hooks",
                    f'{where} has {what}, not "command": {label} never runs its command',
                    f'set "type": "command", or {fix}',
                )
                runs = False
            problem = _timeout_problem(agent, h.handler.get("timeout"), deadline)
            if problem:
                if deadline == knob_script.deadline_after_install(self.environ):
                    # Install registers the timeout for this very deadline: what it writes.
                    wanted = agents.hook_timeout_s(deadline)
                    remedy = f"remove the timeout or set it to {wanted} (seconds), or {fix}"
                else:  # install would put the script's DEADLINE_MS back to its default
                    needed = math.ceil((deadline + agents.HOOK_EXIT_MS) / 1000)
                    remedy = f"raise the timeout to at least {needed} (seconds), or remove it"
                allowed = _deadline_within(h.handler.get("timeout"))
                if allowed is not None:
                    remedy += (
                        f", or lower the hook's deadline to at most {allowed} ms"
                        f" ({self.deadline_source()})"
                    )
                self.add("fail", "hooks", f"{where}: {problem}", remedy)
                runs = False
            if runs:
                sound.append(h)
            if h.event != "SessionStart":
                continue  # both agents ignore a UserPromptSubmit matcher
            sources = agents.SESSION_SOURCES[agent]
            missed = [s for s in sources if not agents.matcher_matches(h.matcher, s)]
            if missed:
                kept = " or ".join(s for s in sources if s not in missed)
                self.add(
                    "warn",
                    "hooks",
                    f"{where} has the matcher {json.dumps(h.matcher)}: it runs "
                    + (f"only for sessions whose source is {kept}" if kept else "never")
                    + f", not {' or '.join(missed)}: those start without the team profile",
                    f"remove the matcher (Relay's entry has none), or {fix}",
                )
        return sound

    def _check_targets(
        self,
        label: str,
        path: Path,
        handlers: list[agents.RelayHandler],
        sound: list[agents.RelayHandler],
    ) -> bool:
        """What each Relay entry starts, and with which argument: the knob script (present,
        executable, exec'ing a `relay-hook` that is) or `relay-hook` itself. The `ok` line
        names the events of the `sound` entries only: the others never run."""
        targets: dict[Path, list[str]] = {}
        ok = True
        for h in handlers:
            started = agents.started_in_command(h.command)
            if started is None:
                self.add(
                    "warn",
                    "hooks",
                    f"{label}: unexpected Relay hook command in {self.home(path)}: {h.command}",
                    "run `relay install` to rewrite it",
                )
                continue
            word, args = started
            events = targets.setdefault(self._program_path(word), [])
            # Without the argument the hook still knows a session start by the agent's
            # hook_event_name; with it, it takes every prompt for one.
            if args[:1] == ["session-start"] and h.event != "SessionStart":
                self.add(
                    "fail",
                    "hooks",
                    f"{label}: the {h.event} entry in {self.home(path)} runs {word} with the "
                    "`session-start` argument: the hook takes every prompt for a session start, "
                    "so no prompt searches",
                    "run `relay install` to rewrite the entry",
                )
                ok = False
            elif any(h is other for other in sound):
                events.append(h.event)
        for program, events in sorted(targets.items()):
            on = " and ".join(e for e in agents.EVENTS if e in events)
            if program.name == agents.SCRIPT_NAME:
                ok = self._check_script(label, path, program, on) and ok
            elif not os.access(program, os.X_OK):
                self.add(
                    "fail",
                    "hooks",
                    f"{label}: {self.home(path)} runs {program}, which does not exist or is not "
                    "executable: the agent shows an error on every prompt",
                    "run `relay install` (it registers the hook through its knob script)",
                )
                ok = False
            elif on:
                self.add(
                    "ok",
                    "hooks",
                    f"{label}: {on} in {self.home(path)} -> {program} (started directly, without"
                    " the knob script: its settings come from the environment and config.json)",
                )
        return ok

    def _script_parses(self, script: Path) -> bool:
        """The kernel can start the script (its `#!` line names a program that runs: else
        the agent's sh fails with 127 and shows the error on every prompt, the guard
        inside never reached); sh can parse the script: it stops at a line it cannot,
        before it starts the hook (behind the guard, with exit status 0 and nothing shown;
        without it, with 2, which blocks the prompt in Claude Code); and a script without
        the guard is named. Each finding once, however many agents run the script."""
        if script in self._scripts_checked:
            return self._scripts_checked[script]
        rewrite = (
            f"run `relay install` to rewrite {self.home(script)} (knobs back to their defaults)"
        )
        unstartable = knob_script.shebang_problem(script)
        if unstartable is not None:
            self._scripts_checked[script] = False
            self.add(
                "fail",
                "hooks",
                f"{self.home(script)} cannot be started: {unstartable}; the agent's sh fails "
                "with exit status 127 and shows the error on every prompt, with no recall",
                rewrite,
            )
            return False
        reading = self._reading_of(script)
        error = knob_script.syntax_error(script)
        self._scripts_checked[script] = error is None
        if error is not None:
            suspect = reading.suspect()
            if suspect:  # sh may say where it gave up (the end of the file), not the line
                error += f"; look at line {suspect.line}, `{suspect.text.strip()}`"
            if reading.guarded:
                what = f"the script stops there, before relay-hook: {SILENTLY_OFF}"
            else:
                what = (
                    "sh exits with status 2 before it starts relay-hook, so no prompt gets "
                    "recall, and Claude Code blocks a prompt whose hook exits with 2"
                )
            self.add(
                "fail",
                "hooks",
                f"sh cannot parse {self.home(script)} ({error}): {what}",
                f"fix the line, or {rewrite}",
            )
            return False
        shows = (
            "makes it fail with an error the agent shows, and Claude Code blocks a prompt "
            "whose hook exits with 2"
        )
        if not reading.data:
            self.add(
                "warn",
                "hooks",
                f"{self.home(script)} is as an older `relay install` wrote it, with its knobs "
                "set as shell and no guard line: a typo in a knob, or a relay-hook that moves, "
                f"{shows}",
                "run `relay install`: it rewrites the script with the guard and its knobs read as"
                " data (back to their defaults), and leaves the agents' commands as they are",
            )
        elif not reading.guarded:
            self.add(
                "warn",
                "hooks",
                f"{self.home(script)} lacks its guard line (`{knob_script.SCRIPT_GUARD}`): a "
                f"line sh cannot parse, or a relay-hook that moves, {shows}",
                f"put the line back below `#!/bin/sh`, or {rewrite}",
            )
        return True

    def _program_path(self, word: str) -> Path:
        """A command word as sh finds it: `$HOME/` and `~/` expanded, a bare name on PATH."""
        for prefix in ("$HOME/", "${HOME}/", "~/"):
            if word.startswith(prefix):
                return self.paths.home / word[len(prefix) :]
        if "/" not in word:
            import shutil

            return Path(shutil.which(word, path=self.environ.get("PATH")) or word)
        return Path(word)

    def _check_script(self, label: str, path: Path, script: Path, on: str) -> bool:
        if not os.access(script, os.X_OK) and script.resolve() != self.paths.script.resolve():
            # Not this HOME's script (settings copied from another machine or user): not the
            # documented off switch, which is deleting ~/.relay's own; install fixes it.
            self.add(
                "fail",
                "hooks",
                f"{label}: {self.home(path)} runs {script}, which does not exist or is not "
                f"executable, instead of this HOME's {self.home(self.paths.script)} (settings "
                "copied from another machine or user?): automatic recall is off (the agent "
                "skips it silently)",
                f"run `relay install`: it registers {self.home(self.paths.script)} instead",
            )
            return False
        if not os.access(script, os.X_OK):
            self.add(
                "warn",
                "hooks",
                f"{label}: hooks registered, but {self.home(script)} is missing or not "
                "executable: automatic recall is off (the agent skips it silently)",
                "run `relay install` to restore it, if that was not on purpose",
            )
            return False
        if script.resolve() != self.paths.script.resolve():
            # It runs, so recall works, but with that script's knobs (and any key or config
            # they name): editing this HOME's, or deleting it to turn recall off, does nothing.
            self.add(
                "warn",
                "hooks",
                f"{label}: {self.home(path)} runs {script}, not this HOME's "
                f"{self.home(self.paths.script)} (settings copied from another machine or "
                "user?): the agent runs with that script's knobs (and any key or config they "
                f"name); editing the knobs in {self.home(self.paths.script)}, or deleting it to "
                "turn recall off, does not reach it",
                f"run `relay install`: it registers {self.home(self.paths.script)} instead",
            )
        if not self._script_parses(script):
            return False
        reading = self._reading_of(script)
        if not reading.closed:
            self.add(
                "fail",
                "hooks",
                f"{label}: {self.home(script)} has no `{reading.end}` line to end its knobs: the"
                " script reads the rest of the file, its `exec` of relay-hook included, as "
                f"knobs, so {SILENTLY_OFF}",
                f"put the `{reading.end}` line back below the last knob, or run `relay install`"
                " (knobs back to their defaults)",
            )
            return False
        hook = reading.hook
        if hook is None or not os.access(hook, os.X_OK):
            what = SILENTLY_OFF if reading.guarded else "the agent shows an error on every prompt"
            self.add(
                "fail",
                "hooks",
                f"{label}: {self.home(script)} runs {hook or 'nothing recognisable'}, which "
                f"does not exist or is not executable: {what}",
                "run `relay install` from the Relay you use now",
            )
            return False
        if on:  # the events whose entries the agent runs
            self.add(
                "ok",
                "hooks",
                f"{label}: {on} in {self.home(path)} -> {self.home(script)} -> {hook}",
            )
        return True

    def _check_codex_flag(self, hooks: Path) -> None:
        """The hooks flag in the config.toml beside `hooks` (a Codex home), else in the one
        install wrote (a project's hooks.json)."""
        configs = self._recorded_or_usual("codex-config", self.paths.codex_config)
        beside = hooks.parent / "config.toml"
        path = beside if beside in configs else configs[0]
        data = self._codex_config("hooks", path)
        if data is None:
            return
        if agents.codex_hooks_enabled(data) is False:
            self.add(
                "fail",
                "hooks",
                f"Codex: hooks are turned off in {self.home(path)} ([features] hooks = false)",
                "set `hooks = true` under [features]",
            )
        else:
            self.add(
                "ok",
                "hooks",
                "Codex: the hooks run only once trusted; if recall never shows in Codex, type "
                "/hooks in codex and trust the two Relay hooks",
            )


def _setting(path: Path, key: str) -> Any:
    """`key` of a JSON settings file; None when it or the file is missing or unreadable
    (an unreadable hooks file has its own finding)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get(key) if isinstance(doc, dict) else None


def _deadline_within(timeout: object) -> int | None:
    """The longest deadline (ms) a timeout of `timeout` seconds lets the hook finish in, if
    any the hook takes (a number of seconds only)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return None
    allowed = math.floor(timeout * 1000) - agents.HOOK_EXIT_MS
    return (
        min(allowed, hook_config.DEADLINE_MAX_MS)
        if allowed >= hook_config.DEADLINE_MIN_MS
        else None
    )


def _timeout_problem(agent: str, timeout: object, deadline_ms: int) -> str | None:
    """What is wrong with a Relay entry's `timeout`, in seconds for both agents (Claude Code
    takes any number, Codex a whole one and at least 1): it must outlast the hook, which
    gives up at its deadline and then needs a moment to exit."""
    if timeout is None:
        return None  # the agent's default: minutes
    label = AGENT_LABELS[agent]
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return f"its timeout {json.dumps(timeout)} is not a number of seconds"
    if agent == "codex":
        if not isinstance(timeout, int) or timeout < 0:
            return (
                f"its timeout {json.dumps(timeout)} is not whole seconds: Codex cannot read "
                "the file, and runs none of its hooks"
            )
        timeout = max(timeout, 1)
    if timeout * 1000 < deadline_ms + agents.HOOK_EXIT_MS:
        return (
            f"its timeout is {timeout:g} s (seconds), shorter than the hook may take (its "
            f"{deadline_ms} ms deadline and {agents.HOOK_EXIT_MS} ms to exit): {label} kills it "
            "mid-search and shows an error"
        )
    return None


def _agent_of(path: Path) -> str:
    return "codex" if ".codex" in path.parts or path.name == "hooks.json" else "claude-code"
