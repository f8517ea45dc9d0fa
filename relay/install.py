"""`relay install`: connect this machine to a Relay server and wire recall into Claude Code
and Codex (`relay uninstall`, relay/uninstall.py, takes exactly that back out).

Check the URL and key with one request (`GET /v1/whoami`) -> plan every file's new
content in memory (a file that is not valid JSON or TOML stops the plan: nothing is
written) -> check that every file it changes can be (nothing is written otherwise) ->
back up each file it changes -> write each one atomically -> print what changed, file by
file -> record in `~/.relay/install.json` which files it created and where the originals
are, for uninstall. Where things live is `relay.install_paths`; planned changes, backups, atomic
writes and the record, shared with uninstall and the skill, are `relay.install_files`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from relay import agents, json_text
from relay.errors import InvalidRequestError, UnauthorizedError
from relay.hook import config as hook_config
from relay.install_files import (
    Change,
    apply,
    blockers,
    file_text,
    load_manifest,
    loose_key_mode,
    note_lines,
    read_bytes,
    refuse_blocked,
)
from relay.install_paths import (
    Paths,
    default_paths,
    executables,
    refuse_user_level_project,
    tilde,
)
from relay.key_file import given_key, key_file_option
from relay.knob_script import SCRIPT_KNOBS, deadline_after_install, hook_script, knob_value

# Knobs written into config.json at their defaults (re-running install restores them); the
# script's own are not: it hands them to the hook in the environment, which beats the file.
CONFIG_KNOBS = (
    "memory_off",
    "max_records",
    "max_tokens",
    "profile",
    "profile_max_records",
    "profile_max_tokens",
    "breaker_failures",
    "breaker_cooldown_s",
)
AGENTS = ("claude-code", "codex")


# -- file contents (the hook script's own: relay/knob_script.py) ---------------------


def relay_config(
    current: dict[str, Any], url: str, key_file: Path
) -> tuple[dict[str, Any], list[str]]:
    """(config.json's new content, notes). The script's knobs are not written here: a copy
    that an earlier install left at its default goes, any other value stays, noted as dead."""
    out = {k: v for k, v in current.items() if k != "api_key"}  # an inline key beats the file
    out["url"] = url
    out["api_key_file"] = str(key_file)
    for name in CONFIG_KNOBS:
        out[name] = hook_config.DEFAULTS[name]
    notes = []
    for var, name, _ in SCRIPT_KNOBS:
        if name not in out:
            continue
        if out[name] == hook_config.DEFAULTS[name]:
            del out[name]
        else:
            notes.append(
                f"{name} {json.dumps(out[name])} here has no effect: the hook script's {var},"
                f" which beats it, is {knob_value(hook_config.DEFAULTS[name])}; set it there"
            )
    out["_comment"] = (
        f"Written by relay install. The agents' hooks run ~/.relay/{agents.SCRIPT_NAME}, which "
        "sets the knobs throttle_prompts, overlap_threshold, min_prompt_len and deadline_ms "
        "(edit them there: they beat this file). Keys: docs/hook.md."
    )
    return out, notes


# -- planning ----------------------------------------------------------------------------
def _json_change(
    path: Path,
    role: str,
    what: str,
    edit,  # noqa: ANN001
    mode: int = 0o644,
    bom_ok: bool = True,
) -> Change:
    before = read_bytes(path)
    text = file_text(before, path)
    doc = agents.parse_json(text, str(path), bom_ok=bom_ok)
    new_doc, notes = edit(doc)
    if before is not None and new_doc == doc:
        after = before  # same meaning: keep the user's bytes
    else:
        after = json_text.render(new_doc, text).encode()
    return Change(path, role, before, after, what, mode, notes)


def plan_install(
    paths: Paths,
    url: str,
    key: str,
    agent_names: tuple[str, ...],
    mcp: bool,
) -> list[Change]:
    """Every file's new content, computed before anything is written."""
    relay_hook, relay_bin = executables()
    changes = [
        Change(
            paths.key, "relay-key", read_bytes(paths.key), (key + "\n").encode(), "API key", 0o600
        ),
    ]
    config_before = read_bytes(paths.config)
    config_doc = agents.parse_json(file_text(config_before, paths.config), str(paths.config))
    config_doc, config_notes = relay_config(config_doc, url, paths.key)
    changes.append(
        Change(
            paths.config,
            "relay-config",
            config_before,
            json_text.render(config_doc).encode(),
            "Relay config",
            0o600,
            config_notes,
        )
    )
    changes.append(
        Change(
            paths.script,
            "hook-script",
            read_bytes(paths.script),
            hook_script(relay_hook).encode(),
            "recall hook script, knobs at their defaults",
            0o700,
        )
    )
    script_ref = paths.script_in_command()
    # The agents kill a hook at the entry's timeout: it must outlast the deadline the hook
    # will run with, which this shell's RELAY_DEADLINE_MS may raise above what 5 s covers.
    deadline = deadline_after_install(paths.environ)
    timeout = agents.hook_timeout_s(deadline)
    timeout_notes = (
        [
            f"timeout {timeout} s, not {agents.HOOK_TIMEOUT_S}: the hook's deadline is"
            f" {deadline} ms (RELAY_DEADLINE_MS in this shell)"
        ]
        if timeout != agents.HOOK_TIMEOUT_S
        else []
    )

    def hooks_edit(where: str):  # noqa: ANN202
        return lambda doc: (agents.add_hooks(doc, script_ref, where, timeout), timeout_notes)

    events = " and ".join(agents.EVENTS) + " hooks"
    if "claude-code" in agent_names:
        try:
            claude_hooks = _json_change(
                paths.claude_settings, "hooks-json", events, hooks_edit(str(paths.claude_settings))
            )
        except agents.SettingsFileError as exc:
            if "codex" not in agent_names:
                raise
            # The user may not be free to fix Claude Code's file now; Codex need not wait.
            raise agents.SettingsFileError(
                f"{exc}. To install for Codex alone meanwhile: relay install --agent codex"
            ) from None
        changes.append(claude_hooks)
        if mcp:
            changes.append(
                _json_change(
                    paths.claude_json,
                    "claude-mcp",
                    "MCP server `relay` (user scope)",
                    lambda doc: _with_note(
                        agents.add_mcp_server(doc, relay_bin, str(paths.claude_json))
                    ),
                    0o600,
                )
            )
        elif removal := _claude_mcp_removal(paths):
            changes.append(removal)
    if "codex" in agent_names:
        changes.append(
            _json_change(
                paths.codex_hooks,
                "hooks-json",
                events,
                hooks_edit(str(paths.codex_hooks)),
                bom_ok=False,  # Codex would run none of its hooks
            )
        )
        before = read_bytes(paths.codex_config)
        text = file_text(before, paths.codex_config)
        new_text, notes = agents.add_codex_config(
            text, relay_bin if mcp else None, str(paths.codex_config)
        )
        after = before if new_text == text else new_text.encode()
        what = "[features] hooks" + (" and [mcp_servers.relay]" if mcp else "")
        if not mcp and _codex_server(text, paths) and not _codex_server(new_text, paths):
            what += ", without [mcp_servers.relay]"
        changes.append(
            Change(paths.codex_config, "codex-config", before, after, what, 0o600, notes)
        )
    return changes


def _claude_mcp_removal(paths: Paths) -> Change | None:
    """--no-mcp after an install that registered the MCP server in ~/.claude.json: its entry
    goes, and an entry the file had before that install comes back; one Relay did not
    write (not `relay mcp`) stays. Config.toml's is in Relay's marked block, gone alike.
    None when no install touched the file, or it is gone."""
    record = load_manifest(paths).get("files", {}).get(str(paths.claude_json))
    if record is None or not paths.claude_json.exists():
        return None
    original = read_bytes(Path(record["original"])) if record.get("original") else None
    before_install = agents.parse_json(
        file_text(original, paths.claude_json), str(paths.claude_json)
    )
    return _json_change(
        paths.claude_json,
        "claude-mcp",
        "without the MCP server `relay`",
        lambda doc: (agents.strip_mcp_server(doc, before_install), []),
        0o600,
    )


def _codex_server(text: str, paths: Paths) -> bool:
    servers = agents.parse_toml(text, str(paths.codex_config)).get("mcp_servers")
    return isinstance(servers, dict) and agents.SERVER_NAME in servers


def _with_note(result: tuple[dict[str, Any], str]) -> tuple[dict[str, Any], list[str]]:
    doc, note = result
    return doc, [note] if note else []


# -- verification -----------------------------------------------------------------------------
def verify(url: str, key: str) -> dict[str, Any]:
    """One request: the server answers and accepts the key, and the key may read memories."""
    from relay.client import RelayClient, whoami

    if not url.startswith(("http://", "https://")):
        raise InvalidRequestError(f"server URL must start with http:// or https:// (got {url!r})")
    if not key or not all("!" <= ch <= "~" for ch in key):
        raise InvalidRequestError("the API key is empty or contains spaces or non-ASCII characters")
    try:
        who = whoami(RelayClient(url, key, timeout=10))
    except UnauthorizedError as exc:
        raise UnauthorizedError(
            f"the server at {url} refused the key ({exc}): use a key this server made (the one"
            " `relay serve` printed at its first start, or one from `relay key create`)"
        ) from None
    scopes = set(who.get("key", {}).get("scopes") or [])
    if not scopes & {"memory:read", "admin"}:
        raise InvalidRequestError(
            "this key lacks memory:read, so every recall would be refused; an admin creates one"
            " with 'relay key create --org ORG --name NAME --scope memory:read'"
        )
    return who


def describe_key(who: dict[str, Any]) -> str:
    k = who.get("key", {})
    roles = ", ".join(k.get("roles") or []) or "none"
    return (
        f"organisation {who.get('org', {}).get('name')}, key {k.get('id')} "
        f"({', '.join(k.get('scopes') or [])}; roles: {roles})"
    )


def trust_instructions(paths: Paths, agent_names: tuple[str, ...], mcp: bool) -> list[str]:
    out = []
    if "claude-code" in agent_names:
        out += [
            "Claude Code: new sessions run the hooks (review them with /hooks); "
            + (
                "restart running sessions to load the `relay` MCP server (check with /mcp)."
                if mcp
                else "no `relay` MCP server is registered."
            )
        ]
    if "codex" in agent_names:
        where = tilde(paths.codex_hooks, paths.home)
        out += [
            "Codex runs a new hook only after you trust it. Start `codex`, type /hooks, review the "
            f"two Relay hooks from {where} (UserPromptSubmit and SessionStart, running "
            f"{agents.SCRIPT_NAME}) and trust them. Codex asks again only if the registered "
            "command changes; editing the knobs in the script does not change it.",
        ]
        if paths.project is not None:
            out.append("Codex loads a project's .codex/hooks.json only in a trusted project.")
    return out


def _refuse_to_ask_without_a_terminal(url: str | None, key: str | None) -> None:
    """No terminal (a script, CI, `< /dev/null`): a prompt read EOF and said only 'aborted',
    and the key's read a pipe with Python's echo warning; name the flags instead."""
    given = (("--url URL", url), ("--key KEY (or --key-file FILE)", key))
    missing = [flag for flag, value in given if not value]
    if missing and not sys.stdin.isatty():
        raise click.UsageError(
            f"no terminal to ask on and nothing installed to reuse: pass {' and '.join(missing)}"
        )


def _refuse_another_server(url: str, paths: Paths) -> None:
    """Refuse a RELAY_URL (no --url) naming another server than the one installed, when a
    key is given: a stale export (a teammate's .envrc) would get that key, and this
    machine's recall would move there, unasked. --url says it is meant."""
    environ = {name: value for name, value in os.environ.items() if name != "RELAY_URL"}
    installed = hook_config.load(environ).url or load_manifest(paths).get("url")
    if isinstance(installed, str) and installed and not hook_config.same_server(url, installed):
        raise click.UsageError(
            f"RELAY_URL in the environment names {url}, not the server installed"
            f" ({installed}): pass --url {url} to install against it, or unset RELAY_URL to"
            f" keep {installed}"
        )


# -- commands ------------------------------------------------------------------------------------
@click.command("install")
@click.option(
    "--url",
    envvar="RELAY_URL",
    help="Relay server URL [default: RELAY_URL (given a key, only for the server installed:"
    " --url switches), else the one installed before, else asked for].",
)
@click.option(
    "--key",
    envvar="RELAY_API_KEY",
    help="API key [default: RELAY_API_KEY, else the one installed before, if for the same"
    " server; else asked for].",
)
@key_file_option
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Register the hooks in this project's .claude/ and .codex/ instead of your user settings.",
)
@click.option(
    "--agent",
    "agent_names",
    multiple=True,
    type=click.Choice(AGENTS),
    help="Only this agent (repeatable; default: both).",
)
@click.option(
    "--no-mcp",
    is_flag=True,
    help="Do not register the MCP server; take out the one an earlier install registered.",
)
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
def install(
    url: str | None,
    key: str | None,
    key_file: str | None,
    project: Path | None,
    agent_names: tuple[str, ...],
    no_mcp: bool,
    dry_run: bool,
) -> None:
    """Connect this machine to a Relay server and wire recall into Claude Code and Codex."""
    refuse_user_level_project(default_paths(project), "install")
    key = given_key(key, key_file)
    ctx = click.get_current_context()
    from_env = bool(url) and ctx.get_parameter_source("url") is ParameterSource.ENVIRONMENT
    if from_env and key:  # without a key, the installed one is kept from another server
        _refuse_another_server(str(url), default_paths(project))
    if not url or not key:  # run again to repair or change one thing: keep the rest
        from relay.client import settings
        from relay.key_source import elsewhere

        typed = not from_env
        installed = settings(url if typed else None)
        paths = default_paths(project)
        recorded = load_manifest(paths).get("url")
        if not url and installed.url:
            url = installed.url
            click.echo(f"Server {url}, as installed (--url to change it)")
        elif not url and isinstance(recorded, str) and recorded:  # config.json broken or moved
            url = recorded
            shown = tilde(paths.manifest, paths.home)
            click.echo(f"Server {url}, as {shown} records (--url to change it)")
        refusal = elsewhere(installed, url if typed else None) if url and not key else None
        if refusal and not sys.stdin.isatty():  # not even to whoami, nor under --dry-run
            # RELAY_URL's server is installed only when --url names it (_refuse_another_server)
            flags = "--key KEY or --key-file FILE" if typed else f"--url {url} --key-file FILE"
            raise click.UsageError(
                f"{refusal}: pass {flags} (or set RELAY_API_KEY_FILE) for that server"
                f"{'' if typed else ', or unset RELAY_URL'}"
            )
        if refusal:
            click.echo(f"{refusal}: give that server's key")
        elif not key and installed.api_key:
            key = installed.api_key
            # Said as the hook reads it: this shell's RELAY_API_KEY(_FILE), or the installed
            # one; install then writes that key as the installed one.
            named = installed.origin.get(installed.key_setting, "")
            given = f"from {named}" if named.startswith("RELAY_") else "the one installed"
            click.echo(f"Key: {given} (--key or --key-file to change it)")
    _refuse_to_ask_without_a_terminal(url, key)
    url = (url or click.prompt("Relay server URL", default="http://127.0.0.1:8765")).strip()
    key = (key or click.prompt("API key", hide_input=True)).strip()
    agent_names = agent_names or AGENTS
    if from_env:  # a shell's export is easy to forget: say whose URL this is
        click.echo(
            f"relay: note: server {url}, from RELAY_URL in the environment (--url to change it)",
            err=True,
        )
    who = verify(url, key)
    click.echo(f"Connected to {url}: {describe_key(who)}")
    paths = default_paths(project)
    register_mcp = not no_mcp
    if register_mcp:
        from relay.mcp_server import sdk_problem

        problem = sdk_problem()
        if problem:
            click.echo(f"Not registering the MCP server: {problem}; then run relay install again.")
            register_mcp = False
    changes = plan_install(paths, url.rstrip("/"), key, agent_names, register_mcp)
    if dry_run:
        for c in changes:
            changed = c.changed or loose_key_mode(c) is not None
            state = "keep" if not changed else "create" if c.before is None else "update"
            click.echo(f"  would {state:<9} {tilde(c.path, paths.home)}  ({c.what})")
        for line in note_lines(changes, paths):
            click.echo(line)
        return
    refuse_blocked("install", blockers(changes, paths))
    for line in apply(changes, paths, url, register_mcp):
        click.echo(line)
    click.echo("")
    for line in trust_instructions(paths, agent_names, register_mcp):
        click.echo(line)
    undo = "`relay uninstall`"
    if paths.project is not None:
        only = f"relay uninstall --project {shlex.quote(str(paths.project))}"
        undo = f"`{only}` (this project only) or {undo} (all)"
    click.echo(
        f"Knobs: {tilde(paths.script, paths.home)} (takes effect on the next prompt). "
        f"Check everything with `relay doctor`; undo with {undo}. "
        "The Relay skill: `relay skill install`."
    )
