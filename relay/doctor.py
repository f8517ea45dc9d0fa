"""`relay doctor`: find silent breakage in a Relay install, and say what to do about it.

Recall is built to fail quietly (the hook always exits 0 and prints nothing on
failure), so a broken install looks exactly like a team with nothing written
down. This command looks at every link of the chain in order: the config, the
server, the key, the hooks registered in each agent and what they point at,
the MCP registrations, a CLAUDE_CONFIG_DIR or CODEX_HOME that sends agents started
from this shell elsewhere, and the hook's own outcome log (through
`relay.hook_stats`). Each finding is `ok`, `warn` or `fail` with a fix; the
exit code is 1 when anything fails.

The checks live beside this module, a part of the Doctor each: the settings and key
source (`doctor_config`), the server and key (`doctor_server`), the agents' hooks
(`doctor_hooks`), their MCP servers (`doctor_mcp`) and the hook's log (`doctor_log`).
This module holds the Doctor, what install recorded writing (which the hooks and MCP
checks share, as does the check of the agents' folders this shell names), the report
and the command.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from relay import agents
from relay.doctor_config import ConfigChecks
from relay.doctor_hooks import HookChecks
from relay.doctor_log import LogChecks
from relay.doctor_mcp import McpChecks
from relay.doctor_server import ServerChecks
from relay.hook import config as hook_config


@dataclass
class Finding:
    level: str  # "ok" | "warn" | "fail"
    area: str
    message: str
    fix: str = ""


class Doctor(ConfigChecks, ServerChecks, HookChecks, McpChecks, LogChecks):
    """Every check of one install, in the order of the chain; each part in its own module."""

    def __init__(self, project: Path | None = None, environ: dict[str, str] | None = None) -> None:
        from relay.install_files import load_manifest
        from relay.install_paths import default_paths

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
        from relay.install_paths import tilde

        return tilde(Path(path), self.paths.home)

    # -- checks ------------------------------------------------------------------
    def run(self) -> list[Finding]:
        if self.check_config():
            up = self.check_server()  # /healthz takes no key: checked with none too
            assert self.cfg is not None
            if up or not self.cfg.api_key:  # a missing key is said with the server down too
                self.check_key()
        self.check_hooks()
        self.check_mcp()
        self.check_agent_homes()
        self.check_log()
        return self.findings

    def check_agent_homes(self) -> None:
        """CLAUDE_CONFIG_DIR or CODEX_HOME set in this shell, naming a folder `relay install`
        did not write to: an agent started from here reads its hooks and MCP servers there
        (Claude Code `settings.json` and `.claude.json`, Codex `hooks.json` and
        `config.toml`), not in ~/.claude or ~/.codex, and so runs without Relay. Unset, with
        install having written where it named: see `_check_folders_install_wrote`."""
        if not self.manifest.get("files"):
            return  # never installed: the hooks check names what is missing where they look
        recorded = {Path(p) for p in self.manifest["files"]}
        expected = {path for _, path, wanted in self._hook_files() if wanted}
        for var, label, folder, hooks, mcp, usual in (
            (
                "CLAUDE_CONFIG_DIR",
                "Claude Code",
                self.paths.claude_dir,
                self.paths.claude_dir / "settings.json",
                self.paths.claude_json,
                "~/.claude and ~/.claude.json",
            ),
            (
                "CODEX_HOME",
                "Codex",
                self.paths.codex_dir,
                self.paths.codex_dir / "hooks.json",
                self.paths.codex_config,
                "~/.codex",
            ),
        ):
            if not self.environ.get(var):
                self._check_folders_install_wrote(var, label, hooks, mcp, recorded | expected)
                continue
            lacking = []
            # A hooks file the hooks check expects hooks in has its own failure.
            if hooks not in recorded | expected and not _registers_hooks(hooks):
                lacking.append("Relay's hooks")
            if self.manifest.get("mcp", True) and mcp not in recorded:
                if not self._registers_server(mcp):
                    lacking.append("the `relay` MCP server")
            if not lacking:
                continue
            no_hooks = "Relay's hooks" in lacking
            message = (
                f"{var} is set in this shell and overrides {usual} for {label} started from it:"
                f" it reads {self.home(hooks)} and {self.home(mcp)}, which lack "
                f"{' and '.join(lacking)}: no "
                + ("automatic recall" if no_hooks else "team_memory_search")
                + " in those sessions"
            )
            if label == "Codex" and not folder.is_dir():
                gone = self.home(folder)
                message += f"; {gone} does not exist, and Codex refuses to start until it does"
            self.add(
                "warn",
                "hooks" if no_hooks else "mcp",
                message,
                f"run `relay install` with {var} set (it writes there), or unset {var} unless "
                "you mean it",
            )

    def _check_folders_install_wrote(
        self, var: str, label: str, hooks: Path, mcp: Path, checked: set[Path]
    ) -> None:
        """`relay install` run with `var` set wrote the agent's files in that folder, and
        this shell does not set it: an agent started without it reads the usual `hooks` and
        `mcp`, and runs without Relay if they lack its hooks (when install expects hooks
        there, the hooks check fails it already)."""
        if hooks in checked or _registers_hooks(hooks):
            return
        folders = [
            self.home(folder) for folder in self._folders_install_wrote(var) if folder.is_dir()
        ]
        if not folders:
            return
        lacking = "Relay's hooks"
        if self.manifest.get("mcp", True) and not self._registers_server(mcp):
            lacking += " and the `relay` MCP server"
        self.add(
            "warn",
            "hooks",
            f"`relay install` wrote {label}'s files in {' and '.join(folders)} ({var} set "
            f"then), but {var} is not set in this shell: {label} started without it reads "
            f"{self.home(hooks)} and {self.home(mcp)}, which lack {lacking}: no automatic "
            "recall in those sessions",
            f"set {var}={folders[0]} where you start {label}, or run `relay install` without "
            f"{var} (it writes {self.home(hooks)})",
        )

    def _folders_install_wrote(self, var: str) -> list[Path]:
        """The folders the install record shows `var` named when install ran: the parent of
        a recorded MCP file other than the usual one (only `var` moves it), or of a hooks
        file outside a `.claude` or `.codex` folder (a project's are inside one)."""
        usual_mcp, own = (
            (self.paths.home / ".claude.json", "claude-mcp")
            if var == "CLAUDE_CONFIG_DIR"
            else (self.paths.home / ".codex" / "config.toml", "codex-config")
        )
        hooks_name, project_dir = (
            ("settings.json", ".claude") if var == "CLAUDE_CONFIG_DIR" else ("hooks.json", ".codex")
        )
        folders: dict[Path, None] = {}
        for name, record in self.manifest.get("files", {}).items():
            path, role = Path(name), record.get("role")
            if (role == own and path != usual_mcp) or (
                role == "hooks-json" and path.name == hooks_name and path.parent.name != project_dir
            ):
                folders[path.parent] = None
        return list(folders)

    def _registers_server(self, path: Path) -> bool:
        """Whether an agent's MCP file registers a `relay` server (or cannot be read: its own
        finding), as Claude Code's `.claude.json` or Codex's `config.toml`."""
        if path.suffix == ".toml":
            data, _ = self._codex_toml(path)
            table = "mcp_servers"
        else:
            data, table = _read_json(path), "mcpServers"
        if data is None:
            return True
        servers = data.get(table)
        return isinstance(servers, dict) and agents.SERVER_NAME in servers

    # -- what install recorded writing, for the hooks and MCP checks ----------------
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
        from relay.install_paths import tilde

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


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON settings file as a dict ({} when absent or not an object); None when it
    cannot be read or parsed."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))  # Claude Code reads past a BOM
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else {}


def _registers_hooks(path: Path) -> bool:
    """Whether a hooks file registers a Relay hook (or cannot be read: its own finding)."""
    doc = _read_json(path)
    return doc is None or bool(agents.relay_handlers(doc))


def _read_toml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    import tomllib

    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig")), None  # as Codex reads it
    except FileNotFoundError:
        return {}, None
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except tomllib.TOMLDecodeError as exc:
        return None, f"not valid TOML ({exc})"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"


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
    """Check config, server, key, hooks, MCP and the hook's recent outcomes; say what to fix.

    Each finding is ok, WARN or FAIL, with a fix; exit 1 when any fails (a warning alone
    exits 0: a deleted hook script is the documented way to turn recall off)."""
    findings = Doctor(project).run()
    if as_json:
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        click.echo(render(findings))
    if any(f.level == "fail" for f in findings):
        sys.exit(1)
