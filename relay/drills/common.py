"""What every drill shares: `relay serve` as a child process, a tiny HTTP client, figures."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`relay serve` on loopback; its output goes to `log` (the secrets drill greps it)."""

    def __init__(
        self, db: str, log: Path, env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        self.db, self.log = db, log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RELAY_")},
            "RELAY_DB": db,
            "RELAY_PORT": str(self.port),
            "RELAY_LOG_LEVEL": "warning",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.admin_key = ""

    def start(self, timeout: float = 120.0) -> Served:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "relay"), "serve", "--org", "drill"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("relay serve exited:\n" + self.log.read_text()[offset:])
            try:
                status, _, _ = request(self.url, "GET", "/healthz", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self.kill()
            raise RuntimeError("relay serve did not become healthy")
        found = re.search(r"(relay_[0-9a-f]+_\S+)", self.log.read_text()[offset:])
        if found and not self.admin_key:
            self.admin_key = found.group(1)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """kill -9: no shutdown hook, no flush, nothing graceful."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_kib(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0


def request(
    url: str,
    method: str,
    path: str,
    key: str | None = None,
    body: Any = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], Any]:
    """One request on a fresh connection: (status, headers, parsed JSON or None)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        parsed = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed
    finally:
        conn.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def is_error_shape(body: Any, status: int) -> bool:
    """The one error shape every endpoint answers with."""
    if not isinstance(body, dict) or set(body) != {"error"}:
        return False
    err = body["error"]
    return (
        isinstance(err, dict)
        and {"code", "message", "status"} <= set(err)
        and isinstance(err["code"], str)
        and isinstance(err["message"], str)
        and err["status"] == status
    )


def echo_figures(title: str, figures: dict[str, Any]) -> None:
    print(f"== {title}")
    for name, value in figures.items():
        print(f"  {name}: {value}")
