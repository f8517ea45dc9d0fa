"""`relay doctor`: find silent breakage in a Relay install, and say what to do about it.

Recall is built to fail quietly (the hook always exits 0 and prints nothing on
failure), so a broken install looks exactly like a team with nothing written
down. This command looks at every link of the chain in order: the config, the
server, the key, the hooks registered in each agent and what they point at,
the MCP registrations, and the hook's own outcome log (through
`relay.hook_stats`). Each finding is `ok`, `warn` or `fail` with a fix; the
exit code is 1 when anything fails.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import stat
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from relay import agents, key_source, knob_script
from relay.doctor_hooks import HookChecks
from relay.errors import RelayError, StoreError, UnavailableError
from relay.hook import config as hook_config

SLOW_SERVER_MS = 150
BUDGET_ALERT_RUNS = 3  # runs out of budget before a search, in 24 h, worth a finding
EXPIRY_WARNING = timedelta(days=7)


@dataclass
class Finding:
    level: str  # "ok" | "warn" | "fail"
    area: str
    message: str
    fix: str = ""


class Doctor(HookChecks):
    def __init__(self, project: Path | None = None, environ: dict[str, str] | None = None) -> None:
        from relay.install import default_paths, load_manifest

        self.environ = dict(os.environ if environ is None else environ)
        self.paths = default_paths(project)
        self.manifest = load_manifest(self.paths)
        self.findings: list[Finding] = []
        self.cfg: hook_config.Config | None = None
        self.url_source = "url"  # where cfg.url comes from: the config file, or RELAY_URL
        self._scripts_checked: dict[Path, bool] = {}
        self._tomls: dict[Path, tuple[dict[str, Any] | None, str | None]] = {}
        self.key_ok: bool | None = None

    def add(self, level: str, area: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(level, area, message, fix))

    def home(self, path: Path | str) -> str:
        from relay.install import tilde

        return tilde(Path(path), self.paths.home)

    # -- checks ------------------------------------------------------------------
    def run(self) -> list[Finding]:
        if self.check_config():
            if self.check_server():
                self.check_key()
        self.check_hooks()
        self.check_mcp()
        self.check_log()
        return self.findings

    def check_config(self) -> bool:
        path = Path(hook_config.config_path(self.environ))
        raw: dict[str, Any] = {}
        if not path.exists():
            if self.environ.get("RELAY_URL") and self.environ.get("RELAY_API_KEY"):
                self.add(
                    "warn",
                    "config",
                    f"no config file at {self.home(path)}; using RELAY_URL and RELAY_API_KEY "
                    "from this shell, which agents started elsewhere do not have",
                    "run `relay install`",
                )
            else:
                self.add(
                    "fail",
                    "config",
                    f"no Relay config at {self.home(path)}: the hook has no server and no key",
                    "run `relay install --url URL --key KEY`",
                )
                return False
        else:
            # Judged as the hook reads it (NaN, over 64 KiB: the hook's bad_config).
            problem = hook_config.file_problem(str(path))
            try:
                if problem:
                    raise ValueError(problem.replace(str(path), "it"))
                raw = json.loads(path.read_text())
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                self.add(
                    "fail",
                    "config",
                    f"{self.home(path)} cannot be read as JSON ({exc}): the hook ignores it",
                    "fix the file, or move it aside and run `relay install` (it will not"
                    " rewrite a file it cannot read; it takes the url"
                    f" {self.home(self.paths.manifest)} records)",
                )
                return False
        for name in raw:  # keys the hook skips unread: a typo that silently does nothing
            why = hook_config.not_a_setting(name)
            if why:
                self.add(
                    "warn",
                    "config",
                    f"the hook ignores {name} in {self.home(path)} ({why})",
                    f"correct or remove {name} in {self.home(path)}",
                )
        # The settings the hook runs with: the script's knobs beat the config file.
        script = self._script_reading if self._script_in_use() else None
        ignored: list[str] = []
        handed = script.handed(self.environ) if script else self.environ
        self.cfg = cfg = hook_config.load(handed, ignored)
        if script is not None:
            for problem in script.problems(self.home(self.paths.script)):
                self.add("warn", "config", problem.message, problem.fix)
            self._check_shadowed_knobs(path, raw, script)
            # A bad value from the script is named above, with its line; load() words the
            # others `name 'value' in RELAY_NAME (why)`.
            from_script = [var for var, value in handed.items() if self.environ.get(var) != value]
            ignored = [w for w in ignored if not any(f" in {v} (" in w for v in from_script)]
        for what in ignored:
            self.add(
                "warn",
                "config",
                f"the hook ignores {what} and uses the value below it (docs/hook.md)",
                "fix the value (RELAY_<NAME> in the environment or in the hook script, else"
                " config.json)",
            )
        for var in ("RELAY_URL", "RELAY_API_KEY", "RELAY_API_KEY_FILE"):
            if self.environ.get(var) and path.exists():
                self.add(
                    "warn",
                    "config",
                    f"{var} is set in this shell and overrides the config file for anything "
                    "started from it, agents included",
                    f"unset {var} unless you mean it",
                )
        if not cfg.url:
            self.add("fail", "config", "no server URL configured", "run `relay install`")
            return False
        if not cfg.api_key:
            self.add("fail", "config", *self._why_no_key(cfg))
            return False
        # Where the hook found its key, as it read its sources (api_key, else the key file).
        key_from_file = cfg.key_setting == "api_key_file"
        source = "key from " + (
            self.home(os.path.expanduser(cfg.api_key_file))
            if key_from_file
            else key_source.setting_place(cfg, "api_key", self.home)
        )
        server, own = f"server {cfg.url}", raw.get("url")
        if self.environ.get("RELAY_URL") is not None:  # the hook's layer above the file
            self.url_source = "RELAY_URL"
            if own != cfg.url:
                theirs = f"not this file's url, {own}" if isinstance(own, str) else "none here"
                server += f" from RELAY_URL ({theirs})"
        self.add("ok", "config", f"{self.home(path)}: {server}, {source}")
        if key_from_file:
            key_path = Path(os.path.expanduser(cfg.api_key_file))
            mode = stat.S_IMODE(key_path.stat().st_mode)  # it was just read: it is there
            if mode & 0o077:
                self.add(
                    "warn",
                    "config",
                    f"the key file {self.home(key_path)} is readable by others (mode {mode:o})",
                    f"chmod 600 {key_path}",
                )
        if cfg.memory_off:
            self.add(
                "warn",
                "config",
                "recall is switched off (memory_off in the config or RELAY_MEMORY_OFF)",
                "remove the setting to turn recall back on",
            )
        return True

    def _why_no_key(self, cfg: hook_config.Config) -> tuple[str, str]:
        """Why the hook has no key, as it read its sources (`key_source`), and the fix."""
        unsent = key_source.key_problem(cfg, self.home)
        if unsent is None:
            return "no API key configured", "run `relay install` with a valid key"
        return f"{unsent.what}: the hook sends no key, and no prompt gets recall", unsent.fix

    def _check_shadowed_knobs(
        self, path: Path, raw: dict[str, Any], script: knob_script.Reading
    ) -> None:
        """A knob config.json sets to another value than the knob script, whose value the
        hook takes instead: an edit of config.json that never takes effect."""
        parsers = {name: parse for name, _, parse, _ in hook_config.SETTINGS}
        supplied = script.supplied()
        for key, value in raw.items():
            knob = supplied.get(key.upper())
            if key not in parsers or knob is None:
                continue
            try:
                differ = parsers[key](value) != parsers[key](knob.value)
            except (ValueError, TypeError, OverflowError):
                continue  # a value the hook ignores: its own finding
            if differ:
                shown = self.home(self.paths.script)
                self.add(
                    "warn",
                    "config",
                    f"{self.home(path)} sets {key} to {json.dumps(value)}, but {shown} sets "
                    f"{knob.var}={knob.value} (line {knob.line}), which the hook takes instead:"
                    " the config value is never used",
                    f"change {knob.var} in {shown}, or remove {key} from {self.home(path)}",
                )

    def _client(self):  # noqa: ANN202
        from relay.client import RelayClient

        assert self.cfg is not None
        return RelayClient(self.cfg.url, self.cfg.api_key, timeout=5)

    def check_server(self) -> bool:
        client = self._client()
        times = []
        try:
            for _ in range(3):
                start = time.perf_counter()
                client.get("/healthz")
                times.append((time.perf_counter() - start) * 1000)
        except RelayError as exc:
            self.add("fail", "server", *self._server_failure(exc))
            return False
        best = min(times)
        level = "warn" if best > SLOW_SERVER_MS else "ok"
        assert self.cfg is not None  # check_config set it
        self.add(
            level,
            "server",
            f"{self.cfg.url} answers /healthz in {best:.0f} ms",
            f"the hook has {self.cfg.deadline_ms} ms for the whole prompt; put the server closer"
            f" or raise {self.deadline_source()}"
            if level == "warn"
            else "",
        )
        return True

    def _server_failure(self, exc: RelayError) -> tuple[str, str]:
        """What a failed /healthz means, and its fix: the server is away, or it answered
        that its own database is (a restart of the server would not help then), or what
        answers is not a Relay server (install's check)."""
        from relay.client import ConnectionFailedError

        assert self.cfg is not None
        if self.url_source == "RELAY_URL":
            where = "RELAY_URL (set in this shell; unset, the config file's url applies)"
        else:
            where = f"`url` in {self.home(hook_config.config_path(self.environ))}"
        if isinstance(exc, UnavailableError | StoreError) and not isinstance(
            exc, ConnectionFailedError
        ):
            return (
                f"the server at {self.cfg.url} answers, but its database is unreachable"
                f" ({exc.message}): every prompt goes without team memory",
                "check the server's database: is PostgreSQL up, and reachable from the server"
                " with its RELAY_DB?",
            )
        if isinstance(exc, ConnectionFailedError):
            return (
                f"{exc.message}: every prompt goes without team memory",
                f"start the server, or fix {where}"
                + ("" if self.url_source == "RELAY_URL" else " (`relay install --url ...`)"),
            )
        not_relay = self._not_relay()
        if not_relay:
            return (
                f"{not_relay}: every prompt goes without team memory",
                f"fix {where}"
                + ("" if self.url_source == "RELAY_URL" else " (`relay install --url ROOT`)"),
            )
        return (
            f"{self.cfg.url}/healthz failed: {exc.message}: every prompt goes without team memory",
            f"check the server's log, or fix {where}",
        )

    def _not_relay(self) -> str | None:
        """install's check that the URL is a Relay server's root (`relay install` says "not
        a Relay server root"), as the client decides it: GET /v1/whoami answers as Relay
        does. None when it does."""
        from relay.client import NotRelayRootError, whoami

        try:
            whoami(self._client())
        except NotRelayRootError as exc:
            return exc.message
        except RelayError:  # Relay's own error (a key refused): a Relay root
            return None
        return None

    def check_key(self) -> None:
        from relay.client import NotRelayRootError, whoami

        client = self._client()
        start = time.perf_counter()
        try:
            who = whoami(client)
        except NotRelayRootError as exc:  # /healthz looked like Relay's; /v1/whoami did not
            self.add("fail", "server", *self._server_failure(exc))
            return
        except RelayError as exc:
            self.key_ok = False
            self.add(
                "fail",
                "key",
                f"the server rejects the key: {exc.message}; recall is off on every prompt",
                "ask a Relay admin for a new key (`relay key create`), then "
                "`relay install --key NEW_KEY`",
            )
            return
        ms = (time.perf_counter() - start) * 1000
        key = who.get("key", {})
        scopes = key.get("scopes") or []
        roles = key.get("roles") or []
        if not set(scopes) & {"memory:read", "admin"}:
            self.key_ok = False
            self.add(
                "fail",
                "key",
                f"key {key.get('id')} lacks memory:read: every search is refused",
                "install a key with memory:read",
            )
            return
        self.key_ok = True
        self.add(
            "ok",
            "key",
            f"key {key.get('id')} of organisation {who.get('org', {}).get('name')}: scopes "
            f"{', '.join(scopes)}; roles {', '.join(roles) or 'none'} ({ms:.0f} ms)",
        )
        if "memory:write" not in scopes and "admin" not in scopes:
            self.add(
                "ok",
                "key",
                "read-only key: team_memory_remember and `relay remember` will be refused",
            )
        expires = key.get("expires_at")
        if expires:
            when = datetime.fromisoformat(expires.replace("Z", "+00:00"))
            if when - datetime.now(UTC) < EXPIRY_WARNING:
                self.add(
                    "warn",
                    "key",
                    f"the key expires at {expires}",
                    "get a new key and run `relay install --key NEW_KEY` before then",
                )

    def _recorded_or_usual(self, role: str, usual: Path) -> list[Path]:
        """The files of `role` install recorded writing (CLAUDE_CONFIG_DIR or CODEX_HOME
        set then, maybe not now), then where this environment says they are; not a
        recorded one gone along with its folder (`_note_gone`)."""
        gone = self._gone_records
        recorded = [
            Path(p)
            for p, rec in self.manifest.get("files", {}).items()
            if rec.get("role") == role and Path(p) not in gone
        ]
        return list(dict.fromkeys([*recorded, usual]))

    @functools.cached_property
    def _gone_records(self) -> dict[Path, str]:
        """Agents' files install recorded writing, gone now along with their folder (a
        CLAUDE_CONFIG_DIR or CODEX_HOME of the time, since deleted), other than where this
        environment looks: nothing to check, and `relay install` writes elsewhere, so a
        finding about them could never clear. Each with the role install recorded."""
        usual = {
            self.paths.claude_settings,
            self.paths.codex_hooks,
            self.paths.claude_json,
            self.paths.codex_config,
        }
        return {
            Path(p): rec.get("role")
            for p, rec in self.manifest.get("files", {}).items()
            if rec.get("role") in ("hooks-json", "claude-mcp", "codex-config")
            and Path(p) not in usual
            and not Path(p).parent.exists()
        }

    def _note_gone(self, area: str, roles: tuple[str, ...]) -> None:
        """A note for each recorded file of `roles` gone with its folder, and the command
        that drops its record: `relay uninstall --project` on the folder deleted."""
        from relay.install import tilde

        manifest = self.home(self.paths.manifest)
        for path, role in self._gone_records.items():
            if role in roles:
                deleted = path.parent
                while not deleted.parent.exists():
                    deleted = deleted.parent
                shown = tilde(deleted, self.paths.home)
                shown = (
                    "~/" + shlex.quote(shown[2:]) if shown.startswith("~/") else shlex.quote(shown)
                )
                self.add(
                    "ok",
                    area,
                    f"note: {manifest} records {self.home(path)}, which an earlier `relay "
                    "install` wrote, but its folder is gone: nothing there to check (to drop "
                    f"the record: `relay uninstall --project {shown}`)",
                )

    def _codex_config(self, area: str, path: Path) -> dict[str, Any] | None:
        """A Codex config.toml parsed ({} when absent); None when Codex cannot read it
        either, after one failure saying where it breaks (install refuses to edit it too)."""
        data, why = self._codex_toml(path)
        if why is not None:
            self._fail_once(
                area,
                f"Codex: {self.home(path)} is {why}: Codex cannot load its "
                "config, and `relay install` will not edit it",
                "fix the file, then `relay install`",
            )
        return data

    def _codex_toml(self, path: Path) -> tuple[dict[str, Any] | None, str | None]:
        """The file read and parsed once for the checks that need it: (data, why not)."""
        if path not in self._tomls:
            self._tomls[path] = _read_toml(path)
        return self._tomls[path]

    def _fail_once(self, area: str, message: str, fix: str) -> None:
        if not any(f.message == message for f in self.findings):  # two checks read one file
            self.add("fail", area, message, fix)

    # -- MCP ---------------------------------------------------------------------
    def check_mcp(self) -> None:
        self._note_gone("mcp", ("claude-mcp",))
        for claude in self._recorded_or_usual("claude-mcp", self.paths.claude_json):
            try:
                doc = json.loads(claude.read_text(encoding="utf-8")) if claude.exists() else {}
            except (OSError, ValueError) as exc:
                what = "unreadable" if isinstance(exc, OSError) else "not valid JSON"
                self.add(
                    "fail",
                    "mcp",
                    f"Claude Code: {self.home(claude)} is {what} ({exc}): Claude Code cannot "
                    "load its MCP servers, and `relay install` will not edit it",
                    "fix the file, then `relay install`",
                )
                continue
            servers = doc.get("mcpServers") if isinstance(doc, dict) else None
            entry = servers.get(agents.SERVER_NAME) if isinstance(servers, dict) else None
            self._mcp_finding("Claude Code", claude, entry, agents.is_relay_server(entry))
        for config in self._recorded_or_usual("codex-config", self.paths.codex_config):
            data = self._codex_config("mcp", config)
            if data is not None:
                servers = data.get("mcp_servers")
                entry = servers.get(agents.SERVER_NAME) if isinstance(servers, dict) else None
                self._mcp_finding("Codex", config, entry, self._in_codex_block(config))

    def _in_codex_block(self, config: Path) -> bool:
        """Whether config.toml's [mcp_servers.relay] is in the block install wrote (which
        it rewrites), not one the user wrote (which it leaves alone)."""
        try:
            text = config.read_text(encoding="utf-8")
            rest = agents.parse_toml(agents.strip_codex_config(text), "config.toml")
        except (OSError, UnicodeDecodeError, RelayError):
            return False
        servers = rest.get("mcp_servers")
        return not (isinstance(servers, dict) and agents.SERVER_NAME in servers)

    def _mcp_finding(self, label: str, path: Path, entry: Any, rewrites: bool) -> None:
        """What the agent starts for the `relay` MCP server, as registered; `rewrites`: a
        re-run of `relay install` replaces the entry (else the fix is by hand)."""
        if not isinstance(entry, dict):
            # Missing after an install that registered it; `--no-mcp` is a choice, not a fault.
            m = self.manifest
            if m and m.get("mcp", True) and str(path) in m.get("files", {}):
                self.add(
                    "warn",
                    "mcp",
                    f"{label}: the `relay` MCP server is no longer in {self.home(path)}",
                    "run `relay install` for explicit recall (team_memory_search)",
                )
            return
        command, args = entry.get("command"), entry.get("args", [])
        if command is None and isinstance(entry.get("url"), str):
            self.add(
                "ok",
                "mcp",
                f"{label}: MCP server `relay` -> {entry['url']} (over HTTP; not called here)",
            )
            return
        plain = isinstance(args, list) and all(isinstance(a, str) for a in args)
        shown = shlex.join([str(command), *args]) if plain else f"{command} {json.dumps(args)}"
        where = f"{label}: the `relay` MCP server in {self.home(path)} runs `{shown}`"
        if rewrites:
            fix = "run `relay install` again: it rewrites this entry"
        elif label == "Codex":
            fix = (
                f"`relay install` leaves a [mcp_servers.{agents.SERVER_NAME}] it did not write "
                f'alone: make it run `relay mcp` (args = ["mcp"]) in {self.home(path)}, or '
                "remove it and run `relay install`"
            )
        else:
            fix = (
                "`relay install` leaves a `relay` server it did not register alone: make it "
                "run `relay mcp`, or remove it (`claude mcp remove relay -s user`) and run "
                "`relay install`"
            )
        if not isinstance(command, str) or not os.access(command, os.X_OK):
            self.add("warn", "mcp", f"{where}, but {command} is not an executable file", fix)
        elif not agents.runs_relay_mcp(entry):
            self.add(
                "warn",
                "mcp",
                f"{where}, not `relay mcp`: {label} gets no Relay MCP server from it (no "
                "team_memory_search)",
                fix,
            )
        else:
            from relay.mcp_server import sdk_problem

            problem = sdk_problem()
            if problem:
                self.add("warn", "mcp", f"{label}: `relay mcp` cannot start: {problem}", problem)
            else:
                self.add("ok", "mcp", f"{label}: MCP server `relay` -> {shown}")

    # -- the hook's log ------------------------------------------------------------
    def check_log(self) -> None:
        from relay import hook_stats

        cfg = self.cfg or hook_config.load(self.environ)
        summary = hook_stats.summarise(cfg.state_dir, 86400, cfg=cfg)
        if summary["invocations"] == 0 and not self._relay_entries():
            self.add(
                "warn",
                "log",
                "no prompts logged in the last 24 hours, and none will be: no agent has "
                "Relay's hook registered (see hooks above)",
            )
            return
        if summary["invocations"] == 0:
            self.add(
                "ok",
                "log",
                "no prompts in the last 24 hours; if you used an agent since installing, its "
                "hook is not running (Codex: trust it with /hooks)",
            )
            return
        streak = summary["unauthorized_streak"]
        if streak["length"]:
            self.add(
                "fail" if self.key_ok is not True else "warn",
                "log",
                f"the last {_searches(streak['length'])} rejected (401/403) since "
                f"{streak['since']}"
                + (
                    ""
                    if self.key_ok is not True
                    else "; the key works now, so the next prompt should too"
                ),
                "install a valid key: `relay install --key NEW_KEY`"
                if self.key_ok is not True
                else "",
            )
        down = summary["unavailable_streak"]
        if down["length"] >= hook_stats.UNAVAILABLE_STREAK_ALERT:
            self.add(
                "warn",
                "log",
                f"the last {down['length']} searches timed out or found no server since "
                f"{down['since']}",
                "check the server and the network; `relay stats` has the details",
            )
        self._check_budget(summary)
        breaker = summary["breaker"]
        if breaker["state"] != "closed":
            failures = f"after {breaker.get('failures', 0)} failures"
            if breaker["state"] == "open":
                what = (
                    f"open ({failures}, since {breaker.get('opened_at')}): prompts skip their "
                    f"search for {cfg.breaker_cooldown_s:g} s from then, then one probes the server"
                )
            else:
                what = (
                    f"half-open ({failures}): its cool-down is over, and the next prompt's "
                    "search probes the server; an answer closes it, a failure opens it again"
                )
            self.add(
                "warn",
                "log",
                f"the hook's circuit breaker for {breaker['url']} is {what}",
                "it closes by itself once the server answers; fix the server if it does not",
            )
        p95 = summary["hook_ms"]["p95"]
        deadline = cfg.deadline_ms
        outcomes = summary["outcomes"]
        level = "warn" if p95 > deadline + 100 else "ok"
        self.add(
            level,
            "log",
            f"last 24 h: {summary['invocations']} runs, {outcomes['hit']} hits, "
            f"{outcomes['no_match']} no match, p95 hook time {p95} ms (deadline {deadline} ms)",
            "the machine is slow to start Python; see docs/hook.md, Measuring"
            if level == "warn"
            else "",
        )

    def _check_budget(self, summary: dict[str, Any]) -> None:
        """A deadline too short for this machine: at least as many runs ran out of budget
        before they could search (`timeout`, `no_budget_left`) as searched; none searched
        at all is a failure (QA: RELAY_DEADLINE_MS=50 ran out on 6 prompts of 6)."""
        unsent = summary["not_searched"].get("timeout", 0)
        searched = sum(summary["searched"].values())
        if unsent < BUDGET_ALERT_RUNS or unsent < searched:
            return
        self.add(
            "fail" if searched == 0 else "warn",
            "log",
            f"{unsent} runs in the last 24 h ran out of budget before they could search "
            f"(timeout, no_budget_left) and {searched} searched: the hook's deadline is too "
            "short for how fast this machine starts it",
            f"raise {self.deadline_source()} (the default is "
            f"{hook_config.DEFAULTS['deadline_ms']} ms)",
        )


def _read_toml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    import tomllib

    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return {}, None
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except tomllib.TOMLDecodeError as exc:
        return None, f"not valid TOML ({exc})"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"


def _searches(n: int) -> str:
    return "search was" if n == 1 else f"{n} searches were"


def render(findings: list[Finding]) -> str:
    lines = ["Relay doctor"]
    for f in findings:
        tag = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[f.level]
        lines.append(f"  {tag}  {f.area:<7} {f.message}")
        if f.fix and f.level != "ok":
            lines.append(f"        {'':<7} fix: {f.fix}")
    failed = sum(f.level == "fail" for f in findings)
    warned = sum(f.level == "warn" for f in findings)
    if failed:
        lines.append(f"{failed} problem(s) break recall; {warned} warning(s).")
    else:
        lines.append(f"Recall is wired up. {warned} warning(s).")
    return "\n".join(lines)


@click.command("doctor")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Also check this project's .claude/ and .codex/ hooks.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(project: Path | None, as_json: bool) -> None:
    """Check config, server, key, hooks, MCP and the hook's recent outcomes; say what to fix."""
    findings = Doctor(project).run()
    if as_json:
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        click.echo(render(findings))
    if any(f.level == "fail" for f in findings):
        sys.exit(1)
