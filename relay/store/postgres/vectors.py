"""The vector search stage, and the HNSW index around bulk loads.

The HNSW index covers the whole table and pgvector 0.6 filters its results afterwards,
so an org that is a small share of the table would get too few. Orgs up to `exact_max`
passages are searched exactly (distances computed for all of the org's vectors, read
from a covering index), in this replica's memory when they fit its vector cache; larger
ones go through HNSW with `hnsw.ef_search` raised in proportion to the org's share, and
fall back to the exact scan when the share is too small or too few rows come back.
"""

from __future__ import annotations

import functools
import math
import time
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from relay.models import EVERYONE
from relay.store import connect_by
from relay.store.postgres.connection import (
    CACHE_IDLE_S,
    INCARNATION,
    PASSAGE_BYTES,
    PgConnection,
    PostgresConnections,
    Vector,
)
from relay.store.postgres.failures import translate_errors
from relay.store.postgres.reads import _params, visible_sql
from relay.store.vector_index import VectorIndex

DIM = 384
MAX_EF_SEARCH = 1000  # pgvector's ceiling for hnsw.ef_search
EF_FACTOR = 6  # ef_search = EF_FACTOR * limit / the org's share of the table (measured)
SHORTLIST_FACTOR = 4  # exact vector scan: nearest passages per wanted result, before the filter


def exact_vector_sql() -> str:
    """The org's passages nearest by true cosine distance, then the recall filter.

    The distances come from the org's vectors alone, read together from the covering
    btree `passages_org_vectors` (an index-only scan once the table is vacuumed), not
    from rows scattered over the heap; only the nearest `shortlist` are then joined to
    their memories and filtered. While at least `limit` of them survive the filter,
    they are exactly the top `limit` visible passages; otherwise `exact_filtered_sql`.
    `+ 0` keeps the planner off the HNSW index (which would post-filter).
    """
    return (
        "SELECT c.id, 1 - c.d AS cosine FROM (SELECT p.id, (p.embedding <=> %(q)s) + 0 AS d"
        " FROM passages p WHERE p.org_id = %(org)s ORDER BY 2, p.id LIMIT %(shortlist)s) AS c"
        " JOIN passages p ON p.id = c.id"
        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
        f" WHERE {visible_sql(True)} ORDER BY c.d, c.id LIMIT %(limit)s"
    )


def exact_filtered_sql() -> str:
    """Every visible passage of the org ranked by true cosine distance: the exact answer
    when the recall filter hides much of the org's nearest passages."""
    return (
        "SELECT p.id, 1 - (p.embedding <=> %(q)s) AS cosine FROM passages p"
        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
        f" WHERE p.org_id = %(org)s AND {visible_sql(True)}"
        " ORDER BY (p.embedding <=> %(q)s) + 0, p.id LIMIT %(limit)s"
    )


def hnsw_vector_sql() -> str:
    """Nearest passages through the HNSW index, then the recall filter on what came back."""
    return (
        "SELECT c.id, 1 - c.d AS cosine FROM (SELECT p.id, p.memory_id, p.embedding <=> %(q)s AS d"
        " FROM passages p WHERE p.org_id = %(org)s ORDER BY p.embedding <=> %(q)s"
        " LIMIT %(ef)s) AS c JOIN memories m ON m.org_id = %(org)s AND m.id = c.memory_id"
        f" WHERE {visible_sql(True)} ORDER BY c.d, c.id LIMIT %(limit)s"
    )


def ef_search_for(limit: int, org_rows: int, table_rows: float) -> int | None:
    """The `hnsw.ef_search` that should leave `limit` of the org's rows after filtering,
    or None when even pgvector's maximum would not (the org is too small a share)."""
    if table_rows <= 0 or org_rows <= 0:
        return None
    share = min(1.0, org_rows / table_rows)
    ef = math.ceil(EF_FACTOR * limit / share)
    return max(ef, 40) if ef <= MAX_EF_SEARCH else None


def _exact(conn: PgConnection, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The exact vector answer: from the shortlist when enough of it is visible."""
    # One core scans an org's narrow index faster than a parallel plan gathers and sorts
    # wide rows (measured at 1M passages: BENCHMARKS.md, PostgreSQL).
    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    limit = params["limit"]
    shortlist = {**params, "shortlist": SHORTLIST_FACTOR * limit}
    rows = conn.execute(exact_vector_sql(), shortlist).fetchall()
    if len(rows) < limit:
        rows = conn.execute(exact_filtered_sql(), params).fetchall()
    return rows


class VectorSearch(PostgresConnections):
    """Vector search and the HNSW index (mixed into `PostgresStore`, which sets `vectors`
    and `exact_max`)."""

    vectors: VectorIndex | None
    exact_max: int

    def semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]:
        with self._tx(org_id) as conn:
            ef, generation, org_rows = self._ef_search(conn, org_id, limit)
            # A small org is searched in this replica's memory when its vectors fit there.
            in_memory = (
                ef is None
                and self.vectors is not None
                and self.vectors.admit(org_id, org_rows * PASSAGE_BYTES, CACHE_IDLE_S)
            )
            if not in_memory:
                params = _params(org_id, audiences, now=now, q=Vector.of(vector), limit=limit)
                rows: list[dict[str, Any]] = []
                if ef is not None:
                    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                    rows = conn.execute(hnsw_vector_sql(), {**params, "ef": ef}).fetchall()
                if len(rows) < limit:  # too few survived the filter: the exact answer instead
                    rows = _exact(conn, params)
                return [(r["id"], float(r["cosine"])) for r in rows]
        assert self.vectors is not None
        return self.vectors.search(
            org_id,
            generation,
            functools.partial(self._vector_rows, org_id),
            functools.partial(self._stored_vectors, org_id),
            vector,
            audiences | {EVERYONE},
            now.timestamp(),
            limit,
        )

    def _ef_search(
        self, conn: PgConnection, org_id: str, limit: int
    ) -> tuple[int | None, int, int]:
        """(None: search the org exactly, else the ef_search HNSW needs; the org's
        generation; its passages)."""
        row = conn.execute(
            f"SELECT passage_count AS org_rows, generation, {INCARNATION}, (SELECT reltuples"
            " FROM pg_class WHERE oid = 'passages'::regclass) AS table_rows FROM orgs"
            " WHERE id = %s",
            (org_id,),
        ).fetchone()
        if row is None:
            return None, -1, 0
        org_rows, generation = row["org_rows"], self._versioned(row)
        if org_rows <= self.exact_max:
            return None, generation, org_rows
        return ef_search_for(limit, org_rows, row["table_rows"]), generation, org_rows

    def _stored_vectors(self, org_id: str, ids: list[int]) -> list[tuple[int, bytes]]:
        """(id, embedding) of those of `ids` that are still the org's passages."""
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT id, embedding FROM passages WHERE org_id = %s AND id = ANY(%s)",
                (org_id, ids),
            ).fetchall()
        return [(r["id"], r["embedding"]) for r in rows]

    def _vector_rows(self, org_id: str) -> list[tuple[int, bytes, float | None, str]]:
        """Every live, current passage's vector, expiry and audiences (as `visible_sql`
        would filter them, expiry and audience left to the in-memory scan). The replica's
        copy they make serves every later search, so they load past the deadline of the
        search that happened to start it."""
        with connect_by(None), self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT p.id, p.embedding, extract(epoch FROM m.valid_until)::float8 AS until,"
                " (SELECT string_agg(ma.audience, ',') FROM memory_audiences ma"
                "   WHERE ma.org_id = m.org_id AND ma.memory_id = m.id) AS audiences"
                " FROM passages p JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                " WHERE p.org_id = %s AND m.deleted_at IS NULL AND m.superseded_by IS NULL",
                (org_id,),
            ).fetchall()
        return [(r["id"], r["embedding"], r["until"], r["audiences"] or "") for r in rows]

    def vector_plan(self, org_id: str, limit: int = 40) -> str:
        """Which vector path an org's searches take: 'exact' or 'hnsw(ef_search=N)'."""
        with self._tx(org_id) as conn:
            ef, _, _ = self._ef_search(conn, org_id, limit)
        return "exact" if ef is None else f"hnsw(ef_search={ef})"

    def exact_semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]:
        """The exact answer, whatever the org's size: the yardstick for recall."""
        params = _params(org_id, audiences, now=now, q=Vector.of(vector), limit=limit)
        with self._tx(org_id) as conn:
            rows = _exact(conn, params)
        return [(r["id"], float(r["cosine"])) for r in rows]

    def drop_vector_index(self) -> None:
        """Bulk loads: drop the HNSW index (searches stay exact meanwhile) ..."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("DROP INDEX IF EXISTS passages_embedding")

    def vector_index_exists(self) -> bool:
        query = "SELECT 1 FROM pg_class WHERE oid = to_regclass('passages_embedding')"
        with self._tx() as conn:
            return conn.execute(query).fetchone() is not None

    def holds_passages(self) -> bool:
        """Whether any org has passages, read as the owner (row-level security would hide
        every org's rows from a query that names none)."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM passages LIMIT 1").fetchone() is not None

    def build_vector_index(self, maintenance_work_mem: str = "1GB") -> float:
        """... and build it once afterwards: far faster than growing it row by row. Seconds."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(maintenance_work_mem))
            start = time.perf_counter()
            conn.execute(
                "CREATE INDEX IF NOT EXISTS passages_embedding ON passages"
                " USING hnsw (embedding vector_cosine_ops)"
            )
            took = time.perf_counter() - start
            # VACUUM as well: the exact scan reads only the covering index once the
            # visibility map marks the freshly loaded pages all-visible.
            conn.execute("VACUUM (ANALYZE) passages")
        return took
