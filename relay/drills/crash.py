"""Crash drill: kill -9 `relay serve` (SQLite) at random points during a stream of writes.

A client thread creates, edits and deletes memories, each body carrying a unique phrase.
An answered request is acknowledged; the one in flight when the server dies is not.
After each kill: `PRAGMA integrity_check`, restart, then every memory is checked
through the API: acknowledged state present at its revision (or, for a memory whose
next write was in flight, exactly that next state, whole), unacknowledged creates
absent or whole, deletions stay deleted, and an exact-phrase lexical search finds
every stored memory and nothing deleted.
"""

from __future__ import annotations

import http.client
import random
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.drills.common import Served, request


@dataclass
class State:
    revision: int
    body: str | None  # None: deleted
    phrase: str


@dataclass
class Tracked:
    id: str
    acked: State | None = None  # None: never acknowledged (create in flight)
    pending: State | None = None  # the write in flight when the server died


class Writer(threading.Thread):
    """Writes until the server stops answering; records what was acknowledged."""

    def __init__(
        self, url: str, key: str, mems: dict[str, Tracked], rng: random.Random, serial: list[int]
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.mems, self.rng, self.serial = url, key, mems, rng, serial
        self.acked = 0
        self.touched: set[str] = set()

    def phrase(self) -> str:
        self.serial[0] += 1
        return f"crashphrase{self.serial[0]}q{self.rng.randrange(10**6)}"

    def run(self) -> None:
        while True:
            live = [m for m in self.mems.values() if m.acked and m.acked.body is not None]
            roll = self.rng.random()
            try:
                if not live or roll < 0.5:
                    phrase = self.phrase()
                    mem = Tracked(f"c{self.serial[0]}")
                    body = f"Crash drill memory {phrase} about the deploy queue."
                    mem.pending = State(1, body, phrase)
                    self.mems[mem.id] = mem
                    status, _, data = request(
                        self.url,
                        "POST",
                        "/v1/memories",
                        self.key,
                        {"id": mem.id, "body": body},
                        timeout=10,
                    )
                    want = 201
                elif roll < 0.85:
                    mem = self.rng.choice(live)
                    assert mem.acked is not None
                    phrase = self.phrase()
                    body = f"Edited crash drill memory {phrase} after the rollout."
                    mem.pending = State(mem.acked.revision + 1, body, phrase)
                    status, _, data = request(
                        self.url,
                        "PATCH",
                        f"/v1/memories/{mem.id}",
                        self.key,
                        {"body": body, "expected_revision": mem.acked.revision},
                        timeout=10,
                    )
                    want = 200
                else:
                    mem = self.rng.choice(live)
                    assert mem.acked is not None
                    mem.pending = State(mem.acked.revision + 1, None, mem.acked.phrase)
                    status, _, data = request(
                        self.url, "DELETE", f"/v1/memories/{mem.id}", self.key, timeout=10
                    )
                    want = 204
            except (OSError, http.client.HTTPException):
                # The server died with this write in flight (before answering, or halfway
                # through the answer: IncompleteRead): it stays pending.
                return
            if status != want:
                raise RuntimeError(f"write answered {status}: {data}")
            if want != 204 and data["revision"] != mem.pending.revision:
                raise RuntimeError(f"{mem.id} answered revision {data['revision']}")
            mem.acked, mem.pending = mem.pending, None
            self.acked += 1
            self.touched.add(mem.id)


def integrity(db: str) -> str:
    """`PRAGMA integrity_check`, then FTS5's own check that the index agrees with its table."""
    conn = sqlite3.connect(db)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        try:
            conn.execute("INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")
            conn.commit()
        except sqlite3.DatabaseError as exc:
            check = f"{check}; fts: {exc}"
        return check
    finally:
        conn.close()


def verify_rows(db: str, mems: dict[str, Tracked]) -> list[str]:
    """Every tracked memory, straight from the tables: state, history length, passages."""
    conn = sqlite3.connect(db)
    try:
        rows = {
            r[0]: r[1:]
            for r in conn.execute("SELECT id, revision, body, deleted_at IS NOT NULL FROM memories")
        }
        revs = dict(conn.execute("SELECT id, count(*) FROM memory_revisions GROUP BY id"))
        passages = dict(conn.execute("SELECT memory_id, count(*) FROM passages GROUP BY memory_id"))
    finally:
        conn.close()
    losses = []
    for mem in mems.values():
        row = rows.get(mem.id)
        allowed = [mem.acked] + ([mem.pending] if mem.pending else [])
        if row is None:
            if mem.acked is not None:
                losses.append(f"{mem.id}: acknowledged but no row")
            elif revs.get(mem.id) or passages.get(mem.id):
                losses.append(f"{mem.id}: half-present unacknowledged create")
            continue
        revision, body, deleted = row
        if not any(
            s is not None and s.revision == revision and s.body == (None if deleted else body)
            for s in allowed
        ):
            losses.append(
                f"{mem.id}: row rev {revision} deleted={bool(deleted)}, "
                f"acknowledged {mem.acked}, in flight {mem.pending}"
            )
        if revs.get(mem.id) != revision:
            losses.append(f"{mem.id}: {revs.get(mem.id)} history rows for revision {revision}")
        if bool(passages.get(mem.id)) == bool(deleted):
            losses.append(f"{mem.id}: deleted={bool(deleted)} with {passages.get(mem.id)} passages")
    return losses


def _same(expected: State | None, actual: State | None) -> bool:
    if expected is None or actual is None:
        return expected is None and actual is None
    return expected.revision == actual.revision and expected.body == actual.body


def verify(url: str, key: str, mems: dict[str, Tracked], ids: list[str]) -> list[str]:
    """Check memories `ids` through the API against what was acknowledged; adopt what is
    there (so the next round starts from the truth)."""
    losses: list[str] = []
    for mem in [mems[i] for i in ids]:
        status, _, data = request(url, "GET", f"/v1/memories/{mem.id}", key)
        hist_status, _, hist = request(url, "GET", f"/v1/memories/{mem.id}/revisions", key)
        if status == 200:
            actual = State(data["revision"], data["body"], "")
        elif status == 404 and hist_status == 200 and hist["items"]:
            actual = State(hist["items"][-1]["revision"], None, "")
        elif status == 404 and hist_status == 404:
            actual = None
        else:
            losses.append(f"{mem.id}: get {status}, history {hist_status}")
            continue
        allowed = [mem.acked] + ([mem.pending] if mem.pending else [])

        matches = [s for s in allowed if _same(s, actual)]
        if not matches:
            losses.append(
                f"{mem.id}: found {actual}, acknowledged {mem.acked}, in flight {mem.pending}"
            )
            continue
        match = matches[0]
        if match is None:
            del mems[mem.id]  # an unacknowledged create that never landed: absent entirely
            continue
        mem.acked, mem.pending = match, None
        hits = request(
            url,
            "POST",
            "/v1/search",
            key,
            {"query": f'"{match.phrase}"', "k": 5, "mode": "lexical"},
        )[2]
        found = any(r["id"] == mem.id for r in hits["results"])
        if match.body is not None and not found:
            losses.append(f"{mem.id}: stored but search for {match.phrase} misses it")
        if match.body is None and found:
            losses.append(f"{mem.id}: deleted but search for {match.phrase} finds it")
        if hist_status == 200 and [r["revision"] for r in hist["items"]] != list(
            range(1, match.revision + 1)
        ):
            losses.append(f"{mem.id}: history revisions {[r['revision'] for r in hist['items']]}")
    return losses


def run(
    kills: int,
    seed: int,
    min_s: float = 0.3,
    max_s: float = 2.5,
    progress: Any = None,
    api_sample: int = 40,
) -> dict[str, Any]:
    """`kills` rounds; after each, every tracked memory is checked in the tables and those
    written in the round plus `api_sample` others through get, history and search."""
    rng = random.Random(seed)
    tmp = tempfile.TemporaryDirectory(prefix="relay-drill-crash-")
    db = str(Path(tmp.name) / "relay.db")
    server = Served(
        db, Path(tmp.name) / "serve.log", {"RELAY_EMBEDDER": "onnx", "RELAY_CACHE_ENTRIES": "1000"}
    ).start()
    key = server.admin_key
    mems: dict[str, Tracked] = {}
    serial = [0]
    losses: list[str] = []
    acked = in_flight = restarts_s = 0.0
    integrity_failures = checked_api = 0
    started = time.monotonic()
    try:
        for n in range(kills):
            writer = Writer(server.url, key, mems, rng, serial)
            writer.start()
            time.sleep(rng.uniform(min_s, max_s))
            server.kill()
            writer.join(15)
            acked += writer.acked
            in_flight += sum(1 for m in mems.values() if m.pending)
            check = integrity(db)
            if check != "ok":
                integrity_failures += 1
                losses.append(f"kill {n + 1}: integrity_check says {check}")
            t0 = time.monotonic()
            server.start()
            restarts_s += time.monotonic() - t0
            touched = [i for i, m in mems.items() if m.pending or i in writer.touched]
            others = [i for i in mems if i not in set(touched)]
            sample = touched + rng.sample(others, min(api_sample, len(others)))
            found = verify_rows(db, mems) + verify(server.url, key, mems, sample)
            checked_api += len(sample)
            losses += [f"kill {n + 1}: {f}" for f in found]
            if progress:
                progress(
                    f"kill {n + 1}/{kills}: {writer.acked} acknowledged writes, "
                    f"{len(mems)} memories tracked, {len(found)} problems"
                )
    finally:
        server.stop()
        tmp.cleanup()
    return {
        "seed": seed,
        "kills": kills,
        "acknowledged_writes": int(acked),
        "writes_in_flight_at_kill": int(in_flight),
        "memories_tracked": len(mems),
        "api_checks": checked_api,
        "integrity_failures": integrity_failures,
        "mean_restart_s": round(restarts_s / max(kills, 1), 2),
        "seconds": round(time.monotonic() - started, 1),
        "losses": len(losses),
        "loss_examples": losses[:10],
    }
