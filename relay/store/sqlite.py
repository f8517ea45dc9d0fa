"""The embedded store: one SQLite file in WAL mode.

One writer connection (writes serialise on a lock and `BEGIN IMMEDIATE`),
a reader connection per thread, so searches never wait behind a write.
Every query that returns memory content carries the access filter built by
`visible_sql()`: tenant, audience, expiry, deletion and supersession are
decided by SQL, never by filtering rows afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from relay.errors import ConflictError, NotFoundError, StoreError
from relay.hygiene import LATEST_TIME
from relay.models import (
    EVERYONE,
    WITHHELD_FIELDS,
    ApiKey,
    Memory,
    MemoryDraft,
    Org,
    Passage,
    PassageInput,
    Revision,
)
from relay.store import (
    PASSAGE_COUNT_SQL,
    SaveMode,
    batch_item,
    candidate_terms,
    check_org_name,
)
from relay.store.migrations_sqlite import MIGRATIONS
from relay.store.rules import (
    Read,
    as_read,
    judge_cycle,
    judge_replacement,
    judge_write,
    linked_ids,
    same_content,
    settle_supersedes,
)
from relay.store.vector_index import VectorIndex


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    """A stored time. One past `LATEST_TIME` (rounded up to year 10000, as Relay once stored
    9999-12-31T23:59:59.9999999Z) reads as that: raising would fail every read of its row."""
    if value is None:
        return None
    return datetime.fromtimestamp(min(value, LATEST_TIME.timestamp()), UTC)


@contextmanager
def translate_errors() -> Iterator[None]:
    """sqlite3's errors become Relay's, once, here."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"database error: {exc}") from exc


def visible_sql(audience_count: int | None) -> str:
    """The access filter on `memories m` for one org (`:org`), at time `:now`.

    `audience_count` is the number of `?`-free named parameters :a0..:aN the
    caller binds; None means an admin management read (no audience filter).
    """
    clauses = [
        "m.org_id = :org",
        "m.deleted_at IS NULL",
    ]
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        clauses += [
            "m.superseded_by IS NULL",
            "(m.valid_until IS NULL OR m.valid_until > :now)",
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            f" AND ma.memory_id = m.id AND ma.audience IN ({names}))",
        ]
    return " AND ".join(clauses)


def history_sql(audience_count: int | None) -> str:
    """A memory's revisions (`:org`, `:id`), oldest first, each one's content withheld
    (`WITHHELD_FIELDS` null, `withheld` 1) unless its audiences meet the reader's
    :a0..:aN; a deletion, which has none of its own, takes the memory's last. None: an
    admin management read, which withholds nothing."""
    readable = "1"
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        readable = (
            "EXISTS (SELECT 1 FROM json_each(coalesce(r.audiences, m.audiences))"
            f" WHERE json_each.value IN ({names}))"
        )
    content = ", ".join(f"CASE WHEN readable THEN {c} END AS {c}" for c in WITHHELD_FIELDS)
    return (
        f"SELECT id, revision, action, recorded_at, NOT readable AS withheld, {content}"
        f" FROM (SELECT r.*, {readable} AS readable FROM memory_revisions r"
        " JOIN memories m ON m.org_id = r.org_id AND m.id = r.id"
        " WHERE r.org_id = :org AND r.id = :id) ORDER BY revision"
    )


def _audience_params(audiences: frozenset[str] | None) -> dict[str, str]:
    if audiences is None:
        return {}
    return {f"a{i}": a for i, a in enumerate(sorted(audiences | {EVERYONE}))}


def lexical_sql(audience_count: int) -> str:
    """Candidate passages for an FTS5 query, best BM25 first, within the reader's access.

    The inner query ranks inside FTS5 only the org's matches (its id is an indexed column
    the match expression requires) and keeps the best `:fetch`; the outer query applies the
    whole access filter to those. `:fetch` over-asks so rows the filter drops (expired,
    superseded, other audiences) rarely leave fewer than `:limit`; the caller asks again,
    wider, when they do.
    """
    return (
        "SELECT p.rowid, top.score FROM ("
        "  SELECT rowid, bm25(passages_fts, 1.0, 0.0) AS score FROM passages_fts"
        "  WHERE passages_fts MATCH :match ORDER BY score LIMIT :fetch"
        ") AS top"
        " JOIN passages p NOT INDEXED ON p.rowid = top.rowid"
        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
        f" WHERE p.org_id = :org AND {visible_sql(audience_count)}"
        " ORDER BY top.score LIMIT :limit"
    )


def fts_match(org_id: str | None, terms: Sequence[str]) -> str:
    """Passages holding any of `terms`, of one org when `org_id` is given (quoting keeps
    operators in user text inert)."""
    words = "lexical : (" + " OR ".join('"' + t.replace('"', '""') + '"' for t in terms) + ")"
    if org_id is None:
        return words
    return 'org_id : "' + org_id.replace('"', '""') + '" AND ' + words


# An org holding at least this share of all passages is searched without the org column:
# intersecting with its own huge posting list costs more than dropping other orgs' rows.
DOMINANT_SHARE = 0.5


def _create_private(path: Path) -> None:
    """Make a new database file readable by its owner alone (SQLite gives its -wal and -shm
    files the same mode): it holds every audience's memories, which the server alone may
    filter. A new folder for it is the owner's alone too; existing ones are left as found."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SQLiteStore:
    """The embedded store (see module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            _create_private(Path(self.path))
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._writer = self._connect()
        self.vectors = VectorIndex()
        self._migrate()

    # -- connections -------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        with translate_errors():
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA cache_size=-65536")
            conn.row_factory = sqlite3.Row
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock, translate_errors():
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for several statements."""
        conn = self._reader()
        with translate_errors():
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self._write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, script in enumerate(MIGRATIONS, start=1):
                if version in done:
                    continue
                for statement in _split_script(script):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))

    def schema_version(self) -> int:
        with translate_errors():
            return (
                self._reader().execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
            )

    def warm(self) -> None:
        """Bring every org's in-memory vectors up to date (about a second per 10^5
        passages), waiting for them rather than answering from an older copy."""
        for org in self.list_orgs():
            load = functools.partial(self._vector_rows, org.id)
            self.vectors.get(org.id, self.generation(org.id), load, wait=True)

    def close(self) -> None:
        with translate_errors():
            self._writer.close()
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

    # -- organisations and keys ---------------------------------------------
    def create_org(self, name: str) -> Org:
        name = check_org_name(name)
        org = Org(id="org_" + secrets.token_hex(6), name=name, created_at=datetime.now(UTC))
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM orgs WHERE name = ?", (name,)).fetchone():
                raise ConflictError(f"an organisation named {name!r} already exists")
            conn.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)",
                (org.id, org.name, _ts(org.created_at)),
            )
        return org

    def get_org(self, org_id: str) -> Org:
        with translate_errors():
            row = self._reader().execute("SELECT * FROM orgs WHERE id = ?", (org_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no organisation {org_id!r}")
        return _org(row)

    def find_org(self, name_or_id: str) -> Org | None:
        """The org with this id, else the one with this name (a name made before names
        shaped like ids were refused may equal another org's id: the id wins)."""
        with translate_errors():
            row = (
                self._reader()
                .execute(
                    "SELECT * FROM orgs WHERE id = :v OR name = :v ORDER BY id = :v DESC LIMIT 1",
                    {"v": name_or_id},
                )
                .fetchone()
            )
        return None if row is None else _org(row)

    def list_orgs(self) -> list[Org]:
        with translate_errors():
            rows = self._reader().execute("SELECT * FROM orgs ORDER BY created_at").fetchall()
        return [_org(r) for r in rows]

    def create_key(
        self,
        org_id: str,
        key_id: str,
        secret_hash: str,
        name: str,
        scopes: frozenset[str],
        roles: frozenset[str],
        expires_at: datetime | None,
    ) -> ApiKey:
        key = ApiKey(
            id=key_id,
            org_id=org_id,
            name=name,
            scopes=scopes,
            roles=roles,
            created_at=datetime.now(UTC),
            expires_at=expires_at,
        )
        with self._write() as conn:
            if not conn.execute("SELECT 1 FROM orgs WHERE id = ?", (org_id,)).fetchone():
                raise NotFoundError(f"no organisation {org_id!r}")
            conn.execute(
                "INSERT INTO api_keys (id, org_id, secret_hash, name, scopes, roles, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.id,
                    org_id,
                    secret_hash,
                    name,
                    json.dumps(sorted(scopes)),
                    json.dumps(sorted(roles)),
                    _ts(key.created_at),
                    _ts(expires_at),
                ),
            )
            _bump(conn, org_id)
        return key

    def key_for_auth(self, key_id: str) -> tuple[ApiKey, str] | None:
        with translate_errors():
            row = (
                self._reader().execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
            )
        return None if row is None else (_key(row), row["secret_hash"])

    def list_keys(
        self, org_id: str, limit: int | None = None, after: str | None = None
    ) -> list[ApiKey]:
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT * FROM api_keys WHERE org_id = ? AND (? IS NULL OR (created_at, id)"
                    " > (SELECT created_at, id FROM api_keys WHERE org_id = ? AND id = ?))"
                    " ORDER BY created_at, id LIMIT ?",
                    (org_id, after, org_id, after, -1 if limit is None else limit),  # -1: all
                )
                .fetchall()
            )
        return [_key(r) for r in rows]

    def revoke_key(self, org_id: str, key_id: str) -> ApiKey:
        with self._write() as conn:
            row = conn.execute(
                "SELECT * FROM api_keys WHERE id = ? AND org_id = ?", (key_id, org_id)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no key {key_id!r} in this organisation")
            if row["revoked_at"] is None:
                conn.execute(
                    "UPDATE api_keys SET revoked_at = ? WHERE id = ?", (time.time(), key_id)
                )
                _bump(conn, org_id)
            row = conn.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        return _key(row)

    def known_audiences(self, org_id: str) -> set[str]:
        """The roles that some live key of the org carries: the audiences a memory may name.
        A key is live until it is revoked or expires, by the clock `auth.authorize` reads."""
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT DISTINCT value FROM api_keys, json_each(api_keys.roles)"
                    " WHERE org_id = ? AND revoked_at IS NULL"
                    " AND (expires_at IS NULL OR expires_at > ?)",
                    (org_id, time.time()),
                )
                .fetchall()
            )
        return {r[0] for r in rows}

    # -- memories ------------------------------------------------------------
    def save_memory(
        self,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None = None,
        audiences: frozenset[str] | None = None,
    ) -> tuple[Memory, bool]:
        with self._write() as conn:
            saved, changed = self._save(
                conn, org_id, memory_id, draft, author, passages, mode, expected_revision, audiences
            )
            (shown,) = _as_read(conn, org_id, [saved], audiences)
        return shown, changed

    def save_memories(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        audiences: frozenset[str] | None = None,
        expected: Mapping[str, int] | None = None,
    ) -> list[tuple[Memory, bool]]:
        """Many writes in one transaction: all land, or none do (a memory of `expected` not
        at its revision there refuses them all: ConflictError with `revision`)."""
        expected = expected or {}
        saved = []
        with self._write() as conn:
            for i, (memory_id, draft, passages) in enumerate(items):
                with batch_item(i):
                    saved.append(
                        self._save(
                            conn,
                            org_id,
                            memory_id,
                            draft,
                            author,
                            passages,
                            mode,
                            expected.get(memory_id),
                            audiences,
                        )
                    )
            shown = _as_read(conn, org_id, [m for m, _ in saved], audiences)
        return [(m, changed) for m, (_, changed) in zip(shown, saved, strict=True)]

    def _save(
        self,
        conn: sqlite3.Connection,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None = None,
        audiences: frozenset[str] | None = None,
    ) -> tuple[Memory, bool]:
        now = time.time()
        row = conn.execute(
            "SELECT * FROM memories WHERE org_id = ? AND id = ?", (org_id, memory_id)
        ).fetchone()
        current = None if row is None else _memory(row)
        deleted = row is not None and row["deleted_at"] is not None
        judge_write(current, deleted, memory_id, mode, expected_revision, audiences)
        kept = () if current is None else current.supersedes
        draft = self._check_supersedes(conn, org_id, memory_id, draft, audiences, kept)
        if current is not None and current.superseded_by is not None:
            replacement = conn.execute(
                "SELECT audiences FROM memories WHERE org_id = ? AND id = ? AND deleted_at IS NULL",
                (org_id, current.superseded_by),
            ).fetchone()
            if replacement is not None:
                judge_replacement(
                    memory_id,
                    current.audiences,
                    draft.audiences,
                    current.superseded_by,
                    json.loads(replacement["audiences"]),
                    audiences,
                )
        if current is not None and same_content(current, draft):
            return current, False
        revision = 1 if current is None else current.revision + 1
        created = now if current is None else _ts(current.created_at)
        values = {
            "org_id": org_id,
            "id": memory_id,
            "revision": revision,
            "title": draft.title,
            "body": draft.body,
            "source": draft.source,
            "tags": json.dumps(list(draft.tags)),
            "audiences": json.dumps(list(draft.audiences)),
            "author": author,
            "created_at": created,
            "updated_at": now,
            "valid_until": _ts(draft.valid_until),
            "supersedes": json.dumps(list(draft.supersedes)),
            "pinned": int(draft.pinned),
        }
        conn.execute(
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
        conn.execute(
            "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
            " title, body, source, tags, audiences, valid_until, supersedes) VALUES"
            " (:org_id, :id, :revision, :action, :updated_at, :author, :title, :body, :source,"
            " :tags, :audiences, :valid_until, :supersedes)",
            {**values, "action": "create" if current is None else "edit"},
        )
        conn.execute(
            "DELETE FROM memory_audiences WHERE org_id = ? AND memory_id = ?",
            (org_id, memory_id),
        )
        conn.executemany(
            "INSERT INTO memory_audiences VALUES (?, ?, ?)",
            [(org_id, memory_id, a) for a in sorted(set(draft.audiences))],
        )
        replaced = conn.execute(
            "SELECT lexical, content_hash FROM passages WHERE org_id = ? AND memory_id = ?",
            (org_id, memory_id),
        ).fetchall()
        old = [r["lexical"] for r in replaced]
        conn.execute("DELETE FROM passages WHERE org_id = ? AND memory_id = ?", (org_id, memory_id))
        conn.executemany(
            "INSERT INTO passages (org_id, memory_id, revision, seq, text, lexical, content_hash,"
            " embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    org_id,
                    memory_id,
                    revision,
                    p.seq,
                    p.text,
                    p.lexical,
                    p.content_hash,
                    p.embedding,
                )
                for p in passages
            ],
        )
        conn.executemany(
            "INSERT INTO passage_tokens SELECT rowid, ? FROM passages"
            " WHERE org_id = ? AND memory_id = ? AND seq = ?",
            [(p.tokens, org_id, memory_id, p.seq) for p in passages if p.tokens is not None],
        )
        _forget_embeddings(conn, {r["content_hash"] for r in replaced})
        _update_terms(
            conn,
            org_id,
            removed=old,
            added=[p.lexical for p in passages],
            old_audiences=() if current is None else current.audiences,
            new_audiences=draft.audiences,
        )
        # Supersession is a relation between live memories: recompute both directions.
        _relink_superseded(conn, org_id, memory_id)
        conn.executemany(
            "UPDATE memories SET superseded_by = ? WHERE org_id = ? AND id = ?",
            [(memory_id, org_id, target) for target in draft.supersedes],
        )
        _bump(conn, org_id)
        saved = _memory(
            conn.execute(
                "SELECT * FROM memories WHERE org_id = ? AND id = ?", (org_id, memory_id)
            ).fetchone()
        )

        return saved, True

    @staticmethod
    def _check_supersedes(
        conn: sqlite3.Connection,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        writer: frozenset[str] | None,
        kept: Sequence[str],
    ) -> MemoryDraft:
        targets = list(dict.fromkeys([*draft.supersedes, *kept]))
        marks = ", ".join("?" for _ in targets)
        rows = (
            conn.execute(
                "SELECT id, audiences, deleted_at IS NULL AS live FROM memories"
                f" WHERE org_id = ? AND id IN ({marks})",
                (org_id, *targets),
            ).fetchall()
            if targets
            else []
        )
        stored = {r["id"]: (json.loads(r["audiences"]), bool(r["live"])) for r in rows}
        draft = settle_supersedes(memory_id, draft, stored, writer, kept)
        new = [t for t in draft.supersedes if t not in kept]
        if new:
            judge_cycle(memory_id, new, kept, _reached(conn, org_id, memory_id, new), writer)
        return draft

    def current_memory(self, org_id: str, memory_id: str) -> Memory | None:
        with translate_errors():
            row = (
                self._reader()
                .execute(
                    "SELECT * FROM memories WHERE org_id = ? AND id = ? AND deleted_at IS NULL",
                    (org_id, memory_id),
                )
                .fetchone()
            )
        return None if row is None else _memory(row)

    def delete_memory(
        self, org_id: str, memory_id: str, author: str | None, audiences: frozenset[str] | None
    ) -> None:
        now = time.time()
        params = {"org": org_id, "id": memory_id, **_audience_params(audiences)}
        with self._write() as conn:
            count = None if audiences is None else len(params) - 2
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {_managed_sql(count)} AND m.id = :id",
                params,
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            removed = conn.execute(
                "SELECT lexical, content_hash FROM passages WHERE org_id = ? AND memory_id = ?",
                (org_id, memory_id),
            ).fetchall()
            old = [r["lexical"] for r in removed]
            conn.execute(
                "DELETE FROM passages WHERE org_id = ? AND memory_id = ?", (org_id, memory_id)
            )
            _forget_embeddings(conn, {r["content_hash"] for r in removed})
            _update_terms(
                conn,
                org_id,
                removed=old,
                added=[],
                old_audiences=json.loads(row["audiences"]),
                new_audiences=(),
            )
            # The history keeps a tombstone, not the text.
            conn.execute(
                "UPDATE memory_revisions SET title = NULL, body = NULL WHERE org_id = ? AND id = ?",
                (org_id, memory_id),
            )
            conn.execute(
                "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author)"
                " VALUES (?, ?, ?, 'delete', ?, ?)",
                (org_id, memory_id, row["revision"] + 1, now, author),
            )
            conn.execute(
                "UPDATE memories SET deleted_at = ?, revision = revision + 1, title = NULL,"
                " body = NULL, updated_at = ? WHERE org_id = ? AND id = ?",
                (now, now, org_id, memory_id),
            )
            _relink_superseded(conn, org_id, memory_id)
            _bump(conn, org_id)

    def get_memory(self, org_id: str, memory_id: str, audiences: frozenset[str] | None) -> Memory:
        params = {"org": org_id, "id": memory_id, "now": time.time(), **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 3
        with self._read() as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {_managed_sql(count)} AND m.id = :id", params
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            (memory,) = _as_read(conn, org_id, [_memory(row)], audiences)
        return memory

    def list_memories(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        limit: int,
        cursor: str | None = None,
        source: str | None = None,
        tag: str | None = None,
        source_prefix: str | None = None,
    ) -> tuple[list[Memory], str | None]:
        params: dict[str, object] = {"org": org_id, **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 1
        sql = f"SELECT m.* FROM memories m WHERE {_managed_sql(count)}"
        if cursor:
            sql += " AND m.id > :cursor"
            params["cursor"] = cursor
        if source:
            sql += " AND m.source = :source"
            params["source"] = source
        if source_prefix:
            sql += " AND substr(m.source, 1, length(:prefix)) = :prefix"
            params["prefix"] = source_prefix
        if tag:
            sql += " AND EXISTS (SELECT 1 FROM json_each(m.tags) WHERE json_each.value = :tag)"
            params["tag"] = tag
        sql += " ORDER BY m.id LIMIT :limit"
        params["limit"] = limit + 1
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
            items = _as_read(conn, org_id, [_memory(r) for r in rows[:limit]], audiences)
        return items, (items[-1].id if len(rows) > limit else None)

    def history(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> list[Revision]:
        params: dict[str, object] = {"org": org_id, "id": memory_id, **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 2
        with self._read() as conn:
            # Listed to the keys that may read the memory: a deleted one keeps the audiences
            # of its last live revision, so deleting it shows its tombstone to nobody new.
            sql = "SELECT 1 FROM memories m WHERE m.org_id = :org AND m.id = :id"
            if count is not None:
                names = ", ".join(f":a{i}" for i in range(count))
                sql += (
                    " AND EXISTS (SELECT 1 FROM memory_audiences ma"
                    " WHERE ma.org_id = m.org_id AND ma.memory_id = m.id"
                    f" AND ma.audience IN ({names}))"
                )
            if conn.execute(sql, params).fetchone() is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            rows = conn.execute(history_sql(count), params).fetchall()
            return _as_read(conn, org_id, [_revision(r) for r in rows], audiences)

    def pinned(self, org_id: str, audiences: frozenset[str], now: datetime) -> list[Memory]:
        params = {"org": org_id, "now": now.timestamp(), **_audience_params(audiences)}
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT m.* FROM memories m WHERE {visible_sql(len(params) - 2)}"
                " AND m.pinned = 1 ORDER BY m.updated_at DESC LIMIT 20",
                params,
            ).fetchall()
            return _as_read(conn, org_id, [_memory(r) for r in rows], audiences)

    # -- search --------------------------------------------------------------
    def lexical_search(
        self,
        org_id: str,
        audiences: frozenset[str],
        now: datetime,
        terms: Sequence[str],
        limit: int,
    ) -> list[tuple[int, float]]:
        if not terms:
            return []
        with self._read() as conn:
            total, df = self._doc_freq(conn, org_id, terms)
            params = {
                "org": org_id,
                "now": now.timestamp(),
                "match": fts_match(
                    self._match_org(conn, org_id, total), candidate_terms(terms, df, total)
                ),
                "limit": limit,
                "fetch": limit * 4,
                **_audience_params(audiences),
            }
            sql = lexical_sql(len(params) - 5)
            while True:
                rows = conn.execute(sql, params).fetchall()
                if len(rows) >= limit:
                    break
                # Few rows left after the access filter: widen the inner page until it
                # holds every match, so no candidate of this org is ever cut off.
                inner = conn.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM passages_fts WHERE passages_fts MATCH"
                    " :match LIMIT :fetch)",
                    {"match": params["match"], "fetch": params["fetch"]},
                ).fetchone()[0]
                if inner < params["fetch"]:
                    break
                params["fetch"] *= 4
        return [(r[0], -r[1]) for r in rows]  # FTS5's bm25() is negative: flip so higher is better

    @staticmethod
    def _match_org(conn: sqlite3.Connection, org_id: str, total: int) -> str | None:
        """The org column for an FTS5 match, or None for an org that holds most passages."""
        everyone = conn.execute("SELECT sum(passage_count) FROM orgs").fetchone()[0] or 0
        return None if total >= DOMINANT_SHARE * everyone else org_id

    def seen_doc_freq(
        self, org_id: str, audiences: frozenset[str], now: datetime, terms: Sequence[str], cap: int
    ) -> tuple[int, dict[str, int]]:
        params = {"org": org_id, "now": now.timestamp(), "cap": cap, **_audience_params(audiences)}
        sql = (
            "SELECT count(*) FROM (SELECT 1 FROM passages_fts"
            " JOIN passages p NOT INDEXED ON p.rowid = passages_fts.rowid"
            " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
            " WHERE passages_fts MATCH :match AND p.org_id = :org"
            f" AND {visible_sql(len(params) - 3)} LIMIT :cap)"
        )
        with self._read() as conn:
            total, _ = self._doc_freq(conn, org_id, [])
            org = self._match_org(conn, org_id, total)
            counts = {
                t: conn.execute(sql, {**params, "match": fts_match(org, [t])}).fetchone()[0]
                for t in terms
            }
            return self._audience_total(conn, org_id, audiences), counts

    @staticmethod
    def _audience_total(conn: sqlite3.Connection, org_id: str, audiences: frozenset[str]) -> int:
        """The passages of the org's memories whose audiences meet `audiences`: a sum over
        the org's few audience sets (`audience_totals`)."""
        params = {"org": org_id, **_audience_params(audiences)}
        names = ", ".join(f":a{i}" for i in range(len(params) - 1))
        return conn.execute(
            "SELECT coalesce(sum(t.passage_count), 0) FROM audience_totals t"
            " WHERE t.org_id = :org AND EXISTS (SELECT 1 FROM json_each(t.audiences)"
            f" WHERE json_each.value IN ({names}))",
            params,
        ).fetchone()[0]

    def semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]:
        return self.vectors.search(
            org_id,
            self.generation(org_id),
            functools.partial(self._vector_rows, org_id),
            functools.partial(self._stored_vectors, org_id),
            vector,
            audiences | {EVERYONE},
            now.timestamp(),
            limit,
        )

    def _stored_vectors(self, org_id: str, rowids: list[int]) -> list[tuple[int, bytes]]:
        """(rowid, embedding) of those of `rowids` that are still the org's passages (SQLite
        hands the highest rowid out again after a delete)."""
        ids = ", ".join(str(int(r)) for r in rowids)
        with translate_errors():
            return (
                self._reader()
                .execute(
                    f"SELECT rowid, embedding FROM passages NOT INDEXED WHERE rowid IN ({ids})"
                    " AND org_id = ?",
                    (org_id,),
                )
                .fetchall()
            )

    def _vector_rows(self, org_id: str) -> list[tuple[int, bytes, float | None, str]]:
        with translate_errors():
            return (
                self._reader()
                .execute(
                    "SELECT p.rowid, p.embedding, m.valid_until,"
                    " (SELECT group_concat(audience) FROM memory_audiences ma"
                    "   WHERE ma.org_id = m.org_id AND ma.memory_id = m.id)"
                    " FROM passages p JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                    " WHERE p.org_id = ? AND m.deleted_at IS NULL AND m.superseded_by IS NULL",
                    (org_id,),
                )
                .fetchall()
            )

    def passages(
        self, org_id: str, audiences: frozenset[str], now: datetime, rowids: Sequence[int]
    ) -> list[Passage]:
        if not rowids:
            return []
        params: dict[str, object] = {
            "org": org_id,
            "now": now.timestamp(),
            **_audience_params(audiences),
        }
        count = len(params) - 2
        ids = ", ".join(str(int(r)) for r in rowids)
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT p.rowid, p.memory_id, p.revision, p.seq, p.text, p.lexical, m.title,"
                    " m.source, m.updated_at, m.supersedes, p.embedding,"
                    f" ({PASSAGE_COUNT_SQL}) AS passage_count"
                    " FROM passages p NOT INDEXED"
                    " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                    f" WHERE p.rowid IN ({ids}) AND p.org_id = :org AND {visible_sql(count)}",
                    params,
                )
                .fetchall()
            )
        return [
            Passage(
                rowid=r["rowid"],
                memory_id=r["memory_id"],
                revision=r["revision"],
                seq=r["seq"],
                title=r["title"],
                source=r["source"],
                text=r["text"],
                lexical=r["lexical"],
                updated_at=_dt(r["updated_at"]),  # type: ignore[arg-type]
                supersedes=tuple(json.loads(r["supersedes"])),
                embedding=r["embedding"],
                passage_count=r["passage_count"],
            )
            for r in rows
        ]

    # -- token matrices (relay.late) ------------------------------------------
    def token_matrices(self, org_id: str, rowids: Sequence[int]) -> dict[int, bytes]:
        if not rowids:
            return {}
        ids = ", ".join(str(int(r)) for r in rowids)
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT t.rowid, t.tokens FROM passage_tokens t"
                    # NOT INDEXED: with many ids the planner would walk the org's index
                    # (12 ms for 80 ids at 100k passages, against 1.7 ms by rowid).
                    " JOIN passages p NOT INDEXED ON p.rowid = t.rowid"
                    f" WHERE t.rowid IN ({ids}) AND p.org_id = ?",
                    (org_id,),
                )
                .fetchall()
            )
        return {r[0]: r[1] for r in rows}

    def missing_tokens(self, limit: int, after: int = 0) -> list[tuple[int, str | None, str]]:
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT p.rowid, m.title, p.text FROM passages p"
                    " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                    " WHERE p.rowid > ?"
                    " AND NOT EXISTS (SELECT 1 FROM passage_tokens t WHERE t.rowid = p.rowid)"
                    " ORDER BY p.rowid LIMIT ?",
                    (after, limit),
                )
                .fetchall()
            )
        return [(r["rowid"], r["title"], r["text"]) for r in rows]

    def store_tokens(self, items: Sequence[tuple[int, bytes]]) -> None:
        # A passage replaced or deleted since it was read is skipped, not revived.
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO passage_tokens SELECT rowid, ? FROM passages"
                " WHERE rowid = ?",
                [(blob, rowid) for rowid, blob in items],
            )

    def doc_freq(self, org_id: str, terms: Sequence[str]) -> tuple[int, dict[str, int]]:
        with self._read() as conn:
            return self._doc_freq(conn, org_id, terms)

    @staticmethod
    def _doc_freq(
        conn: sqlite3.Connection, org_id: str, terms: Sequence[str]
    ) -> tuple[int, dict[str, int]]:
        total = conn.execute("SELECT passage_count FROM orgs WHERE id = ?", (org_id,)).fetchone()
        rows = []
        if terms:
            marks = ", ".join("?" for _ in terms)
            rows = conn.execute(
                f"SELECT term, df FROM org_terms WHERE org_id = ? AND term IN ({marks})",
                (org_id, *terms),
            ).fetchall()
        return (0 if total is None else total[0]), {r[0]: r[1] for r in rows}

    def generation(self, org_id: str) -> int:
        with translate_errors():
            row = (
                self._reader()
                .execute("SELECT generation FROM orgs WHERE id = ?", (org_id,))
                .fetchone()
            )
        return -1 if row is None else row[0]

    def next_expiry(self, org_id: str, now: datetime) -> datetime | None:
        with translate_errors():
            row = (
                self._reader()
                .execute(
                    "SELECT min(valid_until) FROM memories WHERE org_id = ? AND deleted_at IS NULL"
                    " AND valid_until > ?",
                    (org_id, now.timestamp()),
                )
                .fetchone()
            )
        return _dt(row[0])

    # -- embedding cache -----------------------------------------------------
    def cached_embeddings(self, model: str, hashes: Sequence[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        conn = self._reader()
        with translate_errors():
            for start in range(0, len(hashes), 500):
                chunk = list(hashes[start : start + 500])
                marks = ", ".join("?" for _ in chunk)
                for h, blob in conn.execute(
                    "SELECT content_hash, embedding FROM embedding_cache WHERE model = ?"
                    f" AND content_hash IN ({marks})",
                    (model, *chunk),
                ):
                    found[h] = blob
        return found

    def cache_embeddings(self, model: str, items: dict[str, bytes]) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO embedding_cache VALUES (?, ?, ?)",
                [(model, h, blob) for h, blob in items.items()],
            )

    def forget_unheld_embeddings(self) -> int:
        with self._write() as conn:
            return conn.execute(
                "DELETE FROM embedding_cache WHERE NOT EXISTS"
                " (SELECT 1 FROM passages p WHERE p.content_hash = embedding_cache.content_hash)"
            ).rowcount


# -- helpers -----------------------------------------------------------------
def _split_script(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements, buf = [], []
    for line in script.splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            statements.append(joined)
            buf = []
    if "\n".join(buf).strip():
        statements.append("\n".join(buf))
    return statements


def _managed_sql(audience_count: int | None) -> str:
    """Management reads see expired and superseded memories too (so they can be tended)."""
    clauses = ["m.org_id = :org", "m.deleted_at IS NULL"]
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            f" AND ma.memory_id = m.id AND ma.audience IN ({names}))"
        )
    return " AND ".join(clauses)


def _as_read(
    conn: sqlite3.Connection,
    org_id: str,
    items: Sequence[Read],
    audiences: frozenset[str] | None,
) -> list[Read]:
    """`items` as a reader of `audiences` sees them (`rules.as_read`): their links to
    memories it may not read (a deleted one by its last audiences) withheld. None: an
    admin management read, which sees every link."""
    ids = sorted(linked_ids(items))
    if audiences is None or not ids:
        return list(items)
    readable = _readable(conn, org_id, ids, audiences)
    return [as_read(item, readable) for item in items]


def _readable(
    conn: sqlite3.Connection, org_id: str, ids: Sequence[str], audiences: frozenset[str]
) -> set[str]:
    """Which of `ids` name memories of the org, live or deleted, that `audiences` read."""
    reader = sorted(audiences | {EVERYONE})
    found: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        sql = (
            "SELECT DISTINCT memory_id FROM memory_audiences WHERE org_id = ?"
            f" AND memory_id IN ({', '.join('?' * len(chunk))})"
            f" AND audience IN ({', '.join('?' * len(reader))})"
        )
        found.update(r[0] for r in conn.execute(sql, (org_id, *chunk, *reader)))
    return found


def _reached(
    conn: sqlite3.Connection, org_id: str, memory_id: str, targets: Sequence[str]
) -> dict[str, tuple[list[str], list[str]]]:
    """The org's live memories `targets` reach by following `supersedes` (every link,
    whoever may read it), not past `memory_id`: each one's (supersedes, audiences)."""
    rows = conn.execute(
        "WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(:targets)"
        " UNION SELECT j.value FROM reach JOIN memories m ON m.org_id = :org AND m.id = reach.id"
        " AND m.deleted_at IS NULL, json_each(m.supersedes) j WHERE reach.id != :me)"
        " SELECT m.id, m.supersedes, m.audiences FROM reach JOIN memories m"
        " ON m.org_id = :org AND m.id = reach.id AND m.deleted_at IS NULL",
        {"targets": json.dumps(list(targets)), "org": org_id, "me": memory_id},
    ).fetchall()
    return {r["id"]: (json.loads(r["supersedes"]), json.loads(r["audiences"])) for r in rows}


def _relink_superseded(conn: sqlite3.Connection, org_id: str, memory_id: str) -> None:
    """Point each memory `memory_id` was marked as superseding (before this edit or delete,
    already saved) at the latest-written live memory that still supersedes it, or at none:
    two memories may supersede one, and losing one of them must not bring it back."""
    conn.execute(
        "UPDATE memories SET superseded_by = ("
        " SELECT s.id FROM memories s, json_each(s.supersedes) j"
        " WHERE s.org_id = memories.org_id AND s.deleted_at IS NULL"
        " AND s.supersedes != '[]' AND j.value = memories.id"
        " ORDER BY s.updated_at DESC, s.id LIMIT 1)"
        " WHERE org_id = ? AND superseded_by = ?",
        (org_id, memory_id),
    )


def _bump(conn: sqlite3.Connection, org_id: str) -> None:
    conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org_id,))


def _audience_key(audiences: Iterable[str]) -> str:
    """A memory's audiences as a key of `audience_totals`: sorted, distinct, a JSON array in
    the form SQLite's json_group_array writes (migration 5's backfill builds it so)."""
    return json.dumps(sorted(set(audiences)), separators=(",", ":"), ensure_ascii=False)


def _update_terms(
    conn: sqlite3.Connection,
    org_id: str,
    removed: Sequence[str],
    added: Sequence[str],
    old_audiences: Sequence[str],
    new_audiences: Sequence[str],
) -> None:
    """Keep the org's own document frequencies, so scoring never mixes in another tenant's
    text, and its passage totals: the org's, and each audience set's, so that a reader's
    total leaves out what it may not read. `removed` were passages of a memory for
    `old_audiences`, `added` are passages of one for `new_audiences`."""
    delta: Counter[str] = Counter()
    for lexical in removed:
        delta.subtract(set(lexical.split()))
    for lexical in added:
        delta.update(set(lexical.split()))
    changes = [(org_id, t, d) for t, d in delta.items() if d]
    conn.executemany(
        "INSERT INTO org_terms (org_id, term, df) VALUES (?, ?, ?)"
        " ON CONFLICT (org_id, term) DO UPDATE SET df = df + excluded.df",
        changes,
    )
    dropped = [t for t, d in delta.items() if d < 0]
    for start in range(0, len(dropped), 500):
        chunk = dropped[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        conn.execute(
            f"DELETE FROM org_terms WHERE org_id = ? AND term IN ({marks}) AND df <= 0",
            (org_id, *chunk),
        )
    conn.execute(
        "UPDATE orgs SET passage_count = passage_count + ? WHERE id = ?",
        (len(added) - len(removed), org_id),
    )
    totals: Counter[str] = Counter()
    totals[_audience_key(old_audiences)] -= len(removed)
    totals[_audience_key(new_audiences)] += len(added)
    conn.executemany(
        "INSERT INTO audience_totals (org_id, audiences, passage_count) VALUES (?, ?, ?)"
        " ON CONFLICT (org_id, audiences) DO UPDATE"
        " SET passage_count = passage_count + excluded.passage_count",
        [(org_id, key, d) for key, d in totals.items() if d],
    )
    if any(d < 0 for d in totals.values()):
        conn.execute(
            "DELETE FROM audience_totals WHERE org_id = ? AND passage_count <= 0", (org_id,)
        )


def _forget_embeddings(conn: sqlite3.Connection, hashes: set[str]) -> None:
    """Drop from the embedding cache the texts of `hashes` no passage holds any more (every
    model's entry: vector and token matrix), in the transaction that removed them: a
    deleted text's embedding must not outlive it. A text another memory, or org, still
    holds keeps its entry. (A write of the same text racing the delete may cache it again
    after; `forget_unheld_embeddings` drops such entries at start-up.)"""
    ordered = sorted(hashes)
    for start in range(0, len(ordered), 500):
        chunk = ordered[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        conn.execute(
            f"DELETE FROM embedding_cache WHERE content_hash IN ({marks}) AND NOT EXISTS"
            " (SELECT 1 FROM passages p WHERE p.content_hash = embedding_cache.content_hash)",
            chunk,
        )


def _org(row: sqlite3.Row) -> Org:
    return Org(id=row["id"], name=row["name"], created_at=_dt(row["created_at"]))  # type: ignore[arg-type]


def _key(row: sqlite3.Row) -> ApiKey:
    return ApiKey(
        id=row["id"],
        org_id=row["org_id"],
        name=row["name"],
        scopes=frozenset(json.loads(row["scopes"])),
        roles=frozenset(json.loads(row["roles"])),
        created_at=_dt(row["created_at"]),  # type: ignore[arg-type]
        expires_at=_dt(row["expires_at"]),
        revoked_at=_dt(row["revoked_at"]),
    )


def _memory(row: sqlite3.Row) -> Memory:
    return Memory(
        org_id=row["org_id"],
        id=row["id"],
        revision=row["revision"],
        body=row["body"],
        title=row["title"],
        source=row["source"],
        audiences=tuple(json.loads(row["audiences"])),
        tags=tuple(json.loads(row["tags"])),
        author=row["author"],
        created_at=_dt(row["created_at"]),  # type: ignore[arg-type]
        updated_at=_dt(row["updated_at"]),  # type: ignore[arg-type]
        valid_until=_dt(row["valid_until"]),
        supersedes=tuple(json.loads(row["supersedes"])),
        pinned=bool(row["pinned"]),
        superseded_by=row["superseded_by"],
    )


def _revision(row: sqlite3.Row) -> Revision:
    def loads(v: str | None) -> tuple[str, ...]:
        return () if v is None else tuple(json.loads(v))

    return Revision(
        id=row["id"],
        revision=row["revision"],
        action=row["action"],
        recorded_at=_dt(row["recorded_at"]),  # type: ignore[arg-type]
        author=row["author"],
        title=row["title"],
        body=row["body"],
        source=row["source"],
        audiences=loads(row["audiences"]),
        tags=loads(row["tags"]),
        valid_until=_dt(row["valid_until"]),
        supersedes=loads(row["supersedes"]),
        withheld=bool(row["withheld"]),
    )
