"""What the embedder derived, kept beside the passages: cached embeddings by model
and content hash, and each passage's token matrix for late interaction (`relay.late`),
with the backfill of matrices for passages stored before they existed."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.sqlite.connection import SQLiteConnections, translate_errors
from relay.store.sqlite.reads import _audience_params, _managed_sql


class EmbeddingsAndTokens(SQLiteConnections):
    """Token matrices and the embedding cache (mixed into `SQLiteStore`)."""

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

    def cached_embeddings(
        self,
        model: str,
        hashes: Sequence[str],
        org_id: str | None = None,
        audiences: frozenset[str] | None = None,
    ) -> dict[str, bytes]:
        held = ""
        scope: dict[str, object] = {}
        if org_id is not None:  # only texts the writer could read anyway: see `Store`
            scope = {"org": org_id, **_audience_params(audiences)}
            count = None if audiences is None else len(scope) - 1
            held = (
                " AND EXISTS (SELECT 1 FROM passages p JOIN memories m"
                " ON m.org_id = p.org_id AND m.id = p.memory_id"
                f" WHERE p.content_hash = c.content_hash AND {_managed_sql(count)})"
            )
        found: dict[str, bytes] = {}
        conn = self._reader()
        with translate_errors():
            for start in range(0, len(hashes), 500):
                chunk = {f"h{i}": h for i, h in enumerate(hashes[start : start + 500])}
                marks = ", ".join(f":{name}" for name in chunk)
                for h, blob in conn.execute(
                    "SELECT c.content_hash, c.embedding FROM embedding_cache c"
                    f" WHERE c.model = :model AND c.content_hash IN ({marks}){held}",
                    {"model": model, **chunk, **scope},
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
