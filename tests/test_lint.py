"""The tree stays lint-clean and formatted: several people commit here at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_check_passes() -> None:
    done = subprocess.run([str(RUFF), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_has_nothing_to_change() -> None:
    done = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
