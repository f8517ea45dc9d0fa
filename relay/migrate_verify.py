"""`relay migrate`'s check: per-table row counts and checksums of both sides.

Each table's rows are brought to one canonical tuple from either store
(`relay.migrate_columns`: times as ISO strings, JSON lists as lists, blobs as their
SHA-256), hashed row by row, and the sorted hashes hashed again: an order-independent
digest that two stores holding the same rows agree on. The copy uses the same canonical
form to find the passages that differ.

A token matrix is compared where the source holds one: a passage the source holds none for
(a file from before them, or one whose backfill had not finished) gets its own on the
target from the server's backfill, made from the same text, which is the target's and no
difference.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.migrate_columns import blob_digest, canonical, from_postgres, from_sqlite, names

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


def has_tokens(src: sqlite3.Connection) -> bool:
    """Whether the source stores token matrices (stores from before them do not)."""
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'passage_tokens'"
    return src.execute(query).fetchone() is not None


def _tokens_held(src: sqlite3.Connection, org: str) -> set[tuple[str, int]]:
    """The (memory, seq) of the org's passages the source holds a token matrix for."""
    if not has_tokens(src):
        return set()
    query = (
        "SELECT p.memory_id, p.seq FROM passage_tokens t JOIN passages p ON p.rowid = t.rowid"
        " WHERE p.org_id = ?"
    )
    return {(r["memory_id"], r["seq"]) for r in src.execute(query, (org,))}


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
    # Imported here: `relay.store` loads numpy, and every `relay` command imports this
    # module, so at the top it loaded numpy before `relay serve` and `relay bench` could pin
    # BLAS to one thread (search at 100k memories: p50 17 -> 28 ms).
    from relay.store.sqlite.totals import COUNT_AUDIENCE_SETS

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
            # Not copied but counted on the target from the passages and audiences copied
            # (the source may predate them: SQLite migration 5), as here on the source.
            query = f"{COUNT_AUDIENCE_SETS} WHERE p.org_id IN ({marks}) GROUP BY p.org_id, 2"
            args = tuple(org_ids)
        else:
            col = "id" if table == "orgs" else "org_id"
            query, args = f"SELECT * FROM {table} WHERE {col} IN ({marks})", tuple(org_ids)
        rows = src.execute(query, args)
        out[table] = _summarise(canonical(table, from_sqlite(table, r)) for r in rows)
    return out


def target_sums(
    store: PostgresStore,
    org_ids: list[str],
    cache_keys: list[tuple[str, str]],
    tokens_held: Callable[[str], set[tuple[str, int]]],
) -> dict[str, TableSum]:
    """Read per org (row-level security shows one org per transaction); of the token
    matrices, those of the passages `tokens_held(org)` names (the source's)."""
    rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in TABLES}
    for org in org_ids:
        held = tokens_held(org)
        with store._tx(org) as conn, conn.cursor(binary=True) as cur:
            for table in TABLES[:-1]:
                if table == "passage_tokens":
                    query = f"{_PG_TOKENS} WHERE p.org_id = %s"
                else:
                    col = "id" if table == "orgs" else "org_id"
                    query = f"SELECT {names(table)} FROM {table} WHERE {col} = %s"
                for r in cur.execute(query, (org,)):
                    if table == "passage_tokens" and (r["memory_id"], r["seq"]) not in held:
                        continue
                    rows[table].append(canonical(table, from_postgres(table, r)))
    models = sorted({m for m, _ in cache_keys})
    with store._tx() as conn:
        for model in models:
            hashes = [h for m, h in cache_keys if m == model]
            for r in conn.execute(
                "SELECT * FROM embedding_cache WHERE model = %s AND content_hash = ANY(%s)",
                (model, hashes),
            ):
                cached = from_postgres("embedding_cache", r)
                rows["embedding_cache"].append(canonical("embedding_cache", cached))
    return {t: _summarise(rows[t]) for t in TABLES}


def changed_passages(conn: Any, org: str, ids: list[str], source: list[sqlite3.Row]) -> list[str]:
    """The memories whose passages (with embeddings and token matrices, compared as the
    verification compares them) differ between the source rows and the target, a passage the
    source holds no matrix for alike whatever matrix the target has made for it (`_alike`):
    a re-run after the target's backfill replaced every passage of a file from before them,
    and threw those matrices away."""
    want: dict[str, list[tuple[Any, ...]]] = {}
    for p in source:
        row = canonical("passages", from_sqlite("passages", p))
        want.setdefault(p["memory_id"], []).append((*row, blob_digest(p["tokens"])))
    have: dict[str, list[tuple[Any, ...]]] = {}
    with conn.cursor(binary=True) as cur:
        for p in cur.execute(
            f"SELECT {names('passages')}, t.tokens FROM passages p"
            " LEFT JOIN passage_tokens t ON t.passage_id = p.id"
            " WHERE p.org_id = %s AND p.memory_id = ANY(%s) ORDER BY p.memory_id, p.seq",
            (org, ids),
        ):
            row = canonical("passages", from_postgres("passages", p))
            have.setdefault(p["memory_id"], []).append((*row, blob_digest(p["tokens"])))
    return [m for m in ids if not _alike(want.get(m), have.get(m))]


def _alike(want: list[tuple[Any, ...]] | None, have: list[tuple[Any, ...]] | None) -> bool:
    """One memory's passages, each with its matrix's digest last: the same, but for the
    matrix of a passage the source holds none for (`want`'s None)."""
    if want is None or have is None or len(want) != len(have):
        return want == have
    return all(w[:-1] == h[:-1] and w[-1] in (None, h[-1]) for w, h in zip(want, have, strict=True))


def verify(src: sqlite3.Connection, store: PostgresStore) -> list[tuple[str, TableSum, TableSum]]:
    org_ids = [r["id"] for r in src.execute("SELECT id FROM orgs ORDER BY id")]
    cache_keys = [
        (r["model"], r["content_hash"])
        for r in src.execute(SQLITE_CACHE.format("model, content_hash"))
    ]
    left = source_sums(src, org_ids)
    right = target_sums(store, org_ids, cache_keys, lambda org: _tokens_held(src, org))
    return [(t, left[t], right[t]) for t in TABLES]


def render(report: list[tuple[str, TableSum, TableSum]]) -> str:
    lines = [f"{'table':<18} {'source rows':>11} {'target rows':>11}  checksum (source / target)"]
    for table, a, b in report:
        mark = "ok" if (a.rows, a.digest) == (b.rows, b.digest) else "DIFFERS"
        lines.append(
            f"{table:<18} {a.rows:>11} {b.rows:>11}  {a.digest[:16]} / {b.digest[:16]}  {mark}"
        )
    return "\n".join(lines)
