"""`python -m relay` runs the same command as the `relay` entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from integration_support import clean_env, relay


def python_m_relay(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_python_m_relay_is_the_relay_command(tmp_path: Path):
    """QA: `python -m relay` failed with 'No module named relay.__main__' (the working
    rules themselves tell helpers to run it)."""
    for args in (("--version",), ("--help",), ("remember", "--help")):
        done = python_m_relay(tmp_path, *args)
        assert done.returncode == 0, done.stderr
        assert done.stdout == relay(tmp_path, *args).stdout
    # an error is the entry point's one line and exit code, not a traceback
    done = python_m_relay(tmp_path, "import", str(tmp_path / "missing.md"))
    expected = relay(tmp_path, "import", str(tmp_path / "missing.md"))
    assert (done.returncode, done.stderr) == (expected.returncode, expected.stderr)
    assert done.returncode == 2 and done.stderr.startswith("relay: error: no such file")


def test_loading_the_command_leaves_numpy_for_the_command_run():
    """`relay serve` and `relay bench` pin BLAS to one thread before numpy loads; numpy reads
    that only when it loads, so no module every command imports may load it. One did
    (`relay.migrate_verify`, through the store), and search at 100,000 memories went from
    p50 17 to 28 ms with BLAS spread over both cores."""
    code = "import sys, relay.cli; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
