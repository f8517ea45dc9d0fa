"""`relay doctor`'s checks of the MCP server registered in Claude Code and Codex: whether
it is there, and whether what the agent starts is `relay mcp` and can start.

`McpChecks` is a part of `relay.doctor.Doctor`, kept apart to keep each module readable
in one sitting; it records its findings with the Doctor's `add`.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay import agents
from relay.errors import RelayError

if TYPE_CHECKING:
    from relay.install_paths import Paths


class McpChecks:
    """The MCP part of the Doctor: the `relay` server each agent registers, and what it runs."""

    paths: Paths
    manifest: dict[str, Any]
    environ: dict[str, str]

    if TYPE_CHECKING:

        def add(self, level: str, area: str, message: str, fix: str = "") -> None: ...
        def home(self, path: Path | str) -> str: ...
        def _recorded_or_usual(self, role: str, usual: Path) -> list[Path]: ...
        def _codex_config(self, area: str, path: Path) -> dict[str, Any] | None: ...
        def _note_gone(self, area: str, roles: tuple[str, ...]) -> None: ...

    def check_mcp(self) -> None:
        self._note_gone("mcp", ("claude-mcp",))
        for claude in self._recorded_or_usual("claude-mcp", self.paths.claude_json):
            try:
                # utf-8-sig: past a BOM too, as Claude Code reads it
                text = claude.read_text(encoding="utf-8-sig") if claude.exists() else "{}"
                doc = json.loads(text)
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
            elif label == "Codex" and self._config_moved() and not _hands_config(entry):
                self.add(
                    "warn",
                    "mcp",
                    f"{where}, without RELAY_CONFIG: Codex starts an MCP server with HOME, "
                    "PATH and a few others, and only the variables its entry names beyond "
                    "them, so `relay mcp` reads ~/.relay/config.json, "
                    f"not {self.home(self.environ['RELAY_CONFIG'])}, and every call fails",
                    fix
                    if rewrites
                    else f'add env_vars = ["RELAY_CONFIG"] to it in {self.home(path)}',
                )
            else:
                self.add("ok", "mcp", f"{label}: MCP server `relay` -> {shown}")

    def _config_moved(self) -> bool:
        """Whether RELAY_CONFIG names another file than ~/.relay/config.json, the one a
        `relay mcp` that is not handed it reads (an export of the usual path changes none)."""
        custom = self.environ.get("RELAY_CONFIG", "")
        usual = self.paths.relay_dir / "config.json"
        return bool(custom) and os.path.abspath(os.path.expanduser(custom)) != str(usual)


def _hands_config(entry: dict[str, Any]) -> bool:
    """Whether a Codex [mcp_servers] entry hands the server RELAY_CONFIG: forwarded from
    Codex's environment (`env_vars`), or set (`env`)."""
    forwarded, env = entry.get("env_vars"), entry.get("env")
    forwarded = forwarded if isinstance(forwarded, list) else []
    names = [
        v if isinstance(v, str) else v.get("name") for v in forwarded if isinstance(v, str | dict)
    ]
    return "RELAY_CONFIG" in names or (isinstance(env, dict) and "RELAY_CONFIG" in env)
