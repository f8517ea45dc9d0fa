"""The lexical search stage (BM25 over the org's own index keys), the passages behind
the candidates, and the document frequencies, the org's and as one reader may see them,
that ranking reads. The vector stage is `vectors`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from relay.models import Passage
from relay.store import PASSAGE_COUNT_SQL, candidate_terms
from relay.store.postgres.connection import INCARNATION, PostgresConnections, one_row
from relay.store.postgres.reads import _params, visible_sql

LEXICAL_BUDGET = 2000  # lexical candidates: rarest terms matching at most this many passages


def lexical_sql() -> str:
    """BM25 candidates of the transaction's org among the passages matching a `chosen`
    term, found through the org's own index keys (see `relay_lexical_org` in the
    migrations)."""
    return (
        "SELECT id, score FROM relay_lexical_org(%(chosen)s, %(terms)s,"
        " %(n)s, %(avgdl)s, %(aud)s, %(now)s, %(limit)s)"
    )


def within_budget(terms: Sequence[str], df: dict[str, int]) -> list[str]:
    """Of the candidate terms, the rarest whose document frequencies sum to at most
    `LEXICAL_BUDGET` passages (always at least one), so one query's lexical work is
    bounded however large the org grows. PostgreSQL scores each match row by row
    (unlike FTS5), so an OR of merely uncommon terms in a large org could still touch
    thousands of rows. Every query term still counts in a candidate's score, and an
    org's candidates are unchanged while its matches fit the budget.
    """
    chosen: list[str] = []
    spent = 0
    for term in sorted(terms, key=lambda t: df.get(t, 0)):
        cost = df.get(term, 0)
        if chosen and spent + cost > LEXICAL_BUDGET:
            break
        chosen.append(term)
        spent += cost
    return chosen


class SearchStages(PostgresConnections):
    """What search asks of the store, but vectors (mixed into `PostgresStore`)."""

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
        params = _params(org_id, audiences, now=now, terms=list(terms), limit=limit)
        with self._tx(org_id) as conn:
            stats = conn.execute(
                "SELECT passage_count, token_count FROM orgs WHERE id = %s", (org_id,)
            ).fetchone()
            if not stats or not stats["passage_count"]:
                return []
            n = stats["passage_count"]
            df = {
                r["term"]: r["df"]
                for r in conn.execute(
                    "SELECT term, df FROM org_terms WHERE org_id = %s AND term = ANY(%s)",
                    (org_id, list(terms)),
                )
            }
            params["n"] = float(n)
            params["avgdl"] = max(1.0, stats["token_count"] / n)
            params["chosen"] = within_budget(candidate_terms(terms, df, n), df)
            rows = conn.execute(lexical_sql(), params).fetchall()
        return [(r["id"], float(r["score"])) for r in rows]

    def passages(
        self, org_id: str, audiences: frozenset[str], now: datetime, rowids: Sequence[int]
    ) -> list[Passage]:
        if not rowids:
            return []
        params = _params(org_id, audiences, now=now, ids=[int(r) for r in rowids])
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT p.id, p.memory_id, p.revision, p.seq, p.text, p.lexical, m.title,"
                " m.source, m.updated_at, m.supersedes, p.embedding,"
                f" ({PASSAGE_COUNT_SQL}) AS passage_count FROM passages p"
                " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                f" WHERE p.id = ANY(%(ids)s) AND p.org_id = %(org)s AND {visible_sql(True)}",
                params,
            ).fetchall()
        return [
            Passage(
                rowid=r["id"],
                memory_id=r["memory_id"],
                revision=r["revision"],
                seq=r["seq"],
                title=r["title"],
                source=r["source"],
                text=r["text"],
                lexical=r["lexical"],
                updated_at=r["updated_at"],
                supersedes=tuple(r["supersedes"]),
                embedding=r["embedding"],
                passage_count=r["passage_count"],
            )
            for r in rows
        ]

    def seen_doc_freq(
        self, org_id: str, audiences: frozenset[str], now: datetime, terms: Sequence[str], cap: int
    ) -> tuple[int, dict[str, int]]:
        # Through the org's own lexeme keys (`relay_org_terms`, migration 2), as the lexical
        # stage finds its matches.
        sql = (
            "SELECT count(*) AS n FROM (SELECT 1 FROM passages p"
            " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
            " WHERE relay_org_terms(p.org_id, p.tsv) && ARRAY[%(org)s || ' ' || %(term)s]"
            f" AND p.org_id = %(org)s AND {visible_sql(True)} LIMIT %(cap)s) AS seen"
        )
        params = _params(org_id, audiences, now=now, cap=cap)
        with self._tx(org_id) as conn:
            # The reader's total: a sum over the org's few audience sets (`audience_totals`).
            total = one_row(
                conn.execute(
                    "SELECT coalesce(sum(passage_count), 0) AS n FROM audience_totals"
                    " WHERE org_id = %(org)s AND audiences && %(aud)s::text[]",
                    params,
                )
            )["n"]
            counts = {t: one_row(conn.execute(sql, {**params, "term": t}))["n"] for t in terms}
        return int(total), counts

    def doc_freq(self, org_id: str, terms: Sequence[str]) -> tuple[int, dict[str, int]]:
        with self._tx(org_id) as conn:
            total = conn.execute(
                "SELECT passage_count FROM orgs WHERE id = %s", (org_id,)
            ).fetchone()
            rows = (
                conn.execute(
                    "SELECT term, df FROM org_terms WHERE org_id = %s AND term = ANY(%s)",
                    (org_id, list(terms)),
                ).fetchall()
                if terms
                else []
            )
        return (0 if total is None else total["passage_count"]), {r["term"]: r["df"] for r in rows}

    def generation(self, org_id: str) -> int:
        with self._tx(org_id) as conn:
            row = conn.execute(
                f"SELECT generation, {INCARNATION} FROM orgs WHERE id = %s", (org_id,)
            ).fetchone()
        return -1 if row is None else self._versioned(row)

    def next_expiry(self, org_id: str, now: datetime) -> datetime | None:
        with self._tx(org_id) as conn:
            row = conn.execute(
                "SELECT min(valid_until) AS t FROM memories WHERE org_id = %s"
                " AND deleted_at IS NULL AND valid_until > %s",
                (org_id, now),
            ).fetchone()
        return None if row is None else row["t"]
