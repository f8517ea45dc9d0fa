"""The real agent clients, offline: where the pinned binaries live, and a fake model API that
records every request and streams a canned answer.

Claude Code talks to `ANTHROPIC_BASE_URL` (`POST /v1/messages?beta=true`, server-sent
events); Codex to a custom model provider (`POST /v1/responses`, `wire_api = "responses"`).
Both are served by one small standard-library server on loopback. A test reads back what the
model received (`FakeModelApi.turns`) and can script a tool call for the next answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
E2E = REPO / "e2e"
CLAUDE_VERSION = "2.1.197"
CODEX_VERSION = "0.171.0"


# -- the pinned binaries --------------------------------------------------------------
def client_bin(name: str) -> Path:
    """`e2e/node_modules/.bin/NAME` (`npm ci --prefix e2e`), or RELAY_TEST_<NAME>_BIN if set."""
    override = os.environ.get(f"RELAY_TEST_{name.upper()}_BIN")
    return Path(override) if override else E2E / "node_modules" / ".bin" / name


def missing_clients_message(missing: list[str]) -> str:
    paths = ", ".join(str(client_bin(name)) for name in missing)
    return (
        f"the pinned agent clients are not installed (no {paths}): run `npm ci --prefix e2e` "
        "(scripts/setup.sh --dev does it when node and npm are on the PATH)"
    )


def node_available() -> bool:
    return shutil.which("node") is not None and shutil.which("npm") is not None


# -- server-sent events -----------------------------------------------------------------
def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class Reply:
    """What the fake model answers: text, or one call of a tool (by the name the client gave it)."""

    text: str = "ok"
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    namespace: str | None = None  # Responses API: the namespace of a namespaced tool (Codex MCP)
    input_tokens: int = 10  # reported usage: a large figure makes a client compact its context


def anthropic_stream(model: str, reply: Reply, n: int) -> bytes:
    usage = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    message = {
        # Unique per answer: Claude Code groups a transcript into API rounds by message id,
        # and `/compact` refuses a conversation of fewer than two rounds.
        "id": f"msg_fake{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "usage": usage,
    }
    out = [_sse("message_start", {"type": "message_start", "message": message})]
    if reply.tool:
        block = {"type": "tool_use", "id": f"toolu_fake{n}", "name": reply.tool, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(reply.arguments)}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": reply.text}
        stop = "end_turn"
    out += [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": usage},
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(out)


def responses_stream(reply: Reply, n: int) -> bytes:
    if reply.tool:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": reply.tool,
            "arguments": json.dumps(reply.arguments),
            "status": "completed",
        }
        if reply.namespace:
            item["namespace"] = reply.namespace
    else:
        item = {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }
    usage = {
        "input_tokens": reply.input_tokens,
        "output_tokens": 1,
        "total_tokens": reply.input_tokens + 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    resp = {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": "fake", "output": []}
    events = [
        {"type": "response.created", "response": {**resp, "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": {**resp, "status": "completed", "output": [item], "usage": usage},
        },
    ]
    return b"".join(_sse(e["type"], e) for e in events)


# -- the fake model API -----------------------------------------------------------------
@dataclass
class Recorded:
    """One request the client sent to the model API."""

    method: str
    path: str
    body: Any  # parsed JSON, or the raw text when it is not JSON
    at: float  # time.monotonic() on arrival

    @property
    def is_turn(self) -> bool:
        """A model call (not a token count, not a model listing)."""
        if self.method != "POST" or "count_tokens" in self.path:
            return False
        return self.path.startswith(("/v1/messages", "/v1/responses"))


class FakeModelApi:
    """Answers every model call with a short stream and keeps every request.

    `respond(recorded) -> Reply | None` may script an answer (None: the default text).
    """

    def __init__(self, respond: Callable[[Recorded], Reply | None] | None = None) -> None:
        self.requests: list[Recorded] = []
        self.respond = respond
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    body: Any = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                rec = Recorded("POST", self.path, body, time.monotonic())
                with api._lock:
                    api.requests.append(rec)
                    n = len(api.requests)
                reply = (api.respond(rec) if api.respond and rec.is_turn else None) or Reply()
                if "count_tokens" in self.path:
                    self._send(b'{"input_tokens": 10}', "application/json")
                elif self.path.startswith("/v1/responses"):
                    self._send(responses_stream(reply, n), "text/event-stream")
                elif self.path.startswith("/v1/messages"):
                    model = body.get("model", "claude") if isinstance(body, dict) else "claude"
                    self._send(anthropic_stream(model, reply, n), "text/event-stream")
                else:
                    self._send(b"{}", "application/json")

            def do_GET(self) -> None:  # noqa: N802
                with api._lock:
                    api.requests.append(Recorded("GET", self.path, None, time.monotonic()))
                self._send(b'{"data": [], "object": "list", "models": []}', "application/json")

            def _send(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def turns(self, since: int = 0) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests[since:] if r.is_turn]

    def mark(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HungServer:
    """Accepts connections on loopback and never answers: a Relay server that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()
        for conn in self.held:
            conn.close()


def closed_port_url() -> str:
    """A loopback URL where nothing listens: a stopped Relay server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# -- what the clients sent and showed ----------------------------------------------------
def strings(obj: Any):
    """Every string inside a decoded JSON value."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from strings(value)


def count_in(obj: Any, needle: str) -> int:
    return sum(s.count(needle) for s in strings(obj))


def memory_tag(memory_id: str) -> str:
    return f'<relay-memory id="{memory_id}"'


_CONTEXT_TAIL = re.compile(
    r"(?:\n(?:The next \d+ records conflict[^\n]*\n)?<relay-memory [^>]*>\n.*?\n</relay-memory>)+",
    re.S,
)


def context_at(text: str, start: int) -> str:
    """The hook context that starts at `start` (its intro line): the intro and the records
    right after it, however the client surrounds it."""
    line_end = text.find("\n", start)
    if line_end == -1:
        return text[start:]
    tail = _CONTEXT_TAIL.match(text, line_end)
    return text[start : tail.end() if tail else line_end]


@dataclass
class Turn:
    """One run of a client: what it printed, what the model received, what the hook logged."""

    client: str
    step: str
    prompt: str
    run: subprocess.CompletedProcess
    wall_s: float
    calls: list[Recorded]  # model calls made during the run
    outcomes: list[dict]  # Relay hook outcome-log lines written during the run
    session_id: str
    result: dict | None = None  # Claude Code's JSON result
    shown: list[dict] = field(default_factory=list)  # what the client showed about hooks

    def describe(self) -> str:
        out = (self.run.stdout or "")[-1500:]
        err = (self.run.stderr or "")[-1500:]
        return (
            f"{self.client} step {self.step!r} (prompt {self.prompt!r}), "
            f"exit {self.run.returncode}, {self.wall_s:.1f} s, {len(self.calls)} model call(s), "
            "hook outcomes "
            f"{[(o.get('event'), o.get('outcome'), o.get('reason')) for o in self.outcomes]}\n"
            f"stdout: {out}\nstderr: {err}"
        )

    def prompt_outcome(self) -> dict:
        found = [o for o in self.outcomes if o.get("event") == "prompt"]
        assert found, f"the Relay hook did not run on the prompt\n{self.describe()}"
        return found[-1]


def read_jsonl(path: Path, skip: int = 0) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines[skip:] if line.strip()]


def line_count(path: Path) -> int:
    try:
        return len(path.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


HOOK_STDIN_LOG = ".relay-test-hook-stdin.jsonl"
RECORDER = '{ cat; echo; } >> "$HOME/' + HOOK_STDIN_LOG + '"'


def add_stdin_recorder(hooks_file: Path) -> None:
    """Register, beside Relay's hooks, a command that appends each hook's stdin to a file in
    HOME: what the client really sends (the agents run all hooks of an event, in parallel)."""
    doc = json.loads(hooks_file.read_text())
    for event in ("UserPromptSubmit", "SessionStart"):
        doc["hooks"][event].append(
            {"hooks": [{"type": "command", "command": RECORDER, "timeout": 5}]}
        )
    hooks_file.write_text(json.dumps(doc, indent=2))


class AgentClient:
    """A pinned client binary driven non-interactively in a temporary HOME."""

    name = ""  # `relay install --agent NAME`
    binary = ""  # e2e/node_modules/.bin/NAME
    version = ""

    def __init__(self, api: FakeModelApi) -> None:
        self.api = api
        self.bin = client_bin(self.binary)

    @property
    def label(self) -> str:
        return f"{type(self).__name__.replace('Client', '')} {self.version}"

    def base_env(self, home: Path, extra: dict[str, str] | None) -> dict[str, str]:
        node = shutil.which("node")
        path = "/usr/bin:/bin" if node is None else f"{Path(node).parent}:/usr/bin:/bin"
        env = {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1"}
        env.update(extra or {})
        return env

    def hooks_file(self, home: Path) -> Path:
        raise NotImplementedError

    def prepare(self, home: Path) -> None:
        """After `relay install`: point the client at the fake model API."""

    def command(self, prompt: str, session: str | None, args: tuple[str, ...]) -> list[str]:
        raise NotImplementedError

    def session_of(self, run: subprocess.CompletedProcess, result: dict | None) -> str:
        raise NotImplementedError

    def shown(self, home: Path, before: dict, run: subprocess.CompletedProcess) -> list[dict]:
        """What the client showed the user about hooks during the run."""
        raise NotImplementedError

    def snapshot(self, home: Path) -> dict:
        return {}

    def result_of(self, run: subprocess.CompletedProcess) -> dict | None:
        return None

    def run(
        self,
        home: Path,
        step: str,
        prompt: str,
        session: str | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        timeout: float = 180,
    ) -> Turn:
        log = home / ".relay/state/outcomes.jsonl"
        seen_log = line_count(log)
        before = self.snapshot(home)
        mark = self.api.mark()
        started = time.monotonic()
        run = subprocess.run(
            [str(self.bin), *self.command(prompt, session, args)],
            env=self.base_env(home, env),
            cwd=home / "work",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        wall = time.monotonic() - started
        result = self.result_of(run)
        turn = Turn(
            client=self.label,
            step=step,
            prompt=prompt,
            run=run,
            wall_s=wall,
            calls=self.api.turns(mark),
            outcomes=read_jsonl(log, seen_log),
            session_id=self.session_of(run, result),
            result=result,
        )
        turn.shown = self.shown(home, before, run)
        return turn

    # what the model received, per client
    def turn_items(self, body: dict, prompt: str) -> list | None:
        """The items of the request from the user's prompt on (the new turn), or None."""
        raise NotImplementedError

    def contexts(
        self, body: dict, prompt: str, intro: str, event: str = "UserPromptSubmit"
    ) -> list[str]:
        """The hook contexts (starting with `intro`) in the new turn (SessionStart: anywhere in
        the request), each checked to be shown to the model the way this client version was
        observed to show it: AssertionError naming the change if not."""
        raise NotImplementedError

    def mcp_list(self, home: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bin), "mcp", "list"],
            env=self.base_env(home, None),
            cwd=home / "work",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _claude_text_blocks(message: dict) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    ]


class ClaudeClient(AgentClient):
    name = "claude-code"
    binary = "claude"
    version = CLAUDE_VERSION
    # Observed with 2.1.197: a UserPromptSubmit hook's additionalContext reaches the model as
    # this prefix + the context, inside a message of this role placed after the user's prompt.
    WRAPPERS = {
        "UserPromptSubmit": "UserPromptSubmit hook additional context: ",
        "SessionStart": "SessionStart hook additional context: ",
    }
    CONTEXT_ROLE = "system"
    SHOWN_OK = ("hook_success", "hook_additional_context", "hook_system_message")

    def base_env(self, home: Path, extra: dict[str, str] | None) -> dict[str, str]:
        env = {
            "ANTHROPIC_API_KEY": "sk-ant-test-offline",
            "ANTHROPIC_BASE_URL": self.api.url,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        env.update(extra or {})
        return super().base_env(home, env)

    def hooks_file(self, home: Path) -> Path:
        return home / ".claude/settings.json"

    def command(self, prompt: str, session: str | None, args: tuple[str, ...]) -> list[str]:
        resume = ["--resume", session] if session else []
        return ["-p", prompt, *resume, "--output-format", "json", *args]

    def session_of(self, run: subprocess.CompletedProcess, result: dict | None) -> str:
        return str((result or {}).get("session_id", ""))

    def result_of(self, run: subprocess.CompletedProcess) -> dict | None:
        """The `--output-format json` result (with time_to_request_ms and ttft_ms)."""
        try:
            return json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def transcripts(self, home: Path) -> list[Path]:
        return sorted((home / ".claude/projects").glob("*/*.jsonl"))

    def snapshot(self, home: Path) -> dict:
        return {str(p): line_count(p) for p in self.transcripts(home)}

    def shown(self, home: Path, before: dict, run: subprocess.CompletedProcess) -> list[dict]:
        """Hook attachments the run added to the transcripts: what the UI renders."""
        out = []
        for path in self.transcripts(home):
            for entry in read_jsonl(path, before.get(str(path), 0)):
                att = entry.get("attachment")
                if isinstance(att, dict) and str(att.get("type", "")).startswith("hook_"):
                    out.append(att)
        return out

    def turn_items(self, body: dict, prompt: str) -> list | None:
        messages = body.get("messages") or []
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m.get("role") == "user" and any(t.strip() == prompt for t in _claude_text_blocks(m)):
                return messages[i:]
        return None

    def contexts(
        self, body: dict, prompt: str, intro: str, event: str = "UserPromptSubmit"
    ) -> list[str]:
        items = self.turn_items(body, prompt)
        assert items is not None, f"{self.label}: {prompt!r} is not a user turn of the request"
        if event == "SessionStart":
            items = body.get("messages") or []  # injected when the session started
        wrapper = self.WRAPPERS[event]
        found = []
        for message in items:
            for text in _claude_text_blocks(message):
                start = text.find(intro)
                while start != -1:
                    shown_as = text[max(0, start - len(wrapper)) : start]
                    role = message.get("role")
                    assert shown_as == wrapper and role == self.CONTEXT_ROLE, (
                        f"{self.label} changed how it shows a {event} hook's context to the "
                        f"model: pinned {wrapper!r} + the context in a {self.CONTEXT_ROLE!r}-role "
                        f"message; now {shown_as!r} + the context in a {role!r}-role message: "
                        f"{text[max(0, start - 200) : start + 80]!r}"
                    )
                    found.append(context_at(text, start))
                    start = text.find(intro, start + 1)
        return found


class CodexClient(AgentClient):
    name = "codex"
    binary = "codex"
    version = CODEX_VERSION
    # Observed with 0.171.0: a hook's additionalContext reaches the model as a message of this
    # role holding exactly the context, after the user's prompt.
    CONTEXT_ROLE = "developer"
    # `codex exec` prints one line per hook run on stderr: "hook: EVENT" when it starts and
    # "hook: EVENT Completed" (or "Failed", ...) when it ends.
    HOOK_LINE = "hook: "
    COMPACT_LIMIT = 20000  # model_auto_compact_token_limit for the suite's runs

    def base_env(self, home: Path, extra: dict[str, str] | None) -> dict[str, str]:
        env = {"RELAY_TEST_FAKE_KEY": "sk-test-offline"}
        env.update(extra or {})
        return super().base_env(home, env)

    def hooks_file(self, home: Path) -> Path:
        return home / ".codex/hooks.json"

    def prepare(self, home: Path) -> None:
        config = home / ".codex/config.toml"
        config.write_text(
            'model = "fake"\nmodel_provider = "fake"\n'
            + config.read_text()
            + f'\n[model_providers.fake]\nname = "fake"\nbase_url = "{self.api.url}/v1"\n'
            'wire_api = "responses"\nsupports_websockets = false\nenv_key = "RELAY_TEST_FAKE_KEY"\n'
        )

    def command(self, prompt: str, session: str | None, args: tuple[str, ...]) -> list[str]:
        # The bypass flag stands in for the user trusting the two hooks once with /hooks.
        common = [
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            "-c",
            f"model_auto_compact_token_limit={self.COMPACT_LIMIT}",
            *args,
        ]
        if session:
            return ["exec", "resume", *common, session, prompt]
        return ["exec", *common, prompt]

    def session_of(self, run: subprocess.CompletedProcess, result: dict | None) -> str:
        for line in (run.stderr or "").splitlines():
            if line.startswith("session id: "):
                return line.split(": ", 1)[1].strip()
        return ""

    def shown(self, home: Path, before: dict, run: subprocess.CompletedProcess) -> list[dict]:
        out = []
        for line in (run.stderr or "").splitlines():
            if line.startswith(self.HOOK_LINE):
                parts = line[len(self.HOOK_LINE) :].split()
                out.append(
                    {
                        "event": parts[0] if parts else "",
                        "status": " ".join(parts[1:]),
                        "line": line,
                    }
                )
        return out

    def turn_items(self, body: dict, prompt: str) -> list | None:
        items = body.get("input") or []
        for i in range(len(items) - 1, -1, -1):
            it = items[i]
            if it.get("role") == "user" and any(
                isinstance(c, dict) and c.get("text", "").strip() == prompt
                for c in it.get("content") or []
            ):
                return items[i:]
        return None

    def contexts(
        self, body: dict, prompt: str, intro: str, event: str = "UserPromptSubmit"
    ) -> list[str]:
        items = self.turn_items(body, prompt)
        assert items is not None, f"{self.label}: {prompt!r} is not a user turn of the request"
        if event == "SessionStart":
            items = body.get("input") or []  # injected when the session started
        found = []
        for it in items:
            for c in it.get("content") or []:
                text = c.get("text", "") if isinstance(c, dict) else ""
                if intro not in text:
                    continue
                exact = text.startswith(intro) and context_at(text, 0) == text
                assert exact and it.get("role") == self.CONTEXT_ROLE, (
                    f"{self.label} changed how it shows a {event} hook's context to the model: "
                    f"pinned: a {self.CONTEXT_ROLE!r}-role message holding exactly the context; "
                    f"now a {it.get('role')!r}-role message: {text[: text.find(intro) + 80]!r}"
                )
                found.append(text)
        return found
