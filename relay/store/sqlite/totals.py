"""The per-org counts lexical scoring reads, kept by every write: each term's
passages (`org_terms`), the org's passages, and each audience set's (`audience_totals`);
and the start-up repair of the last two where a server of an older release left them apart."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence

from relay.store import DRIFTED_TOTALS_SQL

log = logging.getLogger("relay.store.sqlite")

# The passages of each audience set, counted from the passages and their memories'
# audiences as migration 5's backfill counts them; the caller adds its WHERE and
# `GROUP BY p.org_id, 2`. `relay migrate`'s check counts a source so too.
COUNT_AUDIENCE_SETS = (
    "SELECT p.org_id, coalesce(s.audiences, '[]') AS audiences, count(*) AS passage_count"
    " FROM passages p LEFT JOIN (SELECT DISTINCT org_id, memory_id, json_group_array(audience)"
    " OVER (PARTITION BY org_id, memory_id ORDER BY audience ROWS BETWEEN UNBOUNDED PRECEDING"
    " AND UNBOUNDED FOLLOWING) AS audiences FROM memory_audiences) AS s"
    " ON s.org_id = p.org_id AND s.memory_id = p.memory_id"
)


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


def repair_passage_totals(conn: sqlite3.Connection) -> None:
    """Count again, from its passages, the org's passages and each audience set's, for every
    org whose sets no longer add up to its count, so that they do after (one cheap
    comparison when nothing drifted). A server of a release from before migration 5 started
    on this file after an upgrade (a rollback) keeps the org's count and its terms, but not
    the sets' totals searches weigh words by; PostgreSQL mends the same at every start
    (`postgres.totals._repair_passage_totals`). A drift that kept the sum (an edit moving a
    memory to other audiences alone) is not seen: finding it takes a recount of every
    passage at every start."""
    drifted = conn.execute(DRIFTED_TOTALS_SQL).fetchall()
    for org_id, passages, counted in drifted:
        (now,) = conn.execute(
            "SELECT count(*) FROM passages WHERE org_id = ?", (org_id,)
        ).fetchone()
        conn.execute("UPDATE orgs SET passage_count = ? WHERE id = ?", (now, org_id))
        conn.execute("DELETE FROM audience_totals WHERE org_id = ?", (org_id,))
        conn.execute(
            "INSERT INTO audience_totals (org_id, audiences, passage_count)"
            f" {COUNT_AUDIENCE_SETS} WHERE p.org_id = ? GROUP BY p.org_id, 2",
            (org_id,),
        )
        log.warning(
            "org %s: its passage totals disagreed (audience sets %d, org %d: left by a server"
            " of an older release on this file); counted again from its passages: %d",
            org_id,
            counted,
            passages,
            now,
        )
