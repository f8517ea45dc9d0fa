"""The tree stays lint-clean and formatted: several people commit here at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"
MYPY = Path(sys.executable).parent / "mypy"


def test_ruff_check_passes() -> None:
    done = subprocess.run([str(RUFF), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_has_nothing_to_change() -> None:
    done = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_no_error_in_the_package() -> None:
    """mypy on the package, STYLE's house habit: while nothing ran it, 95 errors gathered.
    A rerun reads its cache (.mypy_cache) and takes seconds; a clean clone, as CI has,
    checks cold: about 15 s on two cores, torch and transformers skipped (pyproject.toml)."""
    done = subprocess.run([str(MYPY), "relay"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# Imports each of Relay's modules first thing, as a command or a test file may: an import
# cycle hides while some other module happens to be imported before it (`relay.eval.commands`
# failed alone, through relay.cli, while the whole suite passed).
_EACH_ALONE = """
import importlib, pkgutil, sys, relay
names = sorted(m.name for m in pkgutil.walk_packages(relay.__path__, "relay."))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "relay" or m.startswith("relay.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(len(names))
print("\\n".join(failed))
"""


def test_every_module_imports_on_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _EACH_ALONE], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    count, *failed = done.stdout.splitlines()
    assert int(count) > 50 and [f for f in failed if f] == []
