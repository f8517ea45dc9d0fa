"""`relay doctor`'s checks of the hook's settings: the config file as the hook reads it,
the settings it runs with (the knob script's beat config.json's), and its server URL and
API key, from the hook's own reading of their sources.

`ConfigChecks` is a part of `relay.doctor.Doctor`, kept apart to keep each module readable
in one sitting; it records its findings with the Doctor's `add`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay import key_source, knob_script
from relay.hook import codec
from relay.hook import config as hook_config

if TYPE_CHECKING:
    from relay.install_paths import Paths


class ConfigChecks:
    """The settings part of the Doctor: what the hook will run with, and its key's source."""

    environ: dict[str, str]
    paths: Paths
    cfg: hook_config.Config | None
    url_source: str

    if TYPE_CHECKING:

        def add(self, level: str, area: str, message: str, fix: str = "") -> None: ...
        def home(self, path: Path | str) -> str: ...
        def _script_in_use(self) -> bool: ...
        @property
        def _script_reading(self) -> knob_script.Reading | None: ...

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
                parsed = codec.loads(path.read_bytes())  # as the hook reads it: past a BOM
                if not isinstance(parsed, dict):
                    raise ValueError("not a JSON object")
                raw = parsed
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
        capped: list[str] = []
        handed = script.handed(self.environ) if script else self.environ
        self.cfg = cfg = hook_config.load(handed, ignored, capped)
        script_vars: set[str] = set()  # the RELAY_<NAME>s the script sets
        if script is not None:
            for unusable in script.problems(self.home(self.paths.script)):
                self.add("warn", "config", unusable.message, unusable.fix)
            self._check_shadowed_knobs(path, raw, script)
            # A bad value from the script is named above, with its line; load() words the
            # others `name 'value' in RELAY_NAME (why)`.
            script_vars = {var for var, value in handed.items() if self.environ.get(var) != value}
            ignored = [w for w in ignored if not any(f" in {v} (" in w for v in script_vars)]
        for what in ignored:
            self.add(
                "warn",
                "config",
                f"the hook ignores {what} and {self._runs_with(what, cfg, script_vars)}"
                " (docs/hook.md)",
                "fix the value (RELAY_<NAME> in the environment or in the hook script, else"
                " config.json)",
            )
        for what in capped:  # not a knob of the script: no value from it to leave out
            self.add(
                "warn",
                "config",
                f"the hook caps {what}",
                "lower the value to the cap or below (RELAY_<NAME> in the environment, else"
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
        # Where the hook found its key, as it read its sources (api_key, else the key file);
        # without one the server is still checked (/healthz takes no key), then the key says
        # why there is none.
        key_from_file = bool(cfg.api_key) and cfg.key_setting == "api_key_file"
        source = (
            "no key the hook can send (see key)"
            if not cfg.api_key
            else "key from "
            + (
                self.home(os.path.expanduser(cfg.api_key_file))
                if key_from_file
                else key_source.setting_place(cfg, "api_key", self.home)
            )
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

    def _runs_with(self, ignored: str, cfg: hook_config.Config, script_vars: set[str]) -> str:
        """What the hook takes instead of an ignored value (`ignored` starts with the
        setting's name), and from where: a layer below it, or one above (the knob script's
        RELAY_<NAME> over a bad value in config.json)."""
        name = ignored.split(" ", 1)[0]
        where = cfg.origin.get(name)
        value = "its value" if name == "api_key" else repr(cfg[name])  # no secret printed
        if where is None:
            return f"runs with its default, {value}"
        if where in script_vars:
            return f"runs with {value} from {self.home(self.paths.script)}"
        return f"runs with {value} from {where if where.startswith('RELAY_') else self.home(where)}"

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
