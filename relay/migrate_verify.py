"""`relay migrate`'s check: per-table row counts and checksums of both sides.

Each table's rows are brought to one canonical tuple from either store (times as ISO
strings, JSON lists as lists, blobs as their SHA-256), hashed row by row, and the sorted
hashes hashed again: an order-independent digest that two stores holding the same rows
agree on. The copy uses the same canonical form to find the passages that differ.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.store.postgres import PostgresStore

# The tables copied and compared. `hook_outcomes` is neither (see `relay.migrate`): the
# reports developers sent are operational data, renewed by their next `relay stats --send`.
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
SQLITE_CACHE = (
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


def sqlite_time(value: float | None) -> datetime | None:
    """A time as the SQLite store reads it (`relay.store.sqlite.rows._dt`): one past
    `LATEST_TIME`, which Relay once stored rounded up to year 10000, as that."""
    from relay.hygiene import LATEST_TIME

    if value is None:
        return None
    return datetime.fromtimestamp(min(value, LATEST_TIME.timestamp()), UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")


def json_list(value: str | None) -> list[str] | None:
    return None if value is None else list(json.loads(value))


def revision_pinned(r: sqlite3.Row) -> bool | None:
    """Whether a source revision pinned its memory; None when not known (recorded before
    revisions kept it, where migration 8 could not tell, as `migrate.open_source` reads a
    file not opened since)."""
    return None if r["pinned"] is None else bool(r["pinned"])


def has_tokens(src: sqlite3.Connection) -> bool:
    """Whether the source stores token matrices (stores from before them do not)."""
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'passage_tokens'"
    return src.execute(query).fetchone() is not None


# -- canonical rows: the same tuple from either side, for counts and checksums -------
def _canon_sqlite(table: str, r: sqlite3.Row) -> tuple[Any, ...]:
    if table == "orgs":
        return (r["id"], r["name"], _iso(sqlite_time(r["created_at"])), r["passage_count"])
    if table == "api_keys":
        return (
            r["id"],
            r["org_id"],
            r["secret_hash"],
            r["name"],
            sorted(json.loads(r["scopes"])),
            sorted(json.loads(r["roles"])),
            *(_iso(sqlite_time(r[c])) for c in ("created_at", "expires_at", "revoked_at")),
        )
    if table == "memories":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["title"],
            r["body"],
            r["source"],
            json_list(r["tags"]),
            json_list(r["audiences"]),
            r["author"],
            *(_iso(sqlite_time(r[c])) for c in ("created_at", "updated_at", "valid_until")),
            json_list(r["supersedes"]),
            r["superseded_by"],
            bool(r["pinned"]),
            _iso(sqlite_time(r["deleted_at"])),
        )
    if table == "memory_revisions":
        return (
            r["org_id"],
            r["id"],
            r["revision"],
            r["action"],
            _iso(sqlite_time(r["recorded_at"])),
            r["author"],
            r["title"],
            r["body"],
            r["source"],
            json_list(r["tags"]),
            json_list(r["audiences"]),
            _iso(sqlite_time(r["valid_until"])),
            json_list(r["supersedes"]),
            revision_pinned(r),
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
            r["pinned"],
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
            query, args = SQLITE_CACHE.format("*"), ()
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


def changed_passages(conn: Any, org: str, ids: list[str], source: list[sqlite3.Row]) -> list[str]:
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
        for r in src.execute(SQLITE_CACHE.format("model, content_hash"))
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
