"""How install, uninstall and the skill change files: a planned `Change` per file, checked
before anything is written (`blockers`), applied atomically with a backup of what it
replaces, and recorded in the manifest (`~/.relay/install.json`) that uninstall reverses.

Relay's own files (the key, config.json, the hook script) get their permissions enforced;
the agents' settings files keep theirs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay import agents
from relay.errors import RelayError
from relay.install_paths import Paths, tilde

MANIFEST_VERSION = 1
OWN_FILES = ("relay-key", "relay-config", "hook-script")  # Relay's files: permissions enforced


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


def loose_key_mode(c: Change) -> int | None:
    """The mode of the key file `c` leaves as it is when others may read it (a key written
    by hand, or by `echo KEY > ~/.relay/key`, is 0644 under the usual umask), else None:
    install tightens it to 0600 as it would a key it writes."""
    if c.role != "relay-key" or c.changed or c.before is None:
        return None
    with contextlib.suppress(OSError):
        mode = os.stat(c.path).st_mode & 0o777
        return mode if mode & 0o077 else None
    return None


def note_lines(changes: Sequence[Change], paths: Paths) -> list[str]:
    """What install says beside its lines of files (a dead knob, a longer timeout)."""
    return [f"  note: {tilde(c.path, paths.home)}: {n}" for c in changes for n in c.notes]


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
            if (loose := loose_key_mode(c)) is not None:
                os.chmod(c.path, c.mode)
                lines.append(f"  updated    {label}  ({c.what}; mode {c.mode:o}, was {loose:o})")
            else:
                lines.append(f"  unchanged  {label}  ({c.what})")
            continue
        ensure_dir(c.path.parent, created_dirs)
        record = manifest["files"].get(str(c.path))
        # What a write replaces is kept, a key an earlier install wrote too: a secret is
        # shown once, and the key replacing it may be the wrong one (another organisation's).
        backup = None
        if c.before is not None:
            backup = back_up(paths, c.path, c.before, created_dirs, stamp)
        extra = f"; backup {tilde(backup, paths.home)}" if backup else ""
        if backup and record is not None and c.role == "relay-key":
            extra = (
                f"; the key it replaced is kept in {tilde(backup, paths.home)}, mode 600,"
                " until `relay uninstall`"
            )
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
        lines.append(f"  {verb:<9}  {label}  ({c.what}{extra})")
    lines += note_lines(changes, paths)
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
