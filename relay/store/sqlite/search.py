"""The search stages: lexical candidates (FTS5, BM25), vector candidates (the
in-memory `VectorIndex`), the passages behind them, and the document frequencies, the
org's and as one reader may see them, that ranking reads."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from relay.models import EVERYONE, Passage
from relay.store import PASSAGE_COUNT_SQL, candidate_terms
from relay.store.sqlite.connection import SQLiteConnections, translate_errors
from relay.store.sqlite.reads import _audience_params, visible_sql
from relay.store.sqlite.rows import _dt
from relay.store.vector_index import VectorIndex


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


class SearchStages(SQLiteConnections):
    """What search asks of the store (mixed into `SQLiteStore`, which sets `vectors`)."""

    vectors: VectorIndex

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
            fetch = limit * 4  # the inner page of FTS5 matches, widened while too few pass
            params = {
                "org": org_id,
                "now": now.timestamp(),
                "match": fts_match(
                    self._match_org(conn, org_id, total), candidate_terms(terms, df, total)
                ),
                "limit": limit,
                "fetch": fetch,
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
                    {"match": params["match"], "fetch": fetch},
                ).fetchone()[0]
                if inner < fetch:
                    break
                fetch *= 4
                params["fetch"] = fetch
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
        self._check_file()  # every request reads this: /healthz fails once the file is gone
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
