"""`relay migrate --from sqlite:///... --to postgresql://...`: move a store to PostgreSQL.

Copies, per organisation: the org, its keys (hashes only; secrets were never
stored), every memory with its full revision history (tombstones included),
audiences, passages with their embeddings and token matrices; then the org's
totals (passages, tokens, each term's and each audience set's passages) are
counted on the target from what it holds; then the shared embedding cache.
Nothing is re-embedded (a passage the source holds no token matrix for gets one
from the server's backfill).

Resumable: each batch is written in one transaction together with its progress
row (`migration_progress`: org, source, step, last id copied), so an
interrupted run restarts after the last committed batch; every write is an
upsert, so repeating a batch changes nothing. A finished run clears its progress,
so the next one goes over every org again and brings the target up to date
(rewriting only the passages that differ). Verifiable: row counts and a
SHA-256 over a canonical form of each table are printed for both sides, and the
command fails when any differs.

The source is read through its own connection in read-only mode; the target is
written through the PostgreSQL store's connections, as the application role,
under row-level security, so a migration cannot write one org's rows into
another's.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import click

from relay.errors import InvalidRequestError, StoreError

if TYPE_CHECKING:
    from relay.store.postgres import PostgresStore

TABLES = (
    "orgs",
    "api_keys",
    "memories",
    "memory_audiences",
    "memory_revisions",
    "passages",
    "passage_tokens",
    "org_terms",
    "audience_totals",
    "embedding_cache",
)
# Token matrices hang off passages, whose ids differ between the two stores: they are
# read, and compared, through the passage they belong to.
_SQLITE_TOKENS = (
    "SELECT p.org_id, p.memory_id, p.seq, t.tokens FROM passage_tokens t"
    " JOIN passages p ON p.rowid = t.rowid"
)
# The cache entries copied: texts some passage holds. A deleted memory's embedding is not
# carried on (a source from before migration 6 may still keep them); IN builds its lookup once.
_SQLITE_CACHE = (
    "SELECT {} FROM embedding_cache WHERE content_hash IN (SELECT content_hash FROM passages)"
)
_PG_TOKENS = (
    "SELECT p.org_id, p.memory_id, p.seq, t.tokens FROM passage_tokens t"
    " JOIN passages p ON p.id = t.passage_id"
)
# Each audience set's passages are not copied but counted on the target from the passages
# and audiences copied (the source may predate them: SQLite migration 5), and compared with
# the same count on the source.
_SQLITE_AUDIENCE_TOTALS = (
    "SELECT p.org_id, coalesce(s.audiences, '[]') AS audiences, count(*) AS passage_count"
    " FROM passages p LEFT JOIN (SELECT DISTINCT org_id, memory_id, json_group_array(audience)"
    " OVER (PARTITION BY org_id, memory_id ORDER BY audience ROWS BETWEEN UNBOUNDED PRECEDING"
    " AND UNBOUNDED FOLLOWING) AS audiences FROM memory_audiences) AS s"
    " ON s.org_id = p.org_id AND s.memory_id = p.memory_id"
)


def _dt(value: float | None) -> datetime | None:
    """A time as the SQLite store reads it (`relay.store.sqlite._dt`): one past
    `LATEST_TIME`, which Relay once stored rounded up to year 10000, as that."""
    from relay.hygiene import LATEST_TIME

    if value is None:
        return None
    return datetime.fromtimestamp(min(value, LATEST_TIME.timestamp()), UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")


def _json_list(value: str | None) -> list[str] | None:
    return None if value is None else list(json.loads(value))


def has_tokens(src: sqlite3.Connection) -> bool:
    """Whether the source stores token matrices (stores from before them do not)."""
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'passage_tokens'"
    return src.execute(query).fetchone() is not None


def open_source(url: str) -> sqlite3.Connection:
    """The source, read-only, once it is known to be a Relay store."""
    from relay.store import database_kind, open_relay_file

    if database_kind(url) != "sqlite":
        raise InvalidRequestError("--from must be a sqlite:///path or a file path")
    conn = open_relay_file(url)
    conn.row_factory = sqlite3.Row
    return conn


# -- canonical rows: the same tuple from either side, for counts and checksums -------
def _canon_sqlite(table: str, r: sqlite3.Row) -> tuple[Any, ...]:
    if table == "orgs":
        return (r["id"], r["name"], _iso(_dt(r["created_at"])), r["passage_count"])
    if table == "api_keys":
        return (
            r["id"],
            r["org_id"],
            r["secret_hash"],
            r["name"],
            sorted(json.loads(r["scopes"])),
            sorted(json.loads(r["roles"])),
            *(_iso(_dt(r[c])) for c in ("created_at", "expires_at", "revoked_at")),
        )
    if table == "memories":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["title"],
            r["body"],
            r["source"],
            _json_list(r["tags"]),
            _json_list(r["audiences"]),
            r["author"],
            *(_iso(_dt(r[c])) for c in ("created_at", "updated_at", "valid_until")),
            _json_list(r["supersedes"]),
            r["superseded_by"],
            bool(r["pinned"]),
            _iso(_dt(r["deleted_at"])),
        )
    if table == "memory_revisions":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["action"],
            _iso(_dt(r["recorded_at"])),
            r["author"],
            r["title"],
            r["body"],
            r["source"],
            _json_list(r["tags"]),
            _json_list(r["audiences"]),
            _iso(_dt(r["valid_until"])),
            _json_list(r["supersedes"]),
        )
    if table == "passages":
        return (
            r["org_id"],
            r["memory_id"],
            r["revision"],
            r["seq"],
            r["text"],
            r["lexical"],
            r["content_hash"],
            hashlib.sha256(r["embedding"]).hexdigest(),
        )
    if table == "passage_tokens":
        return (r["org_id"], r["memory_id"], r["seq"], hashlib.sha256(r["tokens"]).hexdigest())
    if table == "embedding_cache":
        return (r["model"], r["content_hash"], hashlib.sha256(r["embedding"]).hexdigest())
    if table == "audience_totals":
        return (r["org_id"], json.loads(r["audiences"]), r["passage_count"])
    return tuple(r)  # memory_audiences, org_terms


def _canon_pg(table: str, r: dict[str, Any]) -> tuple[Any, ...]:
    if table == "orgs":
        return (r["id"], r["name"], _iso(r["created_at"]), r["passage_count"])
    if table == "api_keys":
        return (
            r["id"],
            r["org_id"],
            r["secret_hash"],
            r["name"],
            sorted(r["scopes"]),
            sorted(r["roles"]),
            *(_iso(r[c]) for c in ("created_at", "expires_at", "revoked_at")),
        )
    if table == "memories":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["title"],
            r["body"],
            r["source"],
            r["tags"],
            r["audiences"],
            r["author"],
            *(_iso(r[c]) for c in ("created_at", "updated_at", "valid_until")),
            r["supersedes"],
            r["superseded_by"],
            r["pinned"],
            _iso(r["deleted_at"]),
        )
    if table == "memory_revisions":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["action"],
            _iso(r["recorded_at"]),
            r["author"],
            r["title"],
            r["body"],
            r["source"],
            r["tags"],
            r["audiences"],
            _iso(r["valid_until"]),
            r["supersedes"],
        )
    if table == "passages":
        return (
            r["org_id"],
            r["memory_id"],
            r["revision"],
            r["seq"],
            r["text"],
            r["lexical"],
            r["content_hash"],
            hashlib.sha256(r["embedding"]).hexdigest(),
        )
    if table == "passage_tokens":
        return (
            r["org_id"],
            r["memory_id"],
            r["seq"],
            hashlib.sha256(bytes(r["tokens"])).hexdigest(),
        )
    if table == "embedding_cache":
        return (r["model"], r["content_hash"], hashlib.sha256(bytes(r["embedding"])).hexdigest())
    if table == "audience_totals":
        return (r["org_id"], list(r["audiences"]), r["passage_count"])
    return tuple(r.values())


_PG_COLUMNS = {
    "memory_audiences": "org_id, memory_id, audience",
    "org_terms": "org_id, term, df",
    "passages": "org_id, memory_id, revision, seq, text, lexical, content_hash, embedding",
}


@dataclass
class TableSum:
    rows: int
    digest: str


def _summarise(rows: Iterable[tuple[Any, ...]]) -> TableSum:
    """Order-independent: a sorted list of per-row hashes, hashed."""
    hashes = sorted(
        hashlib.sha256(json.dumps(r, ensure_ascii=False).encode()).digest() for r in rows
    )
    return TableSum(len(hashes), hashlib.sha256(b"".join(hashes)).hexdigest())


def source_sums(src: sqlite3.Connection, org_ids: list[str]) -> dict[str, TableSum]:
    out = {}
    marks = ", ".join("?" for _ in org_ids)
    args: tuple[str, ...]
    for table in TABLES:
        if table == "embedding_cache":
            query, args = _SQLITE_CACHE.format("*"), ()
        elif table == "passage_tokens":
            if not has_tokens(src):
                out[table] = _summarise([])
                continue
            query, args = f"{_SQLITE_TOKENS} WHERE p.org_id IN ({marks})", tuple(org_ids)
        elif table == "audience_totals":
            query = f"{_SQLITE_AUDIENCE_TOTALS} WHERE p.org_id IN ({marks}) GROUP BY p.org_id, 2"
            args = tuple(org_ids)
        else:
            col = "id" if table == "orgs" else "org_id"
            query, args = f"SELECT * FROM {table} WHERE {col} IN ({marks})", tuple(org_ids)
        out[table] = _summarise(_canon_sqlite(table, r) for r in src.execute(query, args))
    return out


def target_sums(
    store: PostgresStore, org_ids: list[str], cache_keys: list[tuple[str, str]]
) -> dict[str, TableSum]:
    """Read per org (row-level security shows one org per transaction)."""
    rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in TABLES}
    for org in org_ids:
        with store._tx(org) as conn, conn.cursor(binary=True) as cur:
            for table in TABLES[:-1]:
                if table == "passage_tokens":
                    query = f"{_PG_TOKENS} WHERE p.org_id = %s"
                else:
                    col = "id" if table == "orgs" else "org_id"
                    query = f"SELECT {_PG_COLUMNS.get(table, '*')} FROM {table} WHERE {col} = %s"
                for r in cur.execute(query, (org,)):
                    rows[table].append(_canon_pg(table, r))
    models = sorted({m for m, _ in cache_keys})
    with store._tx() as conn:
        for model in models:
            hashes = [h for m, h in cache_keys if m == model]
            for r in conn.execute(
                "SELECT * FROM embedding_cache WHERE model = %s AND content_hash = ANY(%s)",
                (model, hashes),
            ):
                rows["embedding_cache"].append(_canon_pg("embedding_cache", r))
    return {t: _summarise(rows[t]) for t in TABLES}


# -- copying ---------------------------------------------------------------------
class Migration:
    def __init__(
        self,
        src: sqlite3.Connection,
        store: PostgresStore,
        source_name: str,
        batch: int = 500,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.src, self.store, self.source = src, store, source_name
        self.batch = batch
        self.say = progress or (lambda _m: None)
        self.tokens = has_tokens(src)

    def org_ids(self) -> list[str]:
        return [r["id"] for r in self.src.execute("SELECT id FROM orgs ORDER BY id")]

    def run(self) -> None:
        orgs = self.org_ids()
        self.check_org_names_are_free()
        for org in orgs:
            self.copy_org(org)
        self.copy_embedding_cache()
        self.forget_progress(orgs)

    def check_org_names_are_free(self) -> None:
        """Before writing anything: a target org holding a source org's name under another
        id (`relay serve` creates `default` on its first start) would stop the copy halfway."""
        taken = {o.name: o.id for o in self.store.list_orgs()}
        for o in self.src.execute("SELECT id, name FROM orgs ORDER BY name"):
            if taken.get(o["name"], o["id"]) != o["id"]:
                raise InvalidRequestError(
                    f"the target already has an organisation named {o['name']!r} of its own"
                    " (did `relay serve` run on it?): migrate into an empty database, before"
                    " the first `relay serve` on it"
                )

    def forget_progress(self, orgs: list[str]) -> None:
        """A finished pass leaves nothing to resume, so the next run copies every org again
        and brings the target up to date with whatever the source changed since."""
        for org in orgs:
            with self.store._tx(org) as conn:
                conn.execute(
                    "DELETE FROM migration_progress WHERE org_id = %s AND source = %s",
                    (org, self.source),
                )

    def _progress(self, conn: Any, org: str, step: str) -> tuple[str | None, bool]:
        row = conn.execute(
            "SELECT position, done FROM migration_progress"
            " WHERE org_id = %s AND source = %s AND step = %s",
            (org, self.source, step),
        ).fetchone()
        return (None, False) if row is None else (row["position"], row["done"])

    def _mark(self, conn: Any, org: str, step: str, position: str | None, done: bool) -> None:
        conn.execute(
            "INSERT INTO migration_progress (org_id, source, step, position, done)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (org_id, source, step) DO UPDATE"
            " SET position = excluded.position, done = excluded.done, updated_at = now()",
            (org, self.source, step, position, done),
        )

    def copy_org(self, org: str) -> None:
        o = self.src.execute("SELECT * FROM orgs WHERE id = ?", (org,)).fetchone()
        with self.store._tx(org) as conn:
            conn.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET name = excluded.name",
                (org, o["name"], _dt(o["created_at"])),
            )
            if self._progress(conn, org, "org")[1]:
                self.say(f"{o['name']}: already copied")
                return
            keys = self.src.execute("SELECT * FROM api_keys WHERE org_id = ?", (org,)).fetchall()
            for k in keys:
                conn.execute(
                    "INSERT INTO api_keys (id, org_id, secret_hash, name, scopes, roles,"
                    " created_at, expires_at, revoked_at) VALUES"
                    " (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                    " revoked_at = excluded.revoked_at, expires_at = excluded.expires_at",
                    (
                        k["id"],
                        org,
                        k["secret_hash"],
                        k["name"],
                        sorted(json.loads(k["scopes"])),
                        sorted(json.loads(k["roles"])),
                        _dt(k["created_at"]),
                        _dt(k["expires_at"]),
                        _dt(k["revoked_at"]),
                    ),
                )
        copied = self.copy_memories(org, o["name"])
        with self.store._tx(org) as conn:
            self.finish_org(conn, org, o)
            self._mark(conn, org, "org", None, True)
        self.say(f"{o['name']}: {copied} memories copied")

    def copy_memories(self, org: str, name: str) -> int:
        with self.store._tx(org) as conn:
            after, done = self._progress(conn, org, "memories")
        if done:
            return 0
        copied = 0
        while True:
            ids = [
                r[0]
                for r in self.src.execute(
                    "SELECT id FROM memories WHERE org_id = ? AND id > ? ORDER BY id LIMIT ?",
                    (org, after or "", self.batch),
                )
            ]
            if not ids:
                break
            with self.store._tx(org) as conn:
                self._copy_batch(conn, org, ids)
                after = ids[-1]
                self._mark(conn, org, "memories", after, False)
            copied += len(ids)
            self.say(f"{name}: {copied} memories")
        with self.store._tx(org) as conn:
            self._mark(conn, org, "memories", after, True)
        return copied

    def _copy_batch(self, conn: Any, org: str, ids: list[str]) -> None:
        marks = ", ".join("?" for _ in ids)
        args = (org, *ids)
        memories = self.src.execute(
            f"SELECT * FROM memories WHERE org_id = ? AND id IN ({marks})", args
        ).fetchall()
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO memories (org_id, id, revision, title, body, source, tags, audiences,"
                " author, created_at, updated_at, valid_until, supersedes, superseded_by, pinned,"
                " deleted_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " %s, %s) ON CONFLICT (org_id, id) DO UPDATE SET revision = excluded.revision,"
                " title = excluded.title, body = excluded.body, source = excluded.source,"
                " tags = excluded.tags, audiences = excluded.audiences, author = excluded.author,"
                " created_at = excluded.created_at, updated_at = excluded.updated_at,"
                " valid_until = excluded.valid_until, supersedes = excluded.supersedes,"
                " superseded_by = excluded.superseded_by, pinned = excluded.pinned,"
                " deleted_at = excluded.deleted_at",
                [
                    (
                        org,
                        m["id"],
                        m["revision"],
                        m["title"],
                        m["body"],
                        m["source"],
                        _json_list(m["tags"]),
                        _json_list(m["audiences"]),
                        m["author"],
                        _dt(m["created_at"]),
                        _dt(m["updated_at"]),
                        _dt(m["valid_until"]),
                        _json_list(m["supersedes"]),
                        m["superseded_by"],
                        bool(m["pinned"]),
                        _dt(m["deleted_at"]),
                    )
                    for m in memories
                ],
            )
            cur.executemany(
                "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
                " title, body, source, tags, audiences, valid_until, supersedes) VALUES"
                " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (org_id, id, revision) DO UPDATE SET title = excluded.title,"
                " body = excluded.body",
                [
                    (
                        org,
                        r["id"],
                        r["revision"],
                        r["action"],
                        _dt(r["recorded_at"]),
                        r["author"],
                        r["title"],
                        r["body"],
                        r["source"],
                        _json_list(r["tags"]),
                        _json_list(r["audiences"]),
                        _dt(r["valid_until"]),
                        _json_list(r["supersedes"]),
                    )
                    for r in self.src.execute(
                        f"SELECT * FROM memory_revisions WHERE org_id = ? AND id IN ({marks})",
                        args,
                    )
                ],
            )
            conn.execute(
                "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = ANY(%s)",
                (org, ids),
            )
            cur.executemany(
                "INSERT INTO memory_audiences (org_id, memory_id, audience) VALUES (%s, %s, %s)",
                [
                    tuple(r)
                    for r in self.src.execute(
                        "SELECT org_id, memory_id, audience FROM memory_audiences"
                        f" WHERE org_id = ? AND memory_id IN ({marks})",
                        args,
                    )
                ],
            )
        self._copy_passages(conn, org, ids)

    def _copy_passages(self, conn: Any, org: str, ids: list[str]) -> None:
        """The memories' passages, each with its token matrix if it has one. A memory's
        passages are replaced whole, and only when they differ from the target's: a re-run
        then rewrites what changed alone, since every passage written costs an insertion
        into the HNSW index."""
        from relay.store.postgres import Vector, insert_passages

        tokens = (
            "t.tokens FROM passages p LEFT JOIN passage_tokens t ON t.rowid = p.rowid"
            if self.tokens
            else "NULL AS tokens FROM passages p"
        )
        passages = self.src.execute(
            f"SELECT p.*, {tokens} WHERE p.org_id = ?"
            f" AND p.memory_id IN ({', '.join('?' for _ in ids)}) ORDER BY p.memory_id, p.seq",
            (org, *ids),
        ).fetchall()
        changed = _changed_passages(conn, org, ids, passages)
        if not changed:
            return
        # Their old token matrices go with them (ON DELETE CASCADE).
        conn.execute(
            "DELETE FROM passages WHERE org_id = %s AND memory_id = ANY(%s)", (org, changed)
        )
        passages = [p for p in passages if p["memory_id"] in changed]
        rows = [
            (
                org,
                p["memory_id"],
                p["revision"],
                p["seq"],
                p["text"],
                p["lexical"],
                len(p["lexical"].split()),
                p["content_hash"],
                Vector.of(p["embedding"]),
            )
            for p in passages
        ]
        with conn.cursor() as cur:
            insert_passages(cur, rows, [p["tokens"] for p in passages])

    def finish_org(self, conn: Any, org: str, o: sqlite3.Row) -> None:
        """The org's totals (its passages and tokens, each term's and each audience set's
        passages) counted on the target from what it holds, the source's copies and what
        the target took itself since an earlier run alike: copied from the source, they
        would leave out the latter. The generation moves past the source's."""
        from relay.store.postgres import recount_passage_totals

        conn.execute("SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org,))
        recount_passage_totals(conn, org)
        conn.execute(
            "UPDATE orgs SET generation = greatest(generation, %s) + 1 WHERE id = %s",
            (o["generation"], org),
        )

    def copy_embedding_cache(self) -> int:
        copied = 0
        rows = self.src.execute(_SQLITE_CACHE.format("model, content_hash, embedding"))
        while chunk := rows.fetchmany(self.batch * 4):
            with self.store._tx() as conn:
                conn.execute(
                    "INSERT INTO embedding_cache (model, content_hash, embedding)"
                    " SELECT * FROM unnest(%s::text[], %s::text[], %s::bytea[])"
                    " ON CONFLICT DO NOTHING",
                    (
                        [r["model"] for r in chunk],
                        [r["content_hash"] for r in chunk],
                        [r["embedding"] for r in chunk],
                    ),
                )
            copied += len(chunk)
        self.say(f"embedding cache: {copied} vectors")
        return copied


def _changed_passages(conn: Any, org: str, ids: list[str], source: list[sqlite3.Row]) -> list[str]:
    """The memories whose passages (with embeddings and token matrices, compared as the
    verification compares them) differ between the source rows and the target."""
    want: dict[str, list[tuple[Any, ...]]] = {}
    for p in source:
        matrix = None if p["tokens"] is None else hashlib.sha256(p["tokens"]).hexdigest()
        want.setdefault(p["memory_id"], []).append((*_canon_sqlite("passages", p), matrix))
    have: dict[str, list[tuple[Any, ...]]] = {}
    with conn.cursor(binary=True) as cur:
        for p in cur.execute(
            f"SELECT {_PG_COLUMNS['passages']}, t.tokens FROM passages p"
            " LEFT JOIN passage_tokens t ON t.passage_id = p.id"
            " WHERE p.org_id = %s AND p.memory_id = ANY(%s) ORDER BY p.memory_id, p.seq",
            (org, ids),
        ):
            matrix = None if p["tokens"] is None else hashlib.sha256(p["tokens"]).hexdigest()
            have.setdefault(p["memory_id"], []).append((*_canon_pg("passages", p), matrix))
    return [m for m in ids if want.get(m) != have.get(m)]


def verify(src: sqlite3.Connection, store: PostgresStore) -> list[tuple[str, TableSum, TableSum]]:
    org_ids = [r["id"] for r in src.execute("SELECT id FROM orgs ORDER BY id")]
    cache_keys = [
        (r["model"], r["content_hash"])
        for r in src.execute(_SQLITE_CACHE.format("model, content_hash"))
    ]
    left = source_sums(src, org_ids)
    right = target_sums(store, org_ids, cache_keys)
    return [(t, left[t], right[t]) for t in TABLES]


def render(report: list[tuple[str, TableSum, TableSum]]) -> str:
    lines = [f"{'table':<18} {'source rows':>11} {'target rows':>11}  checksum (source / target)"]
    for table, a, b in report:
        mark = "ok" if (a.rows, a.digest) == (b.rows, b.digest) else "DIFFERS"
        lines.append(
            f"{table:<18} {a.rows:>11} {b.rows:>11}  {a.digest[:16]} / {b.digest[:16]}  {mark}"
        )
    return "\n".join(lines)


def _drop_vector_index_for_bulk_load(store: PostgresStore) -> None:
    """Only into an empty target: once it holds passages, searches use the index, and
    dropping it would leave them slow until a rebuild."""
    if not store.vector_index_exists():
        return  # an interrupted --defer-index run dropped it already
    if store.holds_passages():
        click.echo("keeping the vector index: the target already holds passages", err=True)
        return
    store.drop_vector_index()


def _restore_vector_index(store: PostgresStore) -> None:
    """Build the index when it is missing, whatever this run's flags: an interrupted
    --defer-index run may be resumed without the flag."""
    if store.vector_index_exists():
        return
    click.echo("building the vector index ...", err=True)
    store.build_vector_index()


@click.command("migrate")
@click.option(
    "--from", "source", required=True, help="The SQLite store to copy: sqlite:///path or a path."
)
@click.option("--to", "target", required=True, help="The PostgreSQL database: postgresql://...")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    help="Memories per transaction (and per resume point).",
)
@click.option("--verify-only", is_flag=True, help="Only compare counts and checksums.")
@click.option(
    "--defer-index",
    is_flag=True,
    help="Drop the vector index while copying and build it once at the end (much faster "
    "for large stores; searches meanwhile are exact and slower).",
)
def migrate(source: str, target: str, batch: int, verify_only: bool, defer_index: bool) -> None:
    """Copy a SQLite store into PostgreSQL: orgs, keys, memories with every revision,
    passages with their embeddings and token matrices. Resumable (re-run the same
    command) and verified by per-table counts and checksums."""
    from relay.store import database_kind, postgres_store, sqlite_path

    if database_kind(target) != "postgresql":
        raise InvalidRequestError("--to must be a postgresql:// URL")
    src = open_source(source)
    store = cast("PostgresStore", postgres_store(target))
    try:
        if not verify_only:
            t = time.perf_counter()
            if defer_index:
                _drop_vector_index_for_bulk_load(store)
            name = str(sqlite_path(source).resolve())
            Migration(src, store, name, batch, lambda m: click.echo(m, err=True)).run()
            _restore_vector_index(store)
            click.echo(f"copied in {time.perf_counter() - t:.1f} s", err=True)
        report = verify(src, store)
        click.echo(render(report))
        if any((a.rows, a.digest) != (b.rows, b.digest) for _, a, b in report):
            raise StoreError("the target differs from the source (see the table above)")
        click.echo("verified: every table matches")
    finally:
        store.close()
        src.close()
