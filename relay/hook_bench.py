"""`relay bench hook`: the recall hook's whole-process wall time, its floors, and its faults.

Latency, measured side by side in one run and interleaved round by round so
load on the machine hits every series alike, each from spawn to exit:
  hit_ms           the real `relay-hook` on prompts that get memories injected
  skip_ms          the real `relay-hook` on a prompt its gates skip ("ok")
  floor_curl_ms    bare `curl` sending the same search request
  floor_python_ms  a minimal standard-library Python client sending the same request
  server_search_ms the server's own `took_ms` for the hook's hits
  clock_over_ms    the hook's logged `ms.total` minus its wall time, on every hook run: the
                   budget it thinks it spent beyond what it did (at most /proc's 10 ms
                   tick; a start dated from the wrong reading once made it the imports' time)
Faults: the fault kinds of ../shared/tools/hook_faults.py, served by tiny loopback
servers here; a run is ok when the hook exits 0, prints nothing (or, for 401/403,
only a user-facing systemMessage) and ends within DEADLINE_MS + 50 ms.

The hook's modules are byte-compiled first: an installed package ships .pyc
files, while PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise make
every run recompile them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.hook_stats import percentiles

ON_TIME_SLACK_MS = 50
HOOK = Path(sys.executable).parent / "relay-hook"
BENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "bench"
FAULT_PROMPT = "use the same database migration convention as last time for the orders table"

# The floor: what any Python hook must pay to send this request and read the answer.
FLOOR_CLIENT = r"""
import json, os, socket, sys
prompt = json.loads(sys.stdin.buffer.read())["prompt"]
host, port = os.environ["RELAY_URL"].removeprefix("http://").rstrip("/").rsplit(":", 1)
body = json.dumps({"query": prompt, "k": 6, "deadline_ms": 300}).encode()
s = socket.create_connection((host, int(port)), timeout=2)
s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
          % (host.encode(), os.environ["RELAY_API_KEY"].encode(), len(body)) + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
print(len(json.loads(data.partition(b"\r\n\r\n")[2])["results"]))
"""


# -- fault servers ----------------------------------------------------------------
class FaultServer:
    """A loopback server that reads one request per connection and then misbehaves."""

    def __init__(self, behaviour: Callable[[socket.socket, threading.Event], None]) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.behaviour(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _reply(status: bytes, body: bytes, length: int | None = None):
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        n = len(body) if length is None else length
        conn.sendall(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + body
        )
        stop.wait(2)

    return behave


def _hung(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


def _slow_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    for _ in range(100):
        conn.sendall(b" ")
        if stop.wait(0.1):
            return


def _oversized(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\r\n"
    )
    conn.sendall(b'{"results": [' + b'{"text": "' + b"x" * 1000 + b'"},' * 2000)
    while not stop.is_set():
        conn.sendall(b'{"text": "' + b"x" * 60000 + b'"},')


FAULTS: dict[str, Callable[[socket.socket, threading.Event], None]] = {
    "hung": _hung,
    "slow_body": _slow_body,
    "oversized": _oversized,
    "invalid_json": _reply(b"200 OK", b"<html>definitely not json</html>"),
    "truncated_json": _reply(b"200 OK", b'{"results": [{"id": "m1", "text": "half', length=500),
    "wrong_shape": _reply(b"200 OK", b'{"unexpected": [1, 2, 3], "results": "nope"}'),
    "http_500": _reply(b"500 Internal Server Error", b'{"error": "boom"}'),
    "http_401": _reply(b"401 Unauthorized", b'{"error": "bad key"}'),
    "http_403": _reply(b"403 Forbidden", b'{"error": "forbidden"}'),
}
FAULT_KINDS = (*FAULTS, "refused", "unresolvable")


# -- running processes ------------------------------------------------------------
def hook_env(home: str, url: str, key: str, deadline_ms: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(
        HOME=home,
        RELAY_URL=url,
        RELAY_API_KEY=key,
        RELAY_STATE_DIR=os.path.join(home, "state"),
        RELAY_DEADLINE_MS=str(deadline_ms),
    )
    return env


def timed(cmd: list[str], stdin: bytes, env: dict[str, str]) -> tuple[int, bytes, float]:
    """(exit code, stdout, wall ms from spawn to exit)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=60)
    return proc.returncode, proc.stdout, (time.perf_counter() - t) * 1000


def quiet(out: bytes) -> bool:
    """Nothing for the model: empty, or one object carrying only a user-facing systemMessage."""
    if not out.strip():
        return True
    try:
        obj = json.loads(out)
    except ValueError:
        return False
    return isinstance(obj, dict) and set(obj) <= {"systemMessage", "suppressOutput"}


def prompt_payload(prompt: str, session: str, cwd: str) -> bytes:
    return json.dumps(
        {
            "session_id": session,
            "prompt_id": f"{session}-p1",
            "transcript_path": os.path.join(cwd, "transcript.jsonl"),
            "cwd": cwd,
            "hook_event_name": "UserPromptSubmit",
            "permission_mode": "default",
            "prompt": prompt,
        }
    ).encode()


def compile_hook() -> None:
    import compileall

    compileall.compile_dir(str(Path(__file__).parent / "hook"), quiet=1)
    compileall.compile_file(str(Path(__file__).parent / "__init__.py"), quiet=1)


def _last_entry(home: str) -> dict[str, Any] | None:
    """The hook's outcome log's last line, or None."""
    try:
        with open(os.path.join(home, "state", "outcomes.jsonl")) as fh:
            entry = json.loads(fh.read().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return entry if isinstance(entry, dict) else None


def _last_log(home: str) -> str:
    """The hook's own account of a run (phases in ms), to tell its time from the machine's."""
    entry = _last_entry(home)
    if entry is None:
        return "no log line"
    return f"outcome {entry.get('outcome')}, hook phases {entry.get('ms')}"


def _clock_over(home: str, wall_ms: float, into: list[float]) -> None:
    """Add how much longer the hook's last run logged itself than it ran (`clock_over_ms`)."""
    entry = _last_entry(home)
    total = (entry or {}).get("ms", {}).get("total")
    if isinstance(total, int | float):
        into.append(total - wall_ms)


def run_faults(
    runs: int, deadline_ms: int, hook_cmd: list[str], progress: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]]:
    """Every fault kind `runs` times, each run with a fresh HOME and session."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="relay-bench-faults-") as tmp:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{probe.getsockname()[1]}"
        probe.close()
        for kind in FAULT_KINDS:
            server = FaultServer(FAULTS[kind]) if kind in FAULTS else None
            url = {"refused": refused_url, "unresolvable": "http://relay.invalid:8080"}.get(
                kind, server.url if server else ""
            )
            ok, worst = 0, 0.0
            try:
                for n in range(runs):
                    home = tempfile.mkdtemp(dir=tmp)
                    env = hook_env(home, url, "relay_bench_0123456789", deadline_ms)
                    payload = prompt_payload(FAULT_PROMPT, f"{kind}-{n}", home)
                    rc, out, ms = timed(hook_cmd, payload, env)
                    worst = max(worst, ms)
                    good = rc == 0 and quiet(out) and ms <= deadline_ms + ON_TIME_SLACK_MS
                    ok += good
                    if not good and progress:
                        progress(f"fault {kind} run {n}: exit {rc}, {ms:.0f} ms, {_last_log(home)}")
            finally:
                if server:
                    server.close()
            results[kind] = {"runs": runs, "ok": ok, "max_ms": round(worst, 1)}
            if progress:
                progress(f"fault {kind}: {ok}/{runs} ok, max {worst:.0f} ms")
    return results


# -- latency against a server ----------------------------------------------------
def run_latency(
    url: str,
    key: str,
    queries: list[str],
    runs: int,
    deadline_ms: int,
    hook_cmd: list[str],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Hook hit and skip, curl and Python floors, interleaved; server time from the hook's log."""
    hit, skip, floor_curl, floor_py, no_match = [], [], [], [], 0
    clock_over: list[float] = []
    curl = shutil.which("curl")
    with tempfile.TemporaryDirectory(prefix="relay-bench-hook-") as home:
        env = hook_env(home, url, key, deadline_ms)
        floor_script = os.path.join(home, "floor_client.py")
        Path(floor_script).write_text(FLOOR_CLIENT)
        for i in range(runs):
            query = queries[i % len(queries)]
            payload = prompt_payload(query, f"bench-{i}", home)
            body = json.dumps({"query": query, "k": 6, "deadline_ms": 300}).encode()
            rc, out, ms = timed(hook_cmd, payload, env)
            _clock_over(home, ms, clock_over)
            if rc == 0 and out.strip():
                hit.append(ms)
            else:
                no_match += 1
            _, _, ms = timed(hook_cmd, prompt_payload("ok", f"skip-{i}", home), env)
            _clock_over(home, ms, clock_over)
            skip.append(ms)
            if curl:
                _, _, ms = timed(
                    [
                        curl,
                        "-s",
                        "-X",
                        "POST",
                        f"{url}/v1/search",
                        "-H",
                        f"Authorization: Bearer {key}",
                        "-H",
                        "Content-Type: application/json",
                        "--data-binary",
                        "@-",
                    ],
                    body,
                    env,
                )
                floor_curl.append(ms)
            _, _, ms = timed([sys.executable, floor_script], payload, env)
            floor_py.append(ms)
            if progress and (i + 1) % 50 == 0:
                progress(f"latency: {i + 1}/{runs} rounds")
        server_ms = []
        outcomes: dict[str, int] = {}
        with open(os.path.join(home, "state", "outcomes.jsonl")) as fh:
            for line in fh:
                entry = json.loads(line)
                if entry.get("reason") != "short_prompt":  # the skip series
                    outcomes[entry["outcome"]] = outcomes.get(entry["outcome"], 0) + 1
                if entry.get("outcome") == "hit" and isinstance(
                    entry.get("server_ms"), int | float
                ):
                    server_ms.append(float(entry["server_ms"]))
    return {
        "hit_ms": percentiles(hit),
        "skip_ms": percentiles(skip),
        "floor_curl_ms": percentiles(floor_curl),
        "floor_python_ms": percentiles(floor_py),
        "server_search_ms": percentiles(server_ms),
        "clock_over_ms": {**percentiles(clock_over), "max": round(max(clock_over, default=0), 2)},
        "_hits": len(hit),
        "_misses": no_match,
        "_outcomes": outcomes,
    }


# -- a local server with N memories -----------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`relay serve` on loopback over `memories` bench memories.

    The database is built in a temporary folder, or at `db` where it is kept and,
    on later runs, reused (its "bench" organisation gets a fresh read key).
    """

    def __init__(
        self, memories: int, progress: Callable[[str], None] | None, db: str | None
    ) -> None:
        from relay import bench_search
        from relay.auth import mint_key
        from relay.store import open_store

        self.tmp = None
        if db is None:
            self.tmp = tempfile.TemporaryDirectory(prefix="relay-bench-hook-db-")
            db = str(Path(self.tmp.name) / "bench.db")
        store = open_store(db)
        try:
            bench_org = [o for o in store.list_orgs() if o.name == "bench"]
            if bench_org:
                if progress:
                    progress(f"reusing the bench organisation in {db}")
                minted = mint_key(
                    store, bench_org[0].id, "bench-hook", frozenset({"memory:read"}), frozenset()
                )
                self.key = minted.secret
            else:
                from relay.embedding import load_embedder

                _, self.key = bench_search.populate(
                    store, load_embedder("onnx", 1), memories, bench_search.BENCH, progress
                )
        finally:
            store.close()
        self.queries = bench_queries()
        port = _free_port()
        env = {
            **os.environ,
            "RELAY_DB": db,
            "RELAY_PORT": str(port),
            "RELAY_LOG_LEVEL": "warning",
            "RELAY_CACHE_ENTRIES": "0",  # every request searches: no floor gets cached answers
        }
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "relay"), "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}"
        bench_search.wait_healthy(port)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.tmp is not None:
            self.tmp.cleanup()


def bench_queries(bench: Path = BENCH) -> list[str]:
    """Developer prompts and rule questions from the shared bench folder, as hook prompts."""
    out = []
    for name in ("cursorrules_bullets", "coding_prompts"):
        path = bench / name / "queries.jsonl"
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                out += [json.loads(line)["query"] for line in fh if line.strip()]
    return out or [FAULT_PROMPT]


def hitting_queries(url: str, key: str, queries: list[str], want: int = 100) -> list[str]:
    """Queries the server answers with at least one result: the hit series needs hits.

    The server abstains when nothing is relevant enough; those prompts would
    measure `no_match`, which the skip and no-match paths already cover.
    """
    import http.client

    host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
    found = []
    for query in queries:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            body = json.dumps({"query": query, "k": 6, "deadline_ms": 1000})
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            conn.request("POST", "/v1/search", body, headers)
            response = conn.getresponse()
            if response.status == 200 and json.loads(response.read()).get("results"):
                found.append(query)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
        if len(found) >= want:
            break
    return found or queries


def warm_up(
    url: str,
    key: str,
    queries: list[str],
    hook_cmd: list[str],
    deadline_ms: int,
    avoid: set[str] | frozenset[str] = frozenset(),
) -> None:
    """A few hook runs first: the model, page cache and the first connections. Each prompt is
    one of `queries` reworded, and none is in `avoid` (the prompts measured after): asked
    as measured, it would be answered from the server's cache when measured."""
    with tempfile.TemporaryDirectory(prefix="relay-bench-warm-") as home:
        env = hook_env(home, url, key, deadline_ms)
        prompts = [f"{q} (warm-up)" for q in queries[:20]]
        for i, prompt in enumerate(p for p in prompts if p not in avoid):
            timed(hook_cmd, prompt_payload(prompt, f"warm-{i}", home), env)


def run(
    memories: int | None,
    url: str | None,
    key: str | None,
    runs: int,
    fault_runs: int,
    deadline_ms: int,
    progress: Callable[[str], None] | None = None,
    db: str | None = None,
) -> dict[str, Any]:
    compile_hook()
    hook_cmd = [str(HOOK)]
    if url is None and memories is None:
        memories = 10_000
    result: dict[str, Any] = {"memories": memories}
    if runs:
        server = None
        if url is None:
            if progress:
                progress(f"building a database of {memories} memories and starting relay serve")
            server = LocalServer(memories or 10_000, progress, db)
            url, key, queries = server.url, server.key, server.queries
        else:
            queries = bench_queries()
        try:
            queries = [q for q in queries if len(q) >= 20]
            if url.startswith("http://"):
                queries = hitting_queries(url, key or "", queries)
                if progress:
                    progress(f"{len(queries)} prompts the server answers")
            warm_up(url, key or "", queries, hook_cmd, deadline_ms, set(queries))
            result.update(
                run_latency(url, key or "", queries, runs, deadline_ms, hook_cmd, progress)
            )
        finally:
            if server is not None:
                server.close()
    if fault_runs:
        result["faults"] = run_faults(fault_runs, deadline_ms, hook_cmd, progress)
    return result


def public(result: dict[str, Any]) -> dict[str, Any]:
    """Exactly the schema of `--json`."""
    keys = (
        "memories",
        "hit_ms",
        "skip_ms",
        "floor_curl_ms",
        "floor_python_ms",
        "server_search_ms",
        "clock_over_ms",
    )
    out = {k: result[k] for k in keys if k in result}
    out["faults"] = result.get("faults", {})
    return out


def render(result: dict[str, Any], deadline_ms: int) -> str:
    lines = []
    if "hit_ms" in result:
        held = result["memories"]  # None: a server given by --url, whose size is its own
        lines.append(f"memories: {held if held is not None else 'those of the server given'}")
        lines.append(f"{'series (ms, spawn to exit)':<30}{'p50':>9}{'p95':>9}{'p99':>9}")
        for name in ("hit_ms", "skip_ms", "floor_curl_ms", "floor_python_ms", "server_search_ms"):
            p = result[name]
            lines.append(f"{name:<30}{p['p50']:>9.1f}{p['p95']:>9.1f}{p['p99']:>9.1f}")
        floor, server, hit = (
            result["floor_python_ms"]["p50"],
            result["server_search_ms"]["p50"],
            result["hit_ms"]["p50"],
        )
        lines.append(
            f"hits {result['_hits']}, not hits {result['_misses']}; "
            "hook hit p50 / python floor p50 = "
            f"{hit / floor if floor else 0:.2f}; target hit p50 <= 1.3 x floor + server = "
            f"{1.3 * floor + server:.1f}"
        )
        lines.append(f"hook outcomes on the hit series: {result['_outcomes']}")
        over = result["clock_over_ms"]
        lines.append(
            f"hook's logged time minus its wall time (ms): p50 {over['p50']:.1f},"
            f" p99 {over['p99']:.1f}, max {over['max']:.1f} (within /proc's 10 ms tick: <= 10)"
        )
    if result.get("faults"):
        lines.append(f"faults (ok = exit 0, quiet, within {deadline_ms} + {ON_TIME_SLACK_MS} ms)")
        for kind, f in result["faults"].items():
            lines.append(f"  {kind:<16} runs={f['runs']} ok={f['ok']} max_ms={f['max_ms']:.0f}")
    return "\n".join(lines)
