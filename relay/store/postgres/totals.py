"""The per-org counts lexical scoring reads: each term's passages (`org_terms`), the
org's passages and tokens, and each audience set's passages (`audience_totals`).

Writes keep them (`_TermDelta`, applied once per transaction); `relay migrate` and the
start-up repair count them again from the passages (`recount_passage_totals`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg

from relay.store import DRIFTED_TOTALS_SQL
from relay.store.postgres.connection import log

# One org's passages per audience set, counted from its passages and audiences: the repair
# of `audience_totals` (`relay migrate` counts a copied org the same way).
_COUNT_AUDIENCE_TOTALS = (
    "INSERT INTO audience_totals (org_id, audiences, passage_count)"
    " SELECT %(org)s, coalesce(s.audiences, '{}'), count(*) FROM passages p LEFT JOIN"
    ' (SELECT memory_id, array_agg(audience COLLATE "C" ORDER BY audience COLLATE "C")'
    " AS audiences FROM memory_audiences WHERE org_id = %(org)s GROUP BY memory_id) AS s"
    " ON s.memory_id = p.memory_id WHERE p.org_id = %(org)s GROUP BY 2"
)


# Each term's passages in one org, as writes count them (`_TermDelta`: a passage's distinct
# words, split on spaces as `lexical` joins them).
_COUNT_ORG_TERMS = (
    "INSERT INTO org_terms (org_id, term, df) SELECT %(org)s, term, count(*) FROM"
    " (SELECT DISTINCT p.id, t.term FROM passages p, unnest(string_to_array(p.lexical, ' '))"
    " AS t(term) WHERE p.org_id = %(org)s AND t.term <> '') AS d GROUP BY term"
)


def recount_passage_totals(conn: psycopg.Connection[Any], org_id: str) -> None:
    """Count again, from one org's passages, every total writes keep of them: the org's
    passages and tokens, each term's passages (`org_terms`) and each audience set's
    (`audience_totals`). The caller holds the org's row lock (as every write does first),
    so no write lands between a delete and its count."""
    params = {"org": org_id}
    conn.execute(
        "UPDATE orgs SET passage_count = c.n, token_count = c.t FROM (SELECT count(*) AS n,"
        " coalesce(sum(token_count), 0) AS t FROM passages WHERE org_id = %(org)s) AS c"
        " WHERE id = %(org)s",
        params,
    )
    conn.execute("DELETE FROM org_terms WHERE org_id = %(org)s", params)
    conn.execute(_COUNT_ORG_TERMS, params)
    conn.execute("DELETE FROM audience_totals WHERE org_id = %(org)s", params)
    conn.execute(_COUNT_AUDIENCE_TOTALS, params)


def _repair_passage_totals(conn: psycopg.Connection) -> None:
    """Count again the totals of the orgs whose audience sets no longer add up to their
    passage count (`recount_passage_totals`), so that they do after. A replica on code
    from before migration 5, still writing during a rolling upgrade, keeps the org's count
    but not the per-set totals; a `relay migrate` that copied the source's count (before it
    counted on the target) left it wrong on a target that had taken writes of its own.
    Which one did is not known here. Every start mends what either left (one cheap
    comparison when nothing drifted)."""
    drifted = conn.execute(DRIFTED_TOTALS_SQL).fetchall()
    for org_id, passages, counted in drifted:
        with conn.transaction():
            conn.execute("SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org_id,))
            recount_passage_totals(conn, org_id)
            row = conn.execute("SELECT passage_count FROM orgs WHERE id = %s", (org_id,)).fetchone()
        log.warning(
            "org %s: its passage totals disagreed (audience sets %d, org %d: left by older"
            " code, a replica's writes during an upgrade or an earlier relay migrate);"
            " counted again from its passages: %d",
            org_id,
            counted,
            passages,
            row[0] if row else 0,
        )


def _audience_key(audiences: Sequence[str]) -> tuple[str, ...]:
    """A memory's audiences as a key of `audience_totals`: distinct, in code point order
    (bytewise UTF-8, COLLATE "C": the order migration 5's backfill builds it in)."""
    return tuple(sorted(set(audiences)))


class _TermDelta:
    """Per-org document frequencies and sizes (the org's passages and tokens, and each
    audience set's passages), summed over a transaction and applied once."""

    def __init__(self) -> None:
        self.df: Counter[str] = Counter()
        self.passages = 0
        self.tokens = 0
        self.audiences: Counter[tuple[str, ...]] = Counter()

    def change(
        self,
        removed: Sequence[str],
        added: Sequence[str],
        old_audiences: Sequence[str],
        new_audiences: Sequence[str],
    ) -> None:
        """`removed` were passages of a memory for `old_audiences`, `added` are passages of
        one for `new_audiences`."""
        self.audiences[_audience_key(old_audiences)] -= len(removed)
        self.audiences[_audience_key(new_audiences)] += len(added)
        for lexical in removed:
            tokens = lexical.split()
            self.df.subtract(set(tokens))
            self.passages -= 1
            self.tokens -= len(tokens)
        for lexical in added:
            tokens = lexical.split()
            self.df.update(set(tokens))
            self.passages += 1
            self.tokens += len(tokens)

    def apply(self, conn: psycopg.Connection[Any], org_id: str) -> None:
        changes = sorted((t, d) for t, d in self.df.items() if d)
        if changes:
            conn.execute(
                "INSERT INTO org_terms (org_id, term, df)"
                " SELECT %s, t, d FROM unnest(%s::text[], %s::int[]) AS c(t, d)"
                " ON CONFLICT (org_id, term) DO UPDATE SET df = org_terms.df + excluded.df",
                (org_id, [t for t, _ in changes], [d for _, d in changes]),
            )
            if any(d < 0 for _, d in changes):
                conn.execute(
                    "DELETE FROM org_terms WHERE org_id = %s AND term = ANY(%s) AND df <= 0",
                    (org_id, [t for t, d in changes if d < 0]),
                )
        if self.passages or self.tokens:
            conn.execute(
                "UPDATE orgs SET passage_count = passage_count + %s,"
                " token_count = token_count + %s WHERE id = %s",
                (self.passages, self.tokens, org_id),
            )
        totals = sorted((list(k), d) for k, d in self.audiences.items() if d)
        if totals:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO audience_totals (org_id, audiences, passage_count)"
                    " VALUES (%s, %s, %s) ON CONFLICT (org_id, audiences) DO UPDATE"
                    " SET passage_count = audience_totals.passage_count + excluded.passage_count",
                    [(org_id, k, d) for k, d in totals],
                )
            if any(d < 0 for _, d in totals):
                conn.execute(
                    "DELETE FROM audience_totals WHERE org_id = %s AND passage_count <= 0",
                    (org_id,),
                )
        self.df.clear()
        self.audiences.clear()
        self.passages = self.tokens = 0
