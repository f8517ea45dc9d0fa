"""Helpers for the integration tests: `relay` run as a user runs it, in a temporary HOME."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
RELAY = str(BIN / "relay")
# Variables that would point a run at the developer's own setup instead of the temp HOME.
_SCRUB = ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "XDG_CONFIG_HOME")


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RELAY_") and k not in _SCRUB and k != "HOME"
    }
    env["HOME"] = str(home)
    env.update(extra)
    return env


def relay(home: Path, *args: str, stdin: str | None = None, cwd: Path | None = None, **extra: str):
    """Run `relay ARGS` in `home` (from `cwd`); returns the CompletedProcess (text)."""
    return subprocess.run(
        [RELAY, *args],
        env=clean_env(home, **extra),
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` with its bytes and permission bits."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def registered_command(settings: Path, event: str) -> str:
    """The Relay command written into an agent's hooks file for `event`."""
    doc = json.loads(settings.read_text())
    commands = [
        h["command"]
        for group in doc["hooks"][event]
        for h in group["hooks"]
        if "relay-autosearch-hook.sh" in h["command"]
    ]
    assert len(commands) == 1, commands
    return commands[0]


def run_registered(
    command: str, home: Path, payload: dict, shell: str = "/bin/sh", extra_env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a registered hook command the way the agents do: `sh -c COMMAND`, JSON on stdin,
    with a bare environment (an agent passes its own, not the test runner's) plus
    `extra_env`, what the user exported before starting the agent."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", **(extra_env or {})}
    if "PYTHONPATH" in os.environ:  # a worktree's tests run its own hook, not the venv's
        env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    return subprocess.run(
        [shell, "-c", command],
        input=json.dumps(payload).encode(),
        capture_output=True,
        env=env,
        timeout=30,
    )


def mint(url: str, admin_key: str, name: str, scopes: list[str], roles=()) -> dict:
    response = httpx.post(
        f"{url}/v1/keys",
        json={"name": name, "scopes": scopes, "roles": list(roles)},
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return response.json()


def revoke(url: str, admin_key: str, key_id: str) -> None:
    response = httpx.delete(
        f"{url}/v1/keys/{key_id}", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    )
    assert response.status_code == 200, response.text


def remember(url: str, key: str, **fields) -> dict:
    response = httpx.post(
        f"{url}/v1/memories", json=fields, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert response.status_code == 201, response.text
    return response.json()


def start_module_server(tmp_path_factory, name: str, extra_env: dict[str, str] | None = None):
    """`relay serve` for one test module (conftest's launcher), stopped with its pipe closed.

    The launcher returns at "Application startup complete", which uvicorn prints before
    it binds the port; on a busy machine another process can take the port meanwhile.
    So the server must still be running and answer as Relay, else it is started again.
    """
    import time

    from conftest import start_server

    for _ in range(3):
        server = start_server(tmp_path_factory.mktemp(name) / "relay.db", extra_env)
        time.sleep(0.2)
        try:
            ok = httpx.get(f"{server.url}/healthz", timeout=10).json().get("status") == "ok"
        except (httpx.HTTPError, ValueError, AttributeError):
            ok = False
        if ok and server.process.poll() is None:
            return server
        stop_server(server)
    raise RuntimeError("relay serve did not come up on a port of its own")


def wait_healthy(server, within_s: float) -> None:
    """Until /healthz answers 200: start_server returns a moment before the port is bound,
    and a server whose database was away needs a moment to use it again."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        try:
            if httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"/healthz not ok within {within_s} s"
        time.sleep(0.1)


def stop_server(server) -> None:
    server.stop()
    if server.process.stdout:
        server.process.stdout.close()


def old_script(relay_hook: str) -> str:
    """The knob script as `relay install` wrote it before its guard, knobs set as shell."""
    return f"""#!/bin/sh
# Relay automatic recall: Claude Code and Codex run this on every prompt (and with
# `session-start` when a session starts). Written by `relay install`, yours to edit:
# edits apply from the next prompt, no restart; `relay install` restores the defaults.
# Delete this file to turn automatic recall off; the agents then skip it silently.

# No new search within this many prompts of the last one.
THROTTLE_PROMPTS=2
# Search again only when keyword overlap with the last search is below this (0..1).
OVERLAP_THRESHOLD=0.30
# Prompts shorter than this many characters never search.
MIN_PROMPT_LEN=15
# Whole budget per prompt in ms, from process start; then the prompt goes on.
DEADLINE_MS=400

export RELAY_THROTTLE_PROMPTS="${{RELAY_THROTTLE_PROMPTS:-$THROTTLE_PROMPTS}}" \\
  RELAY_OVERLAP_THRESHOLD="${{RELAY_OVERLAP_THRESHOLD:-$OVERLAP_THRESHOLD}}" \\
  RELAY_MIN_PROMPT_LEN="${{RELAY_MIN_PROMPT_LEN:-$MIN_PROMPT_LEN}}" \\
  RELAY_DEADLINE_MS="${{RELAY_DEADLINE_MS:-$DEADLINE_MS}}"
exec {relay_hook} "$@"
"""


class BatchProxy:
    """A loopback proxy to `upstream` (a real server) whose `nth` POST /v1/memories/batch
    meets `act` instead: "interrupt" sends the client (`client_pid`) Ctrl-C and never
    answers, as if the user pressed it while that batch was on its way ("terminate": SIGTERM,
    as a cancelled CI job or a stopped unit sends); "overloaded"
    answers 503 without forwarding it; a function is called, then the batch forwarded, as
    if what it does happened while the batch was on its way. Use as a context manager;
    `url` is its address."""

    def __init__(self, upstream: str, nth: int, act: str | Callable[[], None]) -> None:
        import http.server
        import threading

        self.client_pid = 0
        self.batches = 0
        self.release = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                try:
                    self._relay()
                except Exception as exc:  # said to the client (so in the failure), not lost
                    self._answer(502, {"error": {"code": "internal", "message": repr(exc)}})

            def _answer(self, status: int, body: object) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/memories/batch":
                    proxy.batches += 1
                    if proxy.batches == nth and act in ("interrupt", "terminate"):
                        stop = signal.SIGINT if act == "interrupt" else signal.SIGTERM
                        os.kill(proxy.client_pid, stop)
                        proxy.release.wait(30)
                        return
                    if proxy.batches == nth and act == "overloaded":
                        said = {"code": "overloaded", "message": "server busy", "status": 503}
                        self._answer(503, {"error": said})
                        return
                    if proxy.batches == nth and callable(act):
                        act()
                reply = httpx.request(
                    self.command,
                    upstream + self.path,
                    content=body,
                    headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                    timeout=120,
                )
                self._answer(reply.status_code, reply.content)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> BatchProxy:
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def run(self, args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
        """`relay ARGS` through this proxy: (exit code, stdout, stderr)."""
        with subprocess.Popen(
            [RELAY, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A suite started in the background (`... &`) ignores SIGINT, and a child inherits
            # that: Python then never turns Ctrl-C into KeyboardInterrupt. A terminal does not.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        ) as run:
            self.client_pid = run.pid
            out, err = run.communicate(timeout=300)
        return run.returncode, out, err


@contextlib.contextmanager
def web_server(directory: Path):
    """A real web server that is not Relay, serving `directory` on loopback."""
    import functools
    from http.server import SimpleHTTPRequestHandler

    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with serving(handler) as url:
        yield url


@contextlib.contextmanager
def serving(handler):  # noqa: ANN001  (a request handler class, or a partial of one)
    """`handler` served on a loopback port by a thread; yields its base URL."""
    import threading
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` made unchangeable for root, who ignores permissions: the immutable attribute
    (`chattr +i`), taken off again after; the test is skipped where it cannot be set."""
    import pytest

    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)]).returncode != 0:
        pytest.skip("root ignores permissions, and chattr +i does not work here")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)
