"""The real agents, offline: Claude Code and Codex run what `relay install` registered, and the
recalled memory reaches the model request (a local fake Messages / Responses API records it).

Skipped unless the binaries are given, e.g. after `npm install @anthropic-ai/claude-code
@openai/codex` in a scratch folder:

    RELAY_TEST_CLAUDE_BIN=.../node_modules/.bin/claude \
    RELAY_TEST_CODEX_BIN=.../node_modules/.bin/codex  pytest tests/test_real_clients.py
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from integration_support import relay, remember, start_module_server, stop_server

CLAUDE = os.environ.get("RELAY_TEST_CLAUDE_BIN")
CODEX = os.environ.get("RELAY_TEST_CODEX_BIN")
FACT = "Staging is the blue cluster; production is the green cluster."
PROMPT = "which cluster do we deploy staging to?"


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _anthropic_stream(model: str) -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model}
    usage = {"input_tokens": 10, "output_tokens": 1}
    return b"".join(
        [
            _sse(
                "message_start",
                {
                    "type": "message_start",
                    "message": {**message, "content": [], "stop_reason": None, "usage": usage},
                },
            ),
            _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "ok"},
                },
            ),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _sse(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
            ),
            _sse("message_stop", {"type": "message_stop"}),
        ]
    )


def _responses_stream() -> bytes:
    item = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "ok", "annotations": []}],
    }
    usage = {
        "input_tokens": 10,
        "output_tokens": 1,
        "total_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    resp = {"id": "resp_1", "object": "response", "created_at": 0, "model": "fake", "output": []}
    events = [
        {"type": "response.created", "response": {**resp, "status": "in_progress"}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": {**resp, "status": "completed", "output": [item], "usage": usage},
        },
    ]
    return b"".join(_sse(e["type"], e) for e in events)


class FakeModelApi:
    """Answers every POST with a short streamed reply and keeps every request body."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                api.bodies.append(body.decode("utf-8", "replace"))
                if "count_tokens" in self.path:
                    self._send(b'{"input_tokens": 10}', "application/json")
                elif self.path.startswith("/v1/responses"):
                    self._send(_responses_stream(), "text/event-stream")
                else:
                    model = json.loads(body or b"{}").get("model", "claude")
                    self._send(_anthropic_stream(model), "text/event-stream")

            def do_GET(self) -> None:  # noqa: N802
                self._send(b'{"data": [], "object": "list"}', "application/json")

            def _send(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (CLAUDE or CODEX):
        pytest.skip("set RELAY_TEST_CLAUDE_BIN and/or RELAY_TEST_CODEX_BIN to run the real agents")
    live = start_module_server(tmp_path_factory, "real-clients")
    remember(live.url, live.admin_key, body=FACT, title="Clusters", source="team/infra")
    yield live
    stop_server(live)


@pytest.fixture
def model_api():
    api = FakeModelApi()
    yield api
    api.close()


def installed_home(tmp_path: Path, server, agent: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    done = relay(home, "install", "--url", server.url, "--key", server.admin_key, "--agent", agent)
    assert done.returncode == 0, done.stderr
    return home


def assert_recalled(bodies: list[str]) -> None:
    joined = "\n".join(bodies)
    assert "Relay team memory, recalled for this prompt" in joined
    assert 'source=\\"team/infra\\"' in joined and "blue cluster" in joined


@pytest.mark.skipif(not CLAUDE, reason="RELAY_TEST_CLAUDE_BIN not set")
def test_claude_code_runs_the_installed_hook(tmp_path, server, model_api):
    home = installed_home(tmp_path, server, "claude-code")
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_BASE_URL": model_api.url,
    }
    run = subprocess.run(
        [CLAUDE, "-p", PROMPT, "--output-format", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert_recalled(model_api.bodies)
    listed = subprocess.run(
        [CLAUDE, "mcp", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "relay:" in listed.stdout and "Connected" in listed.stdout, listed.stdout


@pytest.mark.skipif(not CODEX, reason="RELAY_TEST_CODEX_BIN not set")
def test_codex_runs_the_installed_hook(tmp_path, server, model_api):
    home = installed_home(tmp_path, server, "codex")
    config = home / ".codex/config.toml"
    provider = (
        'model = "fake"\nmodel_provider = "fake"\n'
        + config.read_text()
        + f'\n[model_providers.fake]\nname = "fake"\nbase_url = "{model_api.url}/v1"\n'
        'wire_api = "responses"\nsupports_websockets = false\nenv_key = "FAKE_KEY"\n'
    )
    config.write_text(provider)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "FAKE_KEY": "x"}
    # The flag stands in for the user trusting the hooks with /hooks, once.
    run = subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", PROMPT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert_recalled(model_api.bodies)
