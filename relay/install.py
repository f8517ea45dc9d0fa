"""`relay install` and `relay uninstall`: connect this machine to a Relay server and wire
recall into Claude Code and Codex, then take exactly that back out.

install: check the URL and key with one request (`GET /v1/whoami`) -> plan every
file's new content in memory (a file that is not valid JSON or TOML stops the
plan: nothing is written) -> check that every file it changes can be (nothing is
written otherwise) -> back up each file it changes -> write each one
atomically -> print what changed, file by file -> record in
`~/.relay/install.json` which files it created and where the originals are.

uninstall: for each recorded file, remove Relay's entries; when what remains
means the same as the original, the original bytes go back, and a file install
created is deleted. Whatever else the user changed meanwhile is kept. Every file
it will change is checked first (nothing is touched when one cannot be); then the
agents' settings go first and Relay's own files, backups and record last, so a
run stopped part way leaves what a second run needs, and says what is left.
The files `relay skill install` recorded go too, unless edited since (relay/skill.py).
`--project DIR` undoes only the records under DIR and rewrites the record without them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from relay import agents
from relay.errors import InvalidRequestError, NotFoundError, RelayError
from relay.hook import config as hook_config
from relay.knob_script import SCRIPT_KNOBS, hook_script, knob_value

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


def tilde(path: Path, home: Path) -> str:
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
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            lead = line[: len(line) - len(stripped)]
            return "\t" if lead.startswith("\t") else len(lead)
    return 2


def dump_json_like(doc: dict[str, Any], original: str | None) -> bytes:
    indent = _indent_of(original) if original else 2
    return (json.dumps(doc, indent=indent, ensure_ascii=False) + "\n").encode()


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


def _text(raw: bytes | None, path: Path) -> str:
    if raw is None:
        return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise agents.SettingsFileError(f"{path} is not UTF-8 text; nothing was changed") from None


def _json_change(path: Path, role: str, what: str, edit, mode: int = 0o644) -> Change:  # noqa: ANN001
    before = read_bytes(path)
    text = _text(before, path)
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
    config_doc = agents.parse_json(_text(config_before, paths.config), str(paths.config))
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

    def hooks_edit(where: str):  # noqa: ANN202
        return lambda doc: (agents.add_hooks(doc, script_ref, where), [])

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
        text = _text(before, paths.codex_config)
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
    before_install = agents.parse_json(_text(original, paths.claude_json), str(paths.claude_json))
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
            ensure_dir(paths.backups, created_dirs)
            backup = paths.backups / f"{c.path.name}.{stamp}"
            n = 0
            while backup.exists():
                n += 1
                backup = paths.backups / f"{c.path.name}.{stamp}.{n}"
            write_atomic(backup, c.before, 0o600)
        if record is None:
            record = {"role": c.role, "created": c.before is None, "original": None}
            record["original"] = str(backup) if backup else None
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


# -- uninstall -------------------------------------------------------------------------------
def _same_json(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return agents.normalise_hooks(a) == agents.normalise_hooks(b)


def plan_uninstall(paths: Paths, manifest: dict[str, Any]) -> tuple[list[Change], list[str]]:
    """The reverse edit of every recorded file; (changes, warnings)."""
    changes, warnings = [], []
    for name, record in manifest.get("files", {}).items():
        path = Path(name)
        current = read_bytes(path)
        if current is None:
            continue
        original = None
        if record.get("original"):
            original = read_bytes(Path(record["original"]))
            if original is None:
                warnings.append(
                    f"{path}: its backup {record['original']} is gone; Relay's entries removed only"
                )
        created = bool(record.get("created"))
        role = record.get("role")
        try:
            after = _reverse(role, path, current, original, created)
        except agents.SettingsFileError as exc:
            warnings.append(f"{exc.message}; left as it is")
            continue
        changes.append(Change(path, role or "", current, after, _reverse_what(role)))
    return changes, warnings


def _reverse(
    role: str | None, path: Path, current: bytes, original: bytes | None, created: bool
) -> bytes | None:
    if role in ("relay-key", "relay-config", "hook-script"):
        return None if created else original if original is not None else current
    text = _text(current, path)
    orig_text = _text(original, path) if original is not None else ""
    if role == "codex-config":
        stripped = agents.strip_codex_config(text)
        if created and not stripped.strip():
            return None
        if original is not None and agents.parse_toml(stripped, str(path)) == agents.parse_toml(
            orig_text, str(path)
        ):
            return original
        return stripped.encode()
    doc = agents.parse_json(text, str(path))
    orig_doc = agents.parse_json(orig_text, str(path)) if original is not None else {}
    if role == "claude-mcp":
        stripped_doc = agents.strip_mcp_server(doc, orig_doc)
    else:
        stripped_doc = agents.strip_hooks(doc, str(path))
    if created and not agents.normalise_hooks(stripped_doc):
        return None
    # The original may hold Relay's hook registered by hand (relay-hook itself), which
    # install replaced with its own: what is left once Relay's entries go is then the
    # original without them, and the original comes back whole, that entry included.
    unchanged = orig_doc if role == "claude-mcp" else agents.strip_hooks(orig_doc, str(path))
    if original is not None and _same_json(stripped_doc, unchanged):
        return original
    if stripped_doc == doc:
        return current
    return dump_json_like(stripped_doc, text)


def _reverse_what(role: str | None) -> str:
    return {
        "relay-key": "API key",
        "relay-config": "Relay config",
        "hook-script": "recall hook script",
        "hooks-json": "Relay hooks",
        "claude-mcp": "MCP server `relay`",
        "codex-config": "Relay's [features] line and [mcp_servers.relay]",
    }.get(role or "", "Relay's entries")


def uninstall_order(changes: list[Change]) -> list[Change]:
    """The agents' settings first, Relay's own files last: stopped part way, the key, the
    config and the script are still there for the hooks left behind, and for a second run."""
    return sorted(changes, key=lambda c: c.role in OWN_FILES)


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


def _leftovers(paths: Paths, manifest: dict[str, Any]) -> list[Path]:
    """Relay's backups and its install record: removed once every file is undone."""
    out = [
        Path(backup)
        for record in manifest.get("files", {}).values()
        for backup in record.get("backups", []) + [record.get("original")]
        if backup
    ]
    return [*dict.fromkeys(out), paths.manifest]


def blockers(changes: list[Change], paths: Paths, manifest: dict[str, Any] | None) -> list[str]:
    """Every file install (`manifest` None) or uninstall would change or remove that it
    cannot, found before it changes any."""
    targets = [(c.path, c.after is None) for c in changes if c.changed]
    if manifest is not None:
        targets += [(p, True) for p in _leftovers(paths, manifest) if p.exists()]
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


def apply_uninstall(
    changes: list[Change],
    paths: Paths,
    manifest: dict[str, Any],
    echo: Callable[[str], None],
    keep: dict[str, Any] | None = None,
    command: str = "uninstall",
) -> None:
    """Undo each change in `uninstall_order`, echoing a line for each as it is done, then
    remove the backups `manifest` names and the install record, or, given `keep` (what
    `relay uninstall --project` leaves), rewrite the record as that. An OSError part way
    becomes a RelayError naming what was not undone."""
    ordered = uninstall_order(changes)
    for i, c in enumerate(ordered):
        label = tilde(c.path, paths.home)
        try:
            if c.after is None:
                c.path.unlink(missing_ok=True)
                line = f"  removed    {label}  ({c.what})"
            elif not c.changed:
                why = "; ".join(c.notes)  # a skill file edited since: kept, and why
                line = f"  kept       {label}  ({why})" if why else f"  unchanged  {label}"
            else:
                write_atomic(c.path, c.after, 0o644)
                line = f"  restored   {label}  (without {c.what})"
        except OSError as exc:
            done = [tilde(x.path, paths.home) for x in ordered[:i] if x.changed]
            left = [tilde(x.path, paths.home) for x in ordered[i:] if x.changed]
            raise _stopped(label, exc, done, left, command) from exc
        echo(line)
    for path in _leftovers(paths, manifest):
        if path == paths.manifest and keep is not None:
            continue  # rewritten below, once the folders are gone
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            done = [tilde(x.path, paths.home) for x in ordered if x.changed]
            raise _stopped(tilde(path, paths.home), exc, done, [], command) from exc
    # The skill's folder goes once empty, even when an older `relay skill install` made it.
    skill_dirs = [str(c.path.parent) for c in ordered if c.role == "skill" and c.after is None]
    removed: set[str] = set()
    for d in sorted({*manifest.get("dirs", []), *skill_dirs}, key=len, reverse=True):
        with contextlib.suppress(OSError):
            Path(d).rmdir()  # only if empty: the hook's state or a database may live there
            removed.add(d)
    if keep is not None:
        keep["dirs"] = [d for d in keep["dirs"] if d not in removed]
        try:
            save_manifest(paths, keep)
        except OSError as exc:
            done = [tilde(x.path, paths.home) for x in ordered if x.changed]
            raise _stopped(tilde(paths.manifest, paths.home), exc, done, [], command) from exc


def _stopped(
    label: str, exc: OSError, done: list[str], left: list[str], command: str = "uninstall"
) -> RelayError:
    return RelayError(
        f"uninstall stopped at {label}: {exc.strerror or exc}. "
        f"Already undone: {', '.join(done) or 'nothing'}. "
        f"Not yet: {', '.join([*left, 'Relay backups and install record'])}. "
        f"Fix that, then run `relay {command}` again: it goes on from there"
    )


def plan_uninstall_without_manifest(paths: Paths) -> list[Change]:
    """No record of what install did: strip Relay's entries from the usual places only, and
    remove the skill's files from theirs where they are exactly what this Relay writes."""
    from relay import skill

    records = {
        str(paths.claude_settings): {"role": "hooks-json"},
        str(paths.codex_hooks): {"role": "hooks-json"},
        str(paths.claude_json): {"role": "claude-mcp"},
        str(paths.codex_config): {"role": "codex-config"},
    }
    changes, _ = plan_uninstall(paths, {"files": records})
    if paths.script.exists():
        changes.append(
            Change(
                paths.script, "hook-script", read_bytes(paths.script), None, "recall hook script"
            )
        )
    return changes + skill.plan_unrecorded_removal(paths)


def split_project(manifest: dict[str, Any], project: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the records of what install and skill install wrote under `project`, resolved as
    they resolve it, and the rest of the manifest). Relay's own files serve every
    project: they are never one project's."""
    files = {
        name: record
        for name, record in manifest.get("files", {}).items()
        if Path(name).is_relative_to(project) and record.get("role") not in OWN_FILES
    }
    skills = {
        name: record
        for name, record in manifest.get("skills", {}).items()
        if Path(name).is_relative_to(project)
    }
    part = {
        "files": files,
        "skills": skills,
        "dirs": [d for d in manifest.get("dirs", []) if Path(d).is_relative_to(project)],
    }
    rest = {
        **manifest,
        "files": {n: r for n, r in manifest.get("files", {}).items() if n not in files},
        "skills": {n: r for n, r in manifest.get("skills", {}).items() if n not in skills},
        "dirs": list(manifest.get("dirs", [])),
    }
    return part, rest


# -- verification -----------------------------------------------------------------------------
def verify(url: str, key: str) -> dict[str, Any]:
    """One request: the server answers and accepts the key, and the key may read memories."""
    from relay.client import RelayClient

    if not url.startswith(("http://", "https://")):
        raise InvalidRequestError(f"server URL must start with http:// or https:// (got {url!r})")
    if not key or not all("!" <= ch <= "~" for ch in key):
        raise InvalidRequestError("the API key is empty or contains spaces or non-ASCII characters")
    try:
        who = RelayClient(url, key, timeout=10).get("/v1/whoami")
    except NotFoundError:
        raise _not_relay_root(url, "404 Not Found") from None
    except ValueError:  # a 2xx whose body is not JSON: some other web server
        raise _not_relay_root(url, "an answer that is not JSON") from None
    if not isinstance(who, dict) or not isinstance(who.get("key"), dict):
        raise _not_relay_root(url, "an answer that is not Relay's")
    scopes = set(who.get("key", {}).get("scopes") or [])
    if not scopes & {"memory:read", "admin"}:
        raise InvalidRequestError(
            "this key lacks memory:read, so every recall would be refused; an admin creates one"
            " with 'relay key create --org ORG --name NAME --scope memory:read'"
        )
    return who


def _not_relay_root(url: str, answer: str) -> InvalidRequestError:
    base = url.rstrip("/")
    root = base.removesuffix("/v1")
    give = (
        f"give its root, {root}, without /v1"
        if root != base
        else "give the root URL `relay serve` prints (the one /healthz and /v1/... are under)"
    )
    return InvalidRequestError(
        f"{url} is not a Relay server root: GET {base}/v1/whoami got {answer}; {give}"
    )


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
    if key_file:
        source = click.get_current_context().get_parameter_source("key")
        if key and source is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("give --key or --key-file, not both")
        key = read_key_file(key_file)  # beats RELAY_API_KEY, as a flag beats the environment
    if not url or not key:  # run again to repair or change one thing: keep the rest
        from relay.hook import config as hook_config

        installed = hook_config.load()
        if not url and installed.url:
            url = installed.url
            click.echo(f"Server {url}, as installed (--url to change it)")
        if not key and installed.api_key:
            key = installed.api_key
            click.echo("Key: the one installed (--key or --key-file to change it)")
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
    refuse_blocked("install", blockers(changes, paths, None))
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


@click.command("uninstall")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Undo only what install and skill install wrote under this project; keep the rest.",
)
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
def uninstall(project: Path | None, dry_run: bool) -> None:
    """Remove exactly what `relay install` and `relay skill install` added; originals come
    back where nothing else changed, and a skill file you edited stays.

    With --project DIR, only what `relay install --project DIR` and `relay skill install
    --project DIR` wrote under DIR is undone; your user-level install (key, config, hook
    script, MCP server) and other projects stay, and so does their install record.
    """
    from relay import skill

    paths = default_paths()
    manifest = load_manifest(paths)
    if project is not None:
        _uninstall_project(paths, manifest, project.resolve(), dry_run)
        return
    warnings: list[str] = []
    if manifest.get("files"):
        changes, warnings = plan_uninstall(paths, manifest)
        # A skill an older Relay wrote, before skill install kept a record
        changes += skill.plan_unrecorded_removal(paths)
    else:
        if manifest:
            click.echo("No `relay install` recorded: removing Relay's entries only.")
        else:
            click.echo("No install record (~/.relay/install.json): removing Relay's entries only.")
        changes = plan_uninstall_without_manifest(paths)
    recorded = skill.plan_removal(manifest.get("skills", {}))
    changes = [c for c in changes if c.path not in {r.path for r in recorded}] + recorded
    if dry_run:
        _dry_run(changes, paths)
        return
    for warning in warnings:
        click.echo(f"  warning: {warning}", err=True)
    refuse_blocked("uninstall", blockers(changes, paths, manifest))
    apply_uninstall(changes, paths, manifest, click.echo)
    click.echo("Relay is no longer wired into the agents on this machine.")


def _uninstall_project(
    paths: Paths, manifest: dict[str, Any], project: Path, dry_run: bool
) -> None:
    from relay import skill

    where = tilde(project, paths.home)
    part, rest = split_project(manifest, project)
    if not part["files"] and not part["skills"]:
        why = (
            "~/.relay/install.json names no file that `relay install --project` or"
            " `relay skill install --project` wrote there"
            if manifest
            else "there is no install record (~/.relay/install.json)"
        )
        click.echo(f"Nothing recorded for {where}: {why}. Nothing was changed.")
        return
    changes, warnings = plan_uninstall(paths, part)
    changes += skill.plan_removal(part["skills"])
    if dry_run:
        _dry_run(changes, paths)
        click.echo(f"  would rewrite  ~/.relay/install.json  (without {where}'s records)")
        return
    for warning in warnings:
        click.echo(f"  warning: {warning}", err=True)
    command = f"uninstall --project {shlex.quote(str(project))}"
    refuse_blocked(command, blockers(changes, paths, part))
    apply_uninstall(changes, paths, part, click.echo, keep=rest, command=command)
    click.echo(
        f"Relay is no longer wired into {where}; the user-level install and other projects"
        " stay (`relay uninstall` takes out everything)."
    )


def _dry_run(changes: list[Change], paths: Paths) -> None:
    for c in uninstall_order(changes):
        state = "remove" if c.after is None else "restore" if c.changed else "keep"
        notes = f"  ({'; '.join(c.notes)})" if c.notes else ""
        click.echo(f"  would {state:<8} {tilde(c.path, paths.home)}{notes}")
