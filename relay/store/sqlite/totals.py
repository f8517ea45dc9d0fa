"""The per-org counts lexical scoring reads, kept by every write: each term's
passages (`org_terms`), the org's passages, and each audience set's (`audience_totals`)."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence


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
