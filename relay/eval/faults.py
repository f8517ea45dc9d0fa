"""`relay eval faults`: the replay, through the real hook and a real server, while things break.

Network faults are injected by a loopback proxy in front of the real server: every
other request it receives is answered with the fault (the behaviours of
`relay bench hook`: a hung connection, a body that trickles, 50 MB of content,
a non-JSON body) or, for a denied key, forwarded with a key the server refuses;
the rest are forwarded untouched, so a drill also shows recovery. The proxy reads
each request's query, so every turn is tied to what really happened to its request.
Then the server is killed (SIGKILL) mid-conversation and restarted on its port.
Then, on the real server with warm caches: a memory the hook just injected is
deleted, a key that just got answers is revoked, and a session is compacted
mid-conversation (SessionStart, source compact).

Per drill: `turns` hook runs; `on_time`: wall time, spawn to exit, within the
deadline + 50 ms; `injected_from_failure`: runs that injected anything from a failed
response (for deletion: the deleted record served again; for revocation: anything
served to the revoked key; for compaction: a record revision injected twice since
the compaction); `logged_correctly`: runs whose outcome-log line names what happened
(a forwarded request may be a `timeout` only if the real answer came after the cut-off).
A drill whose fault never reached the hook (no run, or none its fault met) tested nothing.
The breaker's cool-down is 2 s in the drills (default 30 s), so recovery shows
within a short conversation.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.eval.conversations import MEMORY_CLASSES, Conversation
from relay.eval.harness import Hook, OrgKeys, Progress, Run, Server
from relay.eval.replay import injected_records, shown_whole
from relay.hook.run import QUERY_MAX_CHARS
from relay.hook_bench import FAULTS, ON_TIME_SLACK_MS, FaultServer, quiet
from relay.hook_stats import percentiles

NETWORK_FAULTS = {  # drill -> (proxy behaviour, the outcome the log must name)
    "hung": ("hung", "timeout"),
    "slow_body": ("slow_body", "timeout"),
    "denied_key": ("denied_key", "unauthorized"),
    "oversized": ("oversized", "invalid_response"),
    "invalid_json": ("invalid_json", "invalid_response"),
}
KINDS = (*NETWORK_FAULTS, "server_killed", "deletion", "revocation", "compaction")
# Each drill reads with a key of its own (`OrgKeys.read[kind]`): the same prompts replay in
# every drill, and with one key the later drills were served the earlier ones' cached answers.
DRILL_ENV = {"RELAY_BREAKER_COOLDOWN_S": "2"}
NO_REQUEST = ("skipped", "circuit_open")
HEALTHY = ("hit", "no_match")
DENIED_KEY = "relay_000000000000_denied"
# An answer finished this close to the deadline may miss the hook's network cut-off (the
# deadline minus 25 ms, dated from a process start the hook reads early, in 10 ms ticks).
LATE_MARGIN_MS = 60


class FaultProxy(FaultServer):
    """Forwards to the real server; while `kind` is set, every other request gets the fault."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(FAULTS["hung"])  # the behaviour is chosen per request below
        self.upstream_port = upstream_port
        self.kind: str | None = None
        # [query, what was done, when the proxy was done with it], in arrival order
        self.seen: list[list[Any]] = []
        self._count = 0
        self._lock = threading.Lock()

    def start(self, kind: str) -> None:
        """Fault `kind` from the next request on, which gets it: counted across drills, a
        drill whose conversations made one request found it forwarded (not exercised)."""
        with self._lock:
            self.kind, self._count = kind, 0

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            request = _read_request(conn)
            if request is None:
                return
            head, body = request
            entry: list[Any] = [_query(body), "forward", None]
            with self._lock:
                self._count += 1
                if self.kind and self._count % 2 == 1:
                    entry[1] = self.kind
                self.seen.append(entry)
            try:
                if entry[1] == "forward":
                    self._forward(conn, head + body)
                elif entry[1] == "denied_key":
                    self._forward(conn, _with_key(head, DENIED_KEY) + body)
                else:
                    FAULTS[entry[1]](conn, self.stop)
            finally:
                entry[2] = time.monotonic()
        except OSError:
            pass
        finally:
            conn.close()

    def _forward(self, conn: socket.socket, request: bytes) -> None:
        with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10) as up:
            up.sendall(request)
            while chunk := up.recv(65536):
                conn.sendall(chunk)

    def requests_for(self, prompt: str, since: int, made: bool) -> list[tuple[str, float | None]]:
        """(what was done, when it was done) for this prompt's requests after position `since`;
        when the hook's log says it made one, wait briefly for the proxy's thread to see it."""
        query = prompt.strip()[:QUERY_MAX_CHARS]
        deadline = time.monotonic() + (1.0 if made else 0.05)
        while True:
            with self._lock:
                found = [(action, done) for q, action, done in self.seen[since:] if q == query]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.01)


def _read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n", body


def _query(body: bytes) -> str:
    try:
        return str(json.loads(body).get("query", ""))
    except (ValueError, AttributeError):
        return ""


def _with_key(head: bytes, key: str) -> bytes:
    lines = [
        b"Authorization: Bearer " + key.encode()
        if line.lower().startswith(b"authorization:")
        else line
        for line in head.split(b"\r\n")
    ]
    return b"\r\n".join(lines)


# -- bookkeeping -------------------------------------------------------------------
class Drill:
    """The four figures of one drill, and what the report shows beside them."""

    def __init__(self, kind: str, deadline_ms: int) -> None:
        self.kind = kind
        self.deadline_ms = deadline_ms
        self.turns = self.on_time = self.injected_from_failure = self.logged_correctly = 0
        # Runs the drill's fault reached (a faulted request, the server down, a deleted
        # record or a revoked key asked about): with none the drill tested nothing.
        self.reached = 0
        self.outcomes: Counter[str] = Counter()
        self.ms: list[float] = []
        self.overhead: list[float] = []
        self.problems: list[str] = []
        self.notes: dict[str, Any] = {}

    def count(self, run: Run, logged_ok: bool, injected_bad: bool, what: str) -> None:
        self.turns += 1
        self.ms.append(run.ms)
        total = (run.log.get("ms") or {}).get("total")
        if isinstance(total, int | float):
            self.overhead.append(run.ms - total)
        self.outcomes[run.outcome] += 1
        on_time = run.ms <= self.deadline_ms + ON_TIME_SLACK_MS and run.rc == 0
        self.on_time += on_time
        self.injected_from_failure += injected_bad
        self.logged_correctly += logged_ok
        if not (on_time and logged_ok) or injected_bad:
            self.problems.append(
                f"{what}: outcome {run.outcome} ({run.log.get('reason')}), {run.ms:.0f} ms, "
                f"injected {bool(run.context)}"
            )

    def public(self) -> dict[str, int]:
        return {
            "turns": self.turns,
            "on_time": self.on_time,
            "injected_from_failure": self.injected_from_failure,
            "logged_correctly": self.logged_correctly,
        }

    def details(self) -> dict[str, Any]:
        return {
            **self.public(),
            "outcomes": dict(self.outcomes),
            "hook_ms": percentiles(self.ms),
            "max_ms": round(max(self.ms, default=0.0), 1),
            "harness_overhead_ms": percentiles(self.overhead),
            "problems": self.problems[:20],
            "exercised": self.reached > 0,
            **self.notes,
        }


def _healthy_ok(run: Run, deadline_ms: int) -> bool:
    """A run against the real server, unfaulted, logged what happened: no request, a hit
    that injected or a no_match that did not, or a timeout where the hook really waited out
    its budget (a loaded machine, a slow answer: QA saw the compaction drill count such
    runs, logged right, as mislogged), as the killed server's drill judged them already."""
    if run.outcome in NO_REQUEST:
        return True
    if run.outcome == "timeout":
        return run.ms >= deadline_ms - LATE_MARGIN_MS
    return run.outcome in HEALTHY and (run.outcome == "hit") == (run.context is not None)


# -- the drills ----------------------------------------------------------------------
def network_drill(
    kind: str,
    conversations: list[Conversation],
    proxy: FaultProxy,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
) -> Drill:
    behaviour, expected = NETWORK_FAULTS[kind]
    drill = Drill(kind, deadline_ms)
    proxy.start(behaviour)
    faulted = 0
    try:
        for conv in conversations:
            hook = Hook(
                home / conv.store, proxy.url, keys[conv.store].read[kind], deadline_ms, **DRILL_ENV
            )
            for turn in conv.turns:
                since = len(proxy.seen)
                started = time.monotonic()
                run = hook.prompt(turn.prompt, _sid(kind, conv), f"{turn.no}")
                made = run.outcome not in NO_REQUEST
                actions = proxy.requests_for(turn.prompt, since, made)
                failed = any(a != "forward" for a, _ in actions)
                faulted += failed
                if not actions:
                    logged = run.outcome in NO_REQUEST or run.log.get("reason") == "no_budget_left"
                elif failed:
                    logged = run.outcome == expected
                elif run.outcome == "timeout":  # the real server answered too late, or not?
                    cutoff = started + (deadline_ms - LATE_MARGIN_MS) / 1000
                    logged = all(done is None or done >= cutoff for _, done in actions)
                else:
                    logged = _healthy_ok(run, deadline_ms)
                bad = failed and not quiet(run.out)
                drill.count(run, logged, bad, f"{conv.id} turn {turn.no}")
    finally:
        proxy.kind = None
    drill.reached = faulted
    drill.notes.update(expected=expected, faulted_requests=faulted)
    return drill


def kill_drill(
    conversations: list[Conversation],
    server: Server,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
    progress: Progress | None,
) -> Drill:
    """The server is killed a third of the way in and restarted two thirds of the way in."""
    drill = Drill("server_killed", deadline_ms)
    turns = [(conv, turn) for conv in conversations for turn in conv.turns]
    kill_at, restart_at = max(1, len(turns) // 3), max(2, 2 * len(turns) // 3)
    down = 0
    for i, (conv, turn) in enumerate(turns):
        if i == kill_at:
            server.kill()
            if progress:
                progress(f"faults: killed the server (SIGKILL) before turn {i + 1}")
        if i == restart_at:
            t = time.monotonic()
            server.start()
            drill.notes["restart_s"] = round(time.monotonic() - t, 1)
            if progress:
                progress(f"faults: server restarted in {drill.notes['restart_s']} s")
        hook = Hook(
            home / conv.store,
            server.url,
            keys[conv.store].read["server_killed"],
            deadline_ms,
            **DRILL_ENV,
        )
        run = hook.prompt(turn.prompt, _sid("killed", conv), f"{turn.no}")
        is_down = kill_at <= i < restart_at
        if is_down:
            down += run.outcome not in NO_REQUEST
            logged = run.outcome in ("unavailable", *NO_REQUEST)
            bad = not quiet(run.out)
        else:
            logged, bad = _healthy_ok(run, deadline_ms), False
        drill.count(run, logged, bad, f"{conv.id} turn {turn.no} ({'down' if is_down else 'up'})")
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    drill.reached = down
    drill.notes.update(expected="unavailable", faulted_requests=down)
    return drill


def _memory_turns(
    conversations: list[Conversation], server: Server, keys: dict[str, OrgKeys], limit: int
) -> list[tuple[str, str]]:
    """Memory-needing prompts the server answers (asked with the admin key, so the drill's own
    key starts with a cold cache); when too few are, prompts quoting stored memories, so the
    drill never passes for want of anything to serve."""
    prompts = [
        (conv.store, turn.prompt)
        for conv in conversations
        for turn in conv.turns
        if turn.kind in MEMORY_CLASSES
    ]

    def answered(store: str, prompt: str) -> bool:
        status, body = server.request(
            "POST", "/v1/search", keys[store].admin, _search_body(prompt, 2000)
        )
        return status == 200 and bool(body.get("results"))

    out = [(store, prompt) for store, prompt in prompts if answered(store, prompt)][:limit]
    for store in sorted({conv.store for conv in conversations}):
        if len(out) >= limit:
            break
        status, page = server.request("GET", "/v1/memories?limit=50", keys[store].admin)
        items = page.get("items", []) if status == 200 else []
        for item in items:
            quote = " ".join(item["body"].split()[:40])
            if len(out) < limit and answered(store, quote):
                out.append((store, quote))
    return out


def deletion_drill(
    conversations: list[Conversation],
    server: Server,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
    limit: int,
) -> Drill:
    """Inject, warm the cache, delete the injected record, ask again: it must not come back."""
    drill = Drill("deletion", deadline_ms)
    deleted: set[str] = set()
    warm = 0
    for n, (store, prompt) in enumerate(_memory_turns(conversations, server, keys, limit * 3)):
        if len(deleted) >= limit:
            break
        hook = Hook(
            home / store, server.url, keys[store].read["deletion"], deadline_ms, **DRILL_ENV
        )
        first = hook.prompt(prompt, f"del-{n}-a", "1")
        victims = [rid for rid, _, _ in injected_records(first.context) if rid not in deleted]
        if not victims:
            continue
        hook.prompt(prompt, f"del-{n}-b", "1")  # the same answer again, now from the cache
        status, body = server.request(
            "POST", "/v1/search", keys[store].read["deletion"], _search_body(prompt, deadline_ms)
        )
        warm += status == 200 and bool(body.get("cached"))
        victim = victims[0]
        status, _ = server.request("DELETE", f"/v1/memories/{victim}", keys[store].admin)
        if status not in (200, 204):
            drill.problems.append(f"could not delete {victim}: HTTP {status}")
            continue
        deleted.add(victim)
        run = hook.prompt(prompt, f"del-{n}-c", "1")
        stale = victim in {rid for rid, _, _ in injected_records(run.context)}
        drill.reached += run.outcome not in NO_REQUEST  # asked again, not skipped by the gate
        drill.count(run, _healthy_ok(run, deadline_ms), stale, f"after deleting {victim}")
    drill.notes.update(deleted=len(deleted), warm_cache_hits=warm)
    return drill


def revocation_drill(
    conversations: list[Conversation],
    server: Server,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
    limit: int,
) -> Drill:
    """A new key gets answers (and warm cache entries), is revoked, and asks again."""
    drill = Drill("revocation", deadline_ms)
    prompts = _memory_turns(conversations, server, keys, limit)
    minted: dict[str, tuple[str, str]] = {}
    for store in sorted({s for s, _ in prompts}):
        status, body = server.request(
            "POST",
            "/v1/keys",
            keys[store].admin,
            {"name": "eval-revoked", "scopes": ["memory:read"], "roles": []},
        )
        if status != 201:
            raise RuntimeError(f"could not mint a key to revoke: HTTP {status} {body}")
        minted[store] = (body["secret"], body["id"])
    served_before = 0
    for n, (store, prompt) in enumerate(prompts):
        hook = Hook(home / store, server.url, minted[store][0], deadline_ms, **DRILL_ENV)
        for round_ in ("a", "b"):
            served_before += hook.prompt(prompt, f"rev-{n}-{round_}", "1").context is not None
    for store, (_, key_id) in minted.items():
        status, _ = server.request("DELETE", f"/v1/keys/{key_id}", keys[store].admin)
        if status != 200:
            raise RuntimeError(f"could not revoke {key_id}: HTTP {status}")
    for n, (store, prompt) in enumerate(prompts):
        hook = Hook(home / store, server.url, minted[store][0], deadline_ms, **DRILL_ENV)
        run = hook.prompt(prompt, f"rev-{n}-c", "1")
        asked = run.outcome not in NO_REQUEST  # else the gate kept the revoked key at home
        drill.reached += asked
        logged = run.outcome == "unauthorized" if asked else True
        drill.count(run, logged, run.context is not None, f"revoked, prompt {n}")
    drill.notes.update(served_before_revocation=served_before)
    return drill


def compaction_drill(
    conversations: list[Conversation],
    server: Server,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
) -> Drill:
    """Half a conversation, a compaction, the first half's memory-needing prompts again (what
    they brought left the context with the compaction), then the second half."""
    drill = Drill("compaction", deadline_ms)
    needed: set[tuple[str, str, int, int]] = set()  # (conversation, id, revision, passage)
    returned: set[tuple[str, str, int, int]] = set()
    dupes = 0
    for conv in conversations:
        hook = Hook(
            home / conv.store,
            server.url,
            keys[conv.store].read["compaction"],
            deadline_ms,
            **DRILL_ENV,
        )
        sid = _sid("compact", conv)
        half = len(conv.turns) // 2
        first, second = list(conv.turns[:half]), list(conv.turns[half:])
        again = [t for t in first if t.kind in MEMORY_CLASSES]
        # in context, as (id, revision, passage): since the start, then since compaction
        held: set[tuple[str, int, int]] = set()
        for i, turn in enumerate([*first, *again, *second]):
            if i == half:
                needed |= {(conv.id, *shown) for shown in held}
                start = hook.session_start(sid, "compact")
                logged = start.log.get("ledger_reset") is True and (
                    start.outcome in HEALTHY or start.log.get("reason") == "profile_off"
                )
                drill.count(start, logged, False, f"{conv.id} compaction")
                drill.reached += 1
                held = set(shown_whole(start.context))
            run = hook.prompt(turn.prompt, sid, f"{i}")
            records = injected_records(run.context)
            twice = sum(shown in held for shown in records)
            dupes += twice
            held.update(shown_whole(run.context))
            if i >= half:
                returned |= {(conv.id, *shown) for shown in records} & needed
            drill.count(run, _healthy_ok(run, deadline_ms), twice > 0, f"{conv.id} turn {i + 1}")
    drill.notes.update(
        needed_after_compaction=len(needed),
        returned_after_compaction=len(returned),
        duplicate_injections=dupes,
    )
    return drill


def _sid(kind: str, conv: Conversation) -> str:
    return f"{kind}-" + "".join(ch if ch.isalnum() else "-" for ch in conv.id)


def _search_body(prompt: str, deadline_ms: int) -> dict[str, Any]:
    return {"query": prompt.strip()[:QUERY_MAX_CHARS], "k": 6, "deadline_ms": deadline_ms}


def run_drills(
    conversations: list[Conversation],
    server: Server,
    keys: dict[str, OrgKeys],
    home: Path,
    deadline_ms: int,
    drill_prompts: int,
    progress: Progress | None = None,
) -> dict[str, Drill]:
    out: dict[str, Drill] = {}

    def done(drill: Drill) -> None:
        out[drill.kind] = drill
        if progress:
            p = drill.public()
            progress(
                f"faults: {drill.kind}: {p['turns']} turns, {p['on_time']} on time, "
                f"{p['injected_from_failure']} injected from failure, "
                f"{p['logged_correctly']} logged correctly"
            )

    proxy = FaultProxy(server.port)
    try:
        for kind in NETWORK_FAULTS:
            done(network_drill(kind, conversations, proxy, keys, home / kind, deadline_ms))
    finally:
        proxy.close()
    # Deletion last: it deletes the memories it injects, and on a team's small folder (the
    # two memories of docs/eval.md's example) it left revocation nothing to be served.
    steps: list[tuple[str, Callable[[], Drill]]] = [
        (
            "server_killed",
            lambda: kill_drill(conversations, server, keys, home / "killed", deadline_ms, progress),
        ),
        (
            "compaction",
            lambda: compaction_drill(conversations, server, keys, home / "compact", deadline_ms),
        ),
        (
            "revocation",
            lambda: revocation_drill(
                conversations, server, keys, home / "rev", deadline_ms, drill_prompts
            ),
        ),
        (
            "deletion",
            lambda: deletion_drill(
                conversations, server, keys, home / "del", deadline_ms, drill_prompts
            ),
        ),
    ]
    for _, step in steps:
        done(step())
    return {kind: out[kind] for kind in KINDS}


def public(drills: dict[str, Drill]) -> dict[str, dict[str, int]]:
    """Exactly the schema of `relay eval faults --json`."""
    return {kind: d.public() for kind, d in drills.items()}


def render(drills: dict[str, Drill], deadline_ms: int) -> str:
    lines = [
        f"{'drill':<15}{'turns':>7}{'on time':>9}{'injected':>10}{'logged ok':>11}{'max ms':>8}"
        f"  (on time: within {deadline_ms} + {ON_TIME_SLACK_MS} ms)"
    ]
    for kind, d in drills.items():
        p = d.public()
        lines.append(
            f"{kind:<15}{p['turns']:>7}{p['on_time']:>9}{p['injected_from_failure']:>10}"
            f"{p['logged_correctly']:>11}{max(d.ms, default=0):>8.0f}  "
            + ", ".join(f"{k} {v}" for k, v in sorted(d.notes.items()) if k != "expected")
        )
    return "\n".join(lines)


# What leaves a drill untested, by drill, and what gives it something to test.
_MORE_TURNS = "; replay more turns (--conversations, --turns, or more prompts in SOURCE)"
_MORE_ASKED = "; give SOURCE more memory-needing prompts the hook answers, or raise --drill-prompts"
_UNTESTED = {
    **dict.fromkeys(
        NETWORK_FAULTS, "the hook made no request for the proxy to fault" + _MORE_TURNS
    ),
    "server_killed": "no prompt searched while the server was down (a third to two thirds of"
    " the way in)" + _MORE_TURNS,
    "deletion": "the hook injected no memory to delete and ask about again" + _MORE_ASKED,
    "revocation": "the revoked key never reached the server (the gate skipped its prompts)"
    + _MORE_ASKED,
    "compaction": "no conversation reached its compaction" + _MORE_TURNS,
}


def shortfalls(drills: dict[str, Drill]) -> list[str]:
    """Why the drills did not all pass, a clause per drill, or none. A drill that ran no
    prompt, or whose fault never reached the hook, tested nothing: it is not a pass (a
    folder too small to drill is said as such, not as runs late or mislogged)."""
    out = []
    for kind, d in drills.items():
        if not d.turns:
            out.append(f"{kind} ran no prompts: {_UNTESTED[kind]}")
        elif not d.reached:
            out.append(f"{kind} was not exercised: {_UNTESTED[kind]}")
        missed = (
            (d.turns - d.on_time, "late"),
            (d.injected_from_failure, "injected from a failure"),
            (d.turns - d.logged_correctly, "mislogged"),
        )
        if said := ", ".join(f"{n} {what}" for n, what in missed if n):
            out.append(f"{kind}: {said}, of {d.turns} runs")
    return out
