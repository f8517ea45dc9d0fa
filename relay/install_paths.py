"""Where `relay install` puts things: the user's folders or a project's (`Paths`), the
home-relative names it prints, and the Relay executables the hooks run.

A project install writes the project's `.claude/` and `.codex/`, never the user-level
ones: a `--project` that is, or resolves to, the user-level folders is refused
(`refuse_user_level_project`).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from relay import agents
from relay.errors import InvalidRequestError


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
