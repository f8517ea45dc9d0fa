"""`relay install`: connect this machine to a Relay server and wire recall into Claude Code
and Codex (`relay uninstall`, relay/uninstall.py, takes exactly that back out).

Check the URL and key with one request (`GET /v1/whoami`) -> plan every file's new
content in memory (a file that is not valid JSON or TOML stops the plan: nothing is
written) -> check that every file it changes can be (nothing is written otherwise) ->
back up each file it changes -> write each one atomically -> print what changed, file by
file -> record in `~/.relay/install.json` which files it created and where the originals
are, for uninstall.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from relay import agents
from relay.errors import InvalidRequestError, RelayError
from relay.hook import config as hook_config
from relay.knob_script import SCRIPT_KNOBS, deadline_after_install, hook_script, knob_value

MANIFEST_VERSION = 1
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
_SURROGATE = re.compile("[\ud800-\udfff]")
OWN_FILES = ("relay-key", "relay-config", "hook-script")  # Relay's files: permissions enforced


# -- where things live -------------------------------------------------------------
@dataclass
class Paths:
    home: Path
    project: Path | None = None
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def relay_dir(self) -> Path:
        return self.home / ".relay"

    @property
    def config(self) -> Path:
        custom = self.environ.get("RELAY_CONFIG")
        return Path(os.path.expanduser(custom)) if custom else self.relay_dir / "config.json"

    @property
    def key(self) -> Path:
        return self.relay_dir / "key"

    @property
    def script(self) -> Path:
        return self.relay_dir / agents.SCRIPT_NAME

    @property
    def manifest(self) -> Path:
        return self.relay_dir / "install.json"

    @property
    def backups(self) -> Path:
        return self.relay_dir / "backups"

    @property
    def claude_dir(self) -> Path:
        custom = self.environ.get("CLAUDE_CONFIG_DIR")
        return Path(os.path.expanduser(custom)) if custom else self.home / ".claude"

    @property
    def claude_settings(self) -> Path:
        base = self.project / ".claude" if self.project else self.claude_dir
        return base / "settings.json"

    @property
    def claude_json(self) -> Path:
        custom = self.environ.get("CLAUDE_CONFIG_DIR")
        return (
            Path(os.path.expanduser(custom)) / ".claude.json"
            if custom
            else self.home / ".claude.json"
        )

    @property
    def codex_dir(self) -> Path:
        custom = self.environ.get("CODEX_HOME")
        return Path(os.path.expanduser(custom)) if custom else self.home / ".codex"

    @property
    def codex_hooks(self) -> Path:
        base = self.project / ".codex" if self.project else self.codex_dir
        return base / "hooks.json"

    @property
    def codex_config(self) -> Path:
        return self.codex_dir / "config.toml"

    @property
    def skills_dir(self) -> Path:
        """Where `relay skill install` puts the skill's folder unless given --dir."""
        return (self.project / ".claude" if self.project else self.claude_dir) / "skills"

    @property
    def skill_zip(self) -> Path:
        return self.relay_dir / "relay-skill.zip"

    def script_in_command(self) -> str:
        """User settings name the script by absolute path; project settings, shared by a
        team, by `$HOME` so the same line works for every teammate who ran relay install."""
        if self.project is None:
            return str(self.script)
        return f'"$HOME/.relay/{agents.SCRIPT_NAME}"'


def default_paths(project: Path | None = None) -> Paths:
    return Paths(Path(os.path.expanduser("~")), project.resolve() if project else None)


def refuse_user_level_project(paths: Paths, command: str) -> None:
    """Refuse a --project that is, or holds, the home folder or the agents' user-level
    folders, or whose .claude/ or .codex/ leads to them: install would write the user's
    settings as a project's, and `relay uninstall --project` would take out the
    user-level install (and every project under it) while saying they stay."""
    project = paths.project
    if project is None:
        return
    home = paths.home.resolve()
    why = None
    if home == project:
        why = "is your home folder, whose .claude/ and .codex/ are the user-level install"
    elif home.is_relative_to(project):
        why = "holds your home folder, and with it the user-level install"
    else:
        for folder, user in ((".claude", paths.claude_dir), (".codex", paths.codex_dir)):
            user = user.resolve()
            if (project / folder).resolve() == user:
                why = f"has the user-level {tilde(user, home)} as its {folder}/"
            elif user.is_relative_to(project):
                why = f"holds the user-level {tilde(user, home)}"
            if why:
                break
    if why:
        raise InvalidRequestError(
            f"--project {tilde(project, home)} {why}: name the project's own folder, or run"
            f" `relay {command}` without --project for the user-level one; nothing was changed"
        )


def tilde(path: Path, home: Path) -> str:
    if path == home:
        return "~"
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


def executables() -> tuple[str, str]:
    """Absolute paths of `relay-hook` and `relay` beside this interpreter (no PATH, no shims)."""
    bin_dir = Path(os.path.abspath(sys.executable)).parent  # not resolved: keep the venv's path
    found = []
    for name in ("relay-hook", "relay"):
        candidate = bin_dir / name
        if not os.access(candidate, os.X_OK):
            which = shutil.which(name)
            if which is None:
                raise InvalidRequestError(f"cannot find the {name!r} command next to {bin_dir}")
            candidate = Path(os.path.abspath(which))
        found.append(str(candidate))
    return found[0], found[1]


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


def _indent_of(text: str) -> int | str:
    # Lines end at "\n": splitlines() would also break inside a string holding U+2028.
    for line in text.split("\n")[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            lead = line[: len(line) - len(stripped)]
            return "\t" if lead.startswith("\t") else len(lead)
    return 2


def dump_json_like(doc: dict[str, Any], original: str | None) -> bytes:
    """`doc` as JSON, indented as `original` was. A lone surrogate ("\\ud800" is valid JSON)
    has no UTF-8: it is written back as the escape it was read from. allow_nan=False: never
    write `Infinity`, which the agents cannot read (parse_json refuses what would need it)."""
    indent = _indent_of(original) if original else 2
    text = json.dumps(doc, indent=indent, ensure_ascii=False, allow_nan=False)
    return (_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n").encode()


# -- planning ----------------------------------------------------------------------------
@dataclass
class Change:
    path: Path
    role: str
    before: bytes | None
    after: bytes | None
    what: str
    mode: int = 0o644
    notes: list[str] = field(default_factory=list)
    force_mode: bool = False  # uninstall: Relay's own file gets back the original's mode

    @property
    def changed(self) -> bool:
        return self.before != self.after


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise agents.SettingsFileError(f"cannot read {path}: {exc.strerror}") from None


def file_text(raw: bytes | None, path: Path) -> str:
    if raw is None:
        return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise agents.SettingsFileError(f"{path} is not UTF-8 text; nothing was changed") from None


def _json_change(path: Path, role: str, what: str, edit, mode: int = 0o644) -> Change:  # noqa: ANN001
    before = read_bytes(path)
    text = file_text(before, path)
    doc = agents.parse_json(text, str(path))
    new_doc, notes = edit(doc)
    if before is not None and new_doc == doc:
        after = before  # same meaning: keep the user's bytes
    else:
        after = dump_json_like(new_doc, text)
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
            dump_json_like(config_doc, None),
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
        changes.append(
            _json_change(
                paths.claude_settings,
                "hooks-json",
                events,
                hooks_edit(str(paths.claude_settings)),
            )
        )
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
                paths.codex_hooks, "hooks-json", events, hooks_edit(str(paths.codex_hooks))
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


# -- applying ------------------------------------------------------------------------------
def ensure_dir(path: Path, created: list[str]) -> None:
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        private = d.name in (".relay", "backups")  # keys and their backups live there
        d.mkdir(mode=0o700 if private else 0o777)
        created.append(str(d))


def write_atomic(path: Path, data: bytes, mode: int, force_mode: bool = False) -> None:
    """Replace `path`'s content in one step; a symlinked file stays a symlink. An existing
    file keeps its permissions unless `force_mode` (the key file, the hook script)."""
    target = Path(os.path.realpath(path))
    if not force_mode:
        with contextlib.suppress(FileNotFoundError):
            mode = target.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_manifest(paths: Paths) -> dict[str, Any]:
    """The install record: "files" (what install changed), "dirs" (folders Relay made) and,
    since `relay skill install` records there too, "skills". A key a record lacks means
    none, so a record an older Relay wrote loads as it is: MANIFEST_VERSION stays 1."""
    try:
        data = json.loads(paths.manifest.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        return {}
    for key, empty in (("files", {}), ("dirs", []), ("skills", {})):
        data.setdefault(key, empty)
    return data


def new_manifest() -> dict[str, Any]:
    return {"version": MANIFEST_VERSION, "files": {}, "dirs": [], "skills": {}}


def save_manifest(paths: Paths, manifest: dict[str, Any]) -> None:
    ensure_dir(paths.relay_dir, manifest["dirs"])
    data = (json.dumps(manifest, indent=2) + "\n").encode()
    write_atomic(paths.manifest, data, 0o600, force_mode=True)


def back_up(paths: Paths, path: Path, data: bytes, created_dirs: list[str], stamp: str) -> Path:
    """Keep `data`, what `path` held before a write, as `~/.relay/backups/<name>.<stamp>`
    (a number added if taken), mode 600: uninstall puts an original back from there."""
    ensure_dir(paths.backups, created_dirs)
    backup = paths.backups / f"{path.name}.{stamp}"
    n = 0
    while backup.exists():
        n += 1
        backup = paths.backups / f"{path.name}.{stamp}.{n}"
    write_atomic(backup, data, 0o600)
    return backup


def apply(changes: list[Change], paths: Paths, url: str, mcp: bool = True) -> list[str]:
    """Back up, write and record every change (and whether the MCP server was registered,
    for `relay doctor`); one report line per file."""
    manifest = load_manifest(paths) or new_manifest()
    created_dirs: list[str] = manifest["dirs"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    lines = []
    for c in changes:
        label = tilde(c.path, paths.home)
        if not c.changed:
            lines.append(f"  unchanged  {label}  ({c.what})")
            continue
        ensure_dir(c.path.parent, created_dirs)
        record = manifest["files"].get(str(c.path))
        backup = None
        # A key an earlier install wrote is not kept: uninstall restores only the original,
        # and a secret replaced (say by a key with fewer rights) must not linger on disk.
        if c.before is not None and not (c.role == "relay-key" and record is not None):
            backup = back_up(paths, c.path, c.before, created_dirs, stamp)
        if record is None:
            record = {"role": c.role, "created": c.before is None, "original": None}
            record["original"] = str(backup) if backup else None
            if backup and c.role in OWN_FILES:  # its mode is forced below: uninstall restores it
                record["mode"] = os.stat(c.path).st_mode & 0o777
            manifest["files"][str(c.path)] = record
        record.setdefault("backups", []).append(str(backup) if backup else None)
        assert c.after is not None
        write_atomic(c.path, c.after, c.mode, force_mode=c.role in OWN_FILES)
        verb = "created" if c.before is None else "updated"
        extra = f"; backup {tilde(backup, paths.home)}" if backup else ""
        lines.append(f"  {verb:<9}  {label}  ({c.what}{extra})")
    for c in changes:
        lines += [f"  note: {tilde(c.path, paths.home)}: {n}" for n in c.notes]
    manifest["url"] = url
    manifest["mcp"] = mcp
    save_manifest(paths, manifest)
    return lines


# -- checks before writing ---------------------------------------------------------------
def why_unchangeable(path: Path, remove: bool) -> str | None:
    """Why `path` could not be replaced (or removed), found without changing it; None if it can.

    Replacing and removing both need the folder writable; neither needs the file itself
    writable, but both fail on an immutable or append-only file (chattr), which opening it
    for writing (no truncation, nothing written) reveals as EPERM.
    """
    target = path if remove else Path(os.path.realpath(path))
    if target != path and not target.parent.exists():
        return f"it is a link to {target}, in a folder that does not exist"
    folder = target.parent  # or, for a file in a folder still to be made, where it will be
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is not writable"
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EROFS):
            return f"{exc.strerror} (read-only, or marked immutable: see lsattr)"
    return None


def blockers(changes: list[Change], paths: Paths, removing: Sequence[Path] = ()) -> list[str]:
    """Every file install or uninstall would change, or remove (`removing`: uninstall's
    backups and record), that it cannot, found before it changes any."""
    targets = [(c.path, c.after is None) for c in changes if c.changed]
    targets += [(p, True) for p in removing if p.exists()]
    out = []
    for path, remove in targets:
        why = why_unchangeable(path, remove)
        if why:
            out.append(f"{tilde(path, paths.home)}: {why}")
    return out


def refuse_blocked(command: str, blocked: list[str]) -> None:
    """Stop `relay install` or `relay uninstall` before it writes, naming what blocks it."""
    if blocked:
        raise RelayError(
            f"{command} cannot change {'; '.join(blocked)}. Nothing was changed; fix that,"
            f" then run `relay {command}` again"
        )


# -- verification -----------------------------------------------------------------------------
def verify(url: str, key: str) -> dict[str, Any]:
    """One request: the server answers and accepts the key, and the key may read memories."""
    from relay.client import RelayClient, whoami

    if not url.startswith(("http://", "https://")):
        raise InvalidRequestError(f"server URL must start with http:// or https:// (got {url!r})")
    if not key or not all("!" <= ch <= "~" for ch in key):
        raise InvalidRequestError("the API key is empty or contains spaces or non-ASCII characters")
    who = whoami(RelayClient(url, key, timeout=10))
    scopes = set(who.get("key", {}).get("scopes") or [])
    if not scopes & {"memory:read", "admin"}:
        raise InvalidRequestError(
            "this key lacks memory:read, so every recall would be refused; an admin creates one"
            " with 'relay key create --org ORG --name NAME --scope memory:read'"
        )
    return who


def read_key_file(path: str) -> str:
    """The API key from the first line of `path` that holds anything."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidRequestError(f"cannot read the key file {path}: {why}") from None
    lines = text.strip().splitlines()
    if not lines:
        raise InvalidRequestError(
            f"the key file {path} is empty: the API key goes on its first line"
        )
    return lines[0].strip()


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


# -- commands ------------------------------------------------------------------------------------
@click.command("install")
@click.option(
    "--url",
    envvar="RELAY_URL",
    help="Relay server URL (default: the one installed before; else asked for).",
)
@click.option(
    "--key",
    envvar="RELAY_API_KEY",
    help="API key (default: the one installed before; else asked for).",
)
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, exists=True),
    help="Read the API key from this file's first line (instead of --key; beats RELAY_API_KEY).",
)
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
    if key_file:
        source = click.get_current_context().get_parameter_source("key")
        if key and source is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("give --key or --key-file, not both")
        key = read_key_file(key_file)  # beats RELAY_API_KEY, as a flag beats the environment
    if not url or not key:  # run again to repair or change one thing: keep the rest
        from relay.hook import config as hook_config

        installed = hook_config.load()
        paths = default_paths(project)
        recorded = load_manifest(paths).get("url")
        if not url and installed.url:
            url = installed.url
            click.echo(f"Server {url}, as installed (--url to change it)")
        elif not url and isinstance(recorded, str) and recorded:  # config.json broken or moved
            url = recorded
            shown = tilde(paths.manifest, paths.home)
            click.echo(f"Server {url}, as {shown} records (--url to change it)")
        if not key and installed.api_key:
            key = installed.api_key
            click.echo("Key: the one installed (--key or --key-file to change it)")
    _refuse_to_ask_without_a_terminal(url, key)
    url = (url or click.prompt("Relay server URL", default="http://127.0.0.1:8765")).strip()
    key = (key or click.prompt("API key", hide_input=True)).strip()
    agent_names = agent_names or AGENTS
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
            state = "unchanged" if not c.changed else "create" if c.before is None else "update"
            click.echo(f"  would {state:<9} {tilde(c.path, paths.home)}  ({c.what})")
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
