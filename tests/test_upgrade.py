"""An embedded store the first release wrote (SQLite schema migration 1 alone) is upgraded in
place by opening it with this code: every migration after the first runs on real rows, and
nothing is lost or wrong after, nor changed by a second open.

The file is built here rather than kept: its schema is the first of this code's migrations
(a shipped migration is never edited), and its rows go in through the statements that
release's store ran (relay/store/sqlite.py at 2ebd0aa: `_save`, `delete_memory`,
`create_key`, `revoke_key`, `cache_embeddings`), JSON written as it wrote it. So the test
takes milliseconds and needs no model; QA checked the same upgrade from databases the old
releases themselves wrote, through their CLI and API.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from postgres_support import raw_rows, recounted_totals, stored_totals

from relay.models import EVERYONE
from relay.store.migrations_sqlite import MIGRATIONS
from relay.store.sqlite import SQLiteStore, _split_script
from relay.text import lexical_terms
from relay.writes import content_digest

NOW = time.time()


class FirstRelease:
    """Writes a file as the first release's store did, one statement shape per operation."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        for statement in _split_script(MIGRATIONS[0]):
            self.conn.execute(statement)
        self.conn.execute("INSERT INTO schema_migrations VALUES (1, ?)", (NOW,))
        self.clock = NOW - 3600

    def tick(self) -> float:
        self.clock += 1
        return self.clock

    def org(self, org_id: str, name: str) -> None:
        self.conn.execute(
            "INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)", (org_id, name, NOW)
        )

    def key(self, org: str, key_id: str, scopes: list[str], roles: list[str], **at: float) -> None:
        self.conn.execute(
            "INSERT INTO api_keys (id, org_id, secret_hash, name, scopes, roles, created_at,"
            " expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key_id,
                org,
                f"hash-{key_id}",
                key_id,
                json.dumps(sorted(scopes)),
                json.dumps(sorted(roles)),
                NOW,
                at.get("expires_at"),
                at.get("revoked_at"),
            ),
        )
        self.conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org,))

    def save(self, org: str, mid: str, body: str, **fields: object) -> None:
        """`_save`: the memory, a revision, its audiences, its passages (one per ' | ' part)
        and the org's term counts, then both directions of supersession."""
        now = self.tick()
        row = self.conn.execute(
            "SELECT revision, created_at FROM memories WHERE org_id = ? AND id = ?", (org, mid)
        ).fetchone()
        revision, created = (1, now) if row is None else (row[0] + 1, row[1])
        audiences = sorted(fields.get("audiences", [EVERYONE]))  # type: ignore[call-overload]
        supersedes = list(fields.get("supersedes", []))  # type: ignore[call-overload]
        values = {
            "org_id": org,
            "id": mid,
            "revision": revision,
            "title": fields.get("title"),
            "body": body,
            "source": fields.get("source"),
            "tags": json.dumps(list(fields.get("tags", []))),  # type: ignore[call-overload]
            "audiences": json.dumps(audiences),
            "author": "k-alice",
            "created_at": created,
            "updated_at": now,
            "valid_until": fields.get("valid_until"),
            "supersedes": json.dumps(supersedes),
            "pinned": int(bool(fields.get("pinned", False))),
        }
        self.conn.execute(
            "INSERT INTO memories (org_id, id, revision, title, body, source, tags, audiences,"
            " author, created_at, updated_at, valid_until, supersedes, pinned) VALUES"
            " (:org_id, :id, :revision, :title, :body, :source, :tags, :audiences, :author,"
            " :created_at, :updated_at, :valid_until, :supersedes, :pinned)"
            " ON CONFLICT (org_id, id) DO UPDATE SET revision = :revision, title = :title,"
            " body = :body, source = :source, tags = :tags, audiences = :audiences,"
            " author = :author, updated_at = :updated_at, valid_until = :valid_until,"
            " supersedes = :supersedes, pinned = :pinned",
            values,
        )
        self.conn.execute(
            "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
            " title, body, source, tags, audiences, valid_until, supersedes) VALUES"
            " (:org_id, :id, :revision, :action, :updated_at, :author, :title, :body, :source,"
            " :tags, :audiences, :valid_until, :supersedes)",
            {**values, "action": "create" if row is None else "edit"},
        )
        self.conn.execute(
            "DELETE FROM memory_audiences WHERE org_id = ? AND memory_id = ?", (org, mid)
        )
        self.conn.executemany(
            "INSERT INTO memory_audiences VALUES (?, ?, ?)", [(org, mid, a) for a in audiences]
        )
        old = self._drop_passages(org, mid)
        parts = body.split(" | ")
        rows = []
        for seq, text in enumerate(parts):
            lexical = " ".join(lexical_terms(text))
            digest = content_digest(f"{values['title']}\n{text}" if values["title"] else text)
            vector = np.random.default_rng(len(text)).normal(size=384).astype("<f4")
            rows.append((org, mid, revision, seq, text, lexical, digest, vector.tobytes()))
            self.conn.execute(
                "INSERT OR IGNORE INTO embedding_cache VALUES (?, ?, ?)",
                ("minilm-l6-v2-onnx-int8", digest, vector.tobytes()),
            )
        self.conn.executemany(
            "INSERT INTO passages (org_id, memory_id, revision, seq, text, lexical, content_hash,"
            " embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._terms(org, old, [r[5] for r in rows])
        self.conn.execute(
            "UPDATE memories SET superseded_by = NULL WHERE org_id = ? AND superseded_by = ?",
            (org, mid),
        )
        self.conn.executemany(
            "UPDATE memories SET superseded_by = ? WHERE org_id = ? AND id = ?",
            [(mid, org, target) for target in supersedes],
        )
        self.conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org,))

    def delete(self, org: str, mid: str) -> None:
        """`delete_memory`: passages gone, the text gone from every revision, a tombstone."""
        now = self.tick()
        self._terms(org, self._drop_passages(org, mid), [])
        self.conn.execute(
            "UPDATE memory_revisions SET title = NULL, body = NULL WHERE org_id = ? AND id = ?",
            (org, mid),
        )
        (revision,) = self.conn.execute(
            "SELECT revision FROM memories WHERE org_id = ? AND id = ?", (org, mid)
        ).fetchone()
        self.conn.execute(
            "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author)"
            " VALUES (?, ?, ?, 'delete', ?, ?)",
            (org, mid, revision + 1, now, "k-alice"),
        )
        self.conn.execute(
            "UPDATE memories SET deleted_at = ?, revision = revision + 1, title = NULL,"
            " body = NULL, updated_at = ? WHERE org_id = ? AND id = ?",
            (now, now, org, mid),
        )
        self.conn.execute(
            "UPDATE memories SET superseded_by = NULL WHERE org_id = ? AND superseded_by = ?",
            (org, mid),
        )
        self.conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org,))

    def _drop_passages(self, org: str, mid: str) -> list[str]:
        old = [
            r[0]
            for r in self.conn.execute(
                "SELECT lexical FROM passages WHERE org_id = ? AND memory_id = ?", (org, mid)
            )
        ]
        self.conn.execute("DELETE FROM passages WHERE org_id = ? AND memory_id = ?", (org, mid))
        return old

    def _terms(self, org: str, removed: list[str], added: list[str]) -> None:
        """`_update_terms` as it was: document frequencies and the org's passage count."""
        delta: dict[str, int] = {}
        for lexical, sign in [(x, -1) for x in removed] + [(x, 1) for x in added]:
            for term in set(lexical.split()):
                delta[term] = delta.get(term, 0) + sign
        self.conn.executemany(
            "INSERT INTO org_terms (org_id, term, df) VALUES (?, ?, ?)"
            " ON CONFLICT (org_id, term) DO UPDATE SET df = df + excluded.df",
            [(org, t, d) for t, d in delta.items() if d],
        )
        self.conn.execute("DELETE FROM org_terms WHERE org_id = ? AND df <= 0", (org,))
        self.conn.execute(
            "UPDATE orgs SET passage_count = passage_count + ? WHERE id = ?",
            (len(added) - len(removed), org),
        )


def _first_release_file(path: Path) -> None:
    old = FirstRelease(path)
    old.org("org_acme", "acme")
    old.org("org_globex", "globex")
    old.key("org_acme", "k-admin", ["admin", "memory:read", "memory:write"], [])
    old.key("org_acme", "k-alice", ["memory:read", "memory:write"], ["backend"])
    old.key("org_acme", "k-gone", ["memory:read"], [], revoked_at=NOW - 60)
    old.key("org_acme", "k-ci", ["memory:read"], [], expires_at=NOW + 86_400)
    old.key("org_globex", "k-dave", ["memory:read", "memory:write"], ["ops"])
    old.save("org_acme", "deploy", "Deploys go through the blue cluster.", title="Deploys")
    old.save("org_acme", "deploy", "Deploys go through the green cluster.", title="Deploys")
    for pinned in (True, False, True):  # pin-only edits: each a revision
        old.save("org_acme", "deploy", "Deploys go through the green cluster.", pinned=pinned,
                 title="Deploys")  # fmt: skip
    old.save("org_acme", "payments", "Webhooks retry five times. | Keys live in Redis.",
             audiences=["sre", "backend"], tags=["payments"], source="services/pay")  # fmt: skip
    old.save("org_acme", "pg14", "Production runs PostgreSQL 14.")
    old.save("org_acme", "pg16", "Production runs PostgreSQL 16.", supersedes=["pg14"])
    old.save("org_acme", "freeze", "Code freeze until June.", valid_until=NOW + 86_400)
    old.save("org_acme", "gone", "Rotate the staging password monthly.", pinned=True)
    old.delete("org_acme", "gone")
    old.save("org_globex", "deploy", "Deploys go through the blue cluster.", audiences=["ops"])
    old.conn.close()


def _memories_of(store: SQLiteStore, rowids: list[int]) -> set[tuple[str, str]]:
    marks = ", ".join("?" for _ in rowids)
    query = f"SELECT org_id, memory_id FROM passages WHERE rowid IN ({marks})"
    return set(raw_rows(store, query, tuple(rowids)))


def _dump(path: Path) -> str:
    with closing(sqlite3.connect(path)) as conn:
        return "\n".join(conn.iterdump())


def test_a_first_release_file_is_upgraded_in_place_without_loss(tmp_path: Path):
    path = tmp_path / "relay.db"
    _first_release_file(path)
    with closing(sqlite3.connect(path)) as conn:  # what the upgrade has to mend
        left = "SELECT count(*) FROM embedding_cache WHERE content_hash NOT IN"
        assert conn.execute(f"{left} (SELECT content_hash FROM passages)").fetchone() == (2,)
    store = SQLiteStore(path)
    try:
        assert store.schema_version() == len(MIGRATIONS)
        acme, globex = "org_acme", "org_globex"
        keys = {k.id: k for k in store.list_keys(acme)}
        assert keys["k-gone"].revoked_at is not None and keys["k-ci"].expires_at is not None
        assert keys["k-alice"].roles == frozenset({"backend"})
        found = store.key_for_auth("k-alice")
        assert found is not None and found[1] == "hash-k-alice"

        live = {m.id: m for m in store.list_memories(acme, None, 100)[0]}
        assert sorted(live) == ["deploy", "freeze", "payments", "pg14", "pg16"]
        assert live["deploy"].pinned and live["deploy"].revision == 5
        assert live["payments"].audiences == ("backend", "sre")
        assert live["payments"].tags == ("payments",)
        assert live["pg14"].superseded_by == "pg16" and live["pg16"].supersedes == ("pg14",)
        assert live["freeze"].valid_until is not None
        # migration 8: pins known from the current one back through the pin-only edits
        pins = [r.pinned for r in store.history(acme, "deploy", None)]
        assert pins == [None, False, True, False, True]
        tombstone = store.history(acme, "gone", None)
        assert [(r.action, r.body, r.pinned) for r in tombstone] == [
            ("create", None, None),
            ("delete", None, None),
        ]

        # migration 3: the rebuilt full-text index keeps each org's passages to itself
        now = datetime.now(UTC)
        hits = store.lexical_search(acme, frozenset({EVERYONE}), now, ["deploy", "cluster"], 10)
        assert _memories_of(store, [rowid for rowid, _ in hits]) == {(acme, "deploy")}
        ops = frozenset({EVERYONE, "ops"})
        hits = store.lexical_search(globex, ops, now, ["deploy", "cluster"], 10)
        assert _memories_of(store, [rowid for rowid, _ in hits]) == {(globex, "deploy")}
        # migration 5: each audience set's passages, as writes key them
        for org in (acme, globex):
            assert stored_totals(store, org) == recounted_totals(store, org)
        assert stored_totals(store, acme) == {("all",): 4, ("backend", "sre"): 2}
        # migration 4: every passage waits for its token matrix from the backfill
        assert len(store.missing_tokens(100)) == 7
        # migration 6: the vectors of replaced and deleted texts leave the cache
        held = set(raw_rows(store, "SELECT content_hash FROM passages"))
        assert set(raw_rows(store, "SELECT content_hash FROM embedding_cache")) == held
    finally:
        store.close()
    opened = _dump(path)
    SQLiteStore(path).close()
    assert _dump(path) == opened  # a second open changes nothing
