"""Helpers for the hook tests: run the real `relay-hook` and serve it from a tiny fake server.

The fake server is a plain socket server on 127.0.0.1, so a test can make it
misbehave at the byte level (hang, stall mid-body, lie about its length).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HOOK = Path(sys.executable).parent / "relay-hook"
KEY = "relay_test_0123456789abcdef"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body) if self.body else None


class FakeRelay:
    """A loopback server answering every connection with `self.handler(conn, request)`."""

    def __init__(self, handler=None, tls=None) -> None:
        self.handler = handler or reply(200, {"results": []})
        self.tls = tls  # an ssl.SSLContext for the server side, or None for plain HTTP
        self.requests: list[Request] = []
        self.connections = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            request = Request(method, path, headers, body)
            with self._lock:
                self.requests.append(request)
            self.handler(conn, request)
        except Exception:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[Request]:
        """The requests read so far, once there are `count` of them (or `timeout` passed):
        a client that gave up may return before the server's thread has read what it sent."""
        until = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < until:
            time.sleep(0.01)
        with self._lock:
            return list(self.requests)

    def wait(self, seconds: float) -> None:
        """Sleep in a handler, cut short when the server closes."""
        self.stopping.wait(seconds)

    def close(self) -> None:
        self.stopping.set()
        self._sock.close()

    def __enter__(self) -> FakeRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reply(status: int, body: object, headers: dict[str, str] | None = None):
    """A handler answering `status` with `body` (JSON-encoded unless bytes)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reason = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 500: "Internal Server Error"}

    def handle(conn: socket.socket, request: Request) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        conn.sendall(
            f"HTTP/1.1 {status} {reason.get(status, 'X')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n{extra}\r\n".encode()
            + raw
        )

    return handle


def record(rid: str, revision: int = 1, text: str | None = None, **extra) -> dict:
    """One search result in the shape of docs/http-api.md."""
    out = {
        "id": rid,
        "revision": revision,
        "title": extra.pop("title", f"Title of {rid}"),
        "source": extra.pop("source", f"workspace/memories/{rid}"),
        "text": text if text is not None else f"The recorded fact of {rid}, revision {revision}.",
        "score": extra.pop("score", 0.7),
        "updated_at": extra.pop("updated_at", "2026-11-29T17:30:00Z"),
        "conflicts_with": extra.pop("conflicts_with", []),
    }
    out.update(extra)
    return out


def results(*records: dict) -> dict:
    return {
        "results": list(records),
        "stages": ["lexical"],
        "degraded": False,
        "cached": False,
        "took_ms": 1.5,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HookRun:
    rc: int
    out: bytes
    err: bytes
    ms: float
    output: dict | None = field(default=None)

    @property
    def context(self) -> str | None:
        if not self.output:
            return None
        return self.output.get("hookSpecificOutput", {}).get("additionalContext")


class Hook:
    """The real `relay-hook` command, with its own HOME and state directory."""

    def __init__(self, home: Path, url: str | None, **env: str) -> None:
        self.home = home
        self.state_dir = home / "state"
        base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        base.update(HOME=str(home), RELAY_STATE_DIR=str(self.state_dir), RELAY_DEADLINE_MS="2000")
        if url is not None:
            base.update(RELAY_URL=url, RELAY_API_KEY=KEY)
        base.update(env)
        self.env = base

    def payload(self, prompt: object, session: object = "sess-1", **extra) -> bytes:
        body = {
            "session_id": session,
            "prompt_id": extra.pop("prompt_id", f"p-{time.monotonic_ns()}"),
            "transcript_path": str(self.home / "t.jsonl"),
            "cwd": str(self.home),
            "hook_event_name": "UserPromptSubmit",
            "permission_mode": "default",
            "prompt": prompt,
        }
        body.update(extra)
        return json.dumps(body).encode()

    def start_payload(self, source: str, session: str = "sess-1") -> bytes:
        return json.dumps(
            {
                "session_id": session,
                "transcript_path": str(self.home / "t.jsonl"),
                "cwd": str(self.home),
                "hook_event_name": "SessionStart",
                "source": source,
            }
        ).encode()

    def run(self, stdin: bytes, *args: str, env: dict[str, str] | None = None) -> HookRun:
        started = time.monotonic()
        proc = subprocess.run(
            [str(HOOK), *args],
            input=stdin,
            capture_output=True,
            env={**self.env, **(env or {})},
            timeout=30,
        )
        ms = (time.monotonic() - started) * 1000
        run = HookRun(proc.returncode, proc.stdout, proc.stderr, ms)
        if proc.stdout.strip():
            run.output = json.loads(proc.stdout)
        return run

    def prompt(self, text: object, session: object = "sess-1", **extra) -> HookRun:
        return self.run(self.payload(text, session, **extra))

    def session_start(self, source: str, session: str = "sess-1") -> HookRun:
        return self.run(self.start_payload(source, session), "session-start")

    def outcomes(self) -> list[dict]:
        path = self.state_dir / "outcomes.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def last(self) -> dict:
        return self.outcomes()[-1]

    def session_state(self, session: str = "sess-1") -> dict:
        return json.loads((self.state_dir / "sessions" / f"{session}.json").read_text())


def assert_hit_contract(run: HookRun, event: str = "UserPromptSubmit") -> str:
    """Exactly one JSON object with hookSpecificOutput, exit 0; returns the context."""
    assert run.rc == 0
    assert set(run.output) == {"hookSpecificOutput"}
    out = run.output["hookSpecificOutput"]
    assert set(out) == {"hookEventName", "additionalContext"}
    assert out["hookEventName"] == event
    assert isinstance(out["additionalContext"], str) and out["additionalContext"]
    assert run.out.count(b"\n") == 0  # one object, nothing else
    return out["additionalContext"]


def assert_silent(run: HookRun) -> None:
    assert run.rc == 0, run.err
    assert run.out == b"", run.out


def run_together(hook: Hook, payloads: list[bytes]) -> list[tuple[int, bytes]]:
    """Start one hook per payload, give them all their stdin, then collect (exit code, stdout)."""
    procs = [
        subprocess.Popen(
            [str(HOOK)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=hook.env,
        )
        for _ in payloads
    ]
    for proc, payload in zip(procs, payloads, strict=True):  # every stdin first, so they overlap
        proc.stdin.write(payload)
        proc.stdin.close()
    done = []
    for proc in procs:
        with proc:
            out = proc.stdout.read()
            done.append((proc.wait(30), out))
    return done
