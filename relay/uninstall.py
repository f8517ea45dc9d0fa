"""`relay uninstall`: take out exactly what `relay install` and `relay skill install` put in.

For each recorded file (`~/.relay/install.json`, written by relay/install.py), remove
Relay's entries; when what remains means the same as the original, the original bytes go
back, and a file install created is deleted. Whatever else the user changed meanwhile is
kept. Every file it will change is checked first (nothing is touched when one cannot be);
then the agents' settings go first and Relay's own files, backups and record last, so a
run stopped part way leaves what a second run needs, and says what is left. The files
`relay skill install` recorded go too, unless edited since (relay/skill.py).
`--project DIR` undoes only the records under DIR and rewrites the record without them;
a DIR deleted since has nothing left to undo, and its records are simply dropped.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from relay import agents, json_text
from relay.errors import RelayError
from relay.install_files import (
    OWN_FILES,
    Change,
    blockers,
    file_text,
    load_manifest,
    read_bytes,
    refuse_blocked,
    save_manifest,
    write_atomic,
)
from relay.install_paths import Paths, default_paths, refuse_user_level_project, tilde


def _same_json(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return agents.normalise_hooks(a) == agents.normalise_hooks(b)


def plan_uninstall(
    paths: Paths, manifest: dict[str, Any], command: str = "uninstall"
) -> tuple[list[Change], list[str]]:
    """The reverse edit of every recorded file; (changes, warnings). A file whose Relay
    entries cannot be found (not JSON, say) stops it before anything is changed: going on
    left the agent wired, deleted the record a second run needs, and said Relay was gone."""
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
            after = _reverse(role, path, current, original, created, f"relay {command}")
        except agents.SettingsFileError as exc:
            raise agents.SettingsFileError(
                f"{command} cannot take the {_reverse_what(role)} out of"
                f" {tilde(path, paths.home)}, so Relay is still wired in: {exc.message}"
            ) from None
        change = Change(path, role or "", current, after, _reverse_what(role))
        if role in OWN_FILES and after is not None and after == original:
            _restore_mode(change, record.get("mode"))
        changes.append(change)
    return changes, warnings


def _restore_mode(change: Change, mode: object) -> None:
    """Relay's own file goes back with the original's mode too (install made it 600, or 700
    for the script), unless that would open a key to others: then 600 stays, and the
    restored line says why."""
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
        return  # recorded by an older Relay: the file keeps the mode it has
    change.mode, change.force_mode = mode, True
    holds_key = change.role == "relay-key"
    if change.role == "relay-config":
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            doc = json.loads(change.after or b"")
            holds_key = isinstance(doc, dict) and bool(doc.get("api_key"))
    if holds_key and mode & 0o077:
        change.mode = mode & 0o700
        what = "an API key" if change.role == "relay-key" else "an API key (api_key)"
        change.notes.append(
            f"mode {change.mode:o} kept, not the original's {mode:o}: it holds {what}"
        )


def _reverse(
    role: str | None,
    path: Path,
    current: bytes,
    original: bytes | None,
    created: bool,
    rerun: str,
) -> bytes | None:
    if role in ("relay-key", "relay-config", "hook-script"):
        return None if created else original if original is not None else current
    text = file_text(current, path)
    orig_text = file_text(original, path) if original is not None else ""
    if role == "codex-config":
        stripped = agents.strip_codex_config(text)
        if created and not stripped.strip():
            return None
        if original is not None and agents.parse_toml(stripped, str(path)) == agents.parse_toml(
            orig_text, str(path)
        ):
            return original
        return stripped.encode()
    doc = agents.parse_json(text, str(path), rerun)
    orig_doc = agents.parse_json(orig_text, str(path), rerun) if original is not None else {}
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
    return json_text.render(stripped_doc, text).encode()


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


def _leftovers(paths: Paths, manifest: dict[str, Any]) -> list[Path]:
    """Relay's backups and its install record: removed once every file is undone."""
    out = [
        Path(backup)
        for record in manifest.get("files", {}).values()
        for backup in record.get("backups", []) + [record.get("original")]
        if backup
    ]
    return [*dict.fromkeys(out), paths.manifest]


_REPLACED_KEY = "a key a later install replaced"


def _replaced_keys(manifest: dict[str, Any]) -> list[Path]:
    """The backups of keys that a later install replaced (install named each one): gone
    with the rest, but said, unlike the backups of originals, which come back."""
    return [
        Path(backup)
        for record in manifest.get("files", {}).values()
        if record.get("role") == "relay-key"
        for backup in record.get("backups", [])
        if backup and backup != record.get("original")
    ]


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
                write_atomic(c.path, c.after, c.mode, force_mode=c.force_mode)
                notes = "".join(f"; {n}" for n in c.notes)
                line = f"  restored   {label}  (without {c.what}{notes})"
        except OSError as exc:
            done = [tilde(x.path, paths.home) for x in ordered[:i] if x.changed]
            left = [tilde(x.path, paths.home) for x in ordered[i:] if x.changed]
            raise _stopped(label, exc, done, left, command) from exc
        echo(line)
    replaced_keys = _replaced_keys(manifest)
    for path in _leftovers(paths, manifest):
        if path == paths.manifest and keep is not None:
            continue  # rewritten below, once the folders are gone
        said = path in replaced_keys and path.exists()
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            done = [tilde(x.path, paths.home) for x in ordered if x.changed]
            raise _stopped(tilde(path, paths.home), exc, done, [], command) from exc
        if said:
            echo(f"  removed    {tilde(path, paths.home)}  ({_REPLACED_KEY})")
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
    # Every entry of Relay's names it ("relay"): a file without the word holds none, and is
    # not read, so one the user keeps as JSON with comments is no reason to stop.
    records = {
        name: r for name, r in records.items() if b"relay" in (read_bytes(Path(name)) or b"")
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


@click.command("uninstall")
@click.option(
    "--project",
    # A folder deleted since is accepted: its files are gone, and their records go too.
    type=click.Path(file_okay=False, path_type=Path),
    help="Undo only what install and skill install wrote under this project (or drop the"
    " records of a folder deleted since); keep the rest.",
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

    refuse_user_level_project(default_paths(project), "uninstall")
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
        changes = plan_uninstall_without_manifest(paths)
    recorded = skill.plan_removal(manifest.get("skills", {}))
    changes = [c for c in changes if c.path not in {r.path for r in recorded}] + recorded
    if not any(c.changed for c in changes) and not any(
        p.exists() for p in _leftovers(paths, manifest)
    ):
        click.echo(
            "Nothing to remove: no install record (~/.relay/install.json), and no Relay hooks,"
            " MCP server, hook script or skill where install puts them. Nothing was changed."
        )
        return
    if not manifest.get("files"):
        click.echo(_without_install(manifest, changes, recorded))
    if dry_run:
        _dry_run(changes, paths, manifest)
        return
    for warning in warnings:
        click.echo(f"  warning: {warning}", err=True)
    refuse_blocked("uninstall", blockers(changes, paths, _leftovers(paths, manifest)))
    apply_uninstall(changes, paths, manifest, click.echo)
    click.echo("Relay is no longer wired into the agents on this machine.")


def _without_install(manifest: dict[str, Any], changes: list[Change], skills: list[Change]) -> str:
    """What uninstall removes with no record of `relay install`: Relay's entries where install
    puts them, and the skill files `relay skill install` recorded, if any (after that alone,
    "Relay's entries only" told of an install it never had)."""
    if not manifest:
        return "No install record (~/.relay/install.json): removing Relay's entries only."
    if not skills:
        return "No `relay install` recorded: removing Relay's entries only."
    recorded = {c.path for c in skills}
    if not any(c.changed and c.path not in recorded for c in changes):
        return (
            "No `relay install` recorded, only `relay skill install`: removing the skill it wrote."
        )
    return (
        "No `relay install` recorded: removing the skill `relay skill install` wrote, and"
        " Relay's entries where install puts them."
    )


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
    command = f"uninstall --project {shlex.quote(str(project))}"
    changes, warnings = plan_uninstall(paths, part, command)
    changes += skill.plan_removal(part["skills"])
    if dry_run:
        _dry_run(changes, paths, part)
        click.echo(f"  would rewrite  ~/.relay/install.json  (without {where}'s records)")
        return
    for warning in warnings:
        click.echo(f"  warning: {warning}", err=True)
    refuse_blocked(command, blockers(changes, paths, _leftovers(paths, part)))
    apply_uninstall(changes, paths, part, click.echo, keep=rest, command=command)
    click.echo(
        f"Relay is no longer wired into {where}; the user-level install and other projects"
        " stay (`relay uninstall` takes out everything)."
    )


def _dry_run(changes: list[Change], paths: Paths, manifest: dict[str, Any]) -> None:
    for c in uninstall_order(changes):
        state = "remove" if c.after is None else "restore" if c.changed else "keep"
        notes = f"  ({'; '.join(c.notes)})" if c.notes else ""
        click.echo(f"  would {state:<8} {tilde(c.path, paths.home)}{notes}")
    for path in _replaced_keys(manifest):
        if path.exists():
            click.echo(f"  would remove   {tilde(path, paths.home)}  ({_REPLACED_KEY})")
