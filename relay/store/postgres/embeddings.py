"""What the embedder derived, kept beside the passages: cached embeddings by model
and content hash, and each passage's token matrix for late interaction (`relay.late`),
with the backfill of matrices for passages stored before they existed (found across
orgs by definer functions, read and written under each org's own policy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relay.store.postgres.connection import PgConnection, PostgresConnections, one_row
from relay.store.postgres.reads import _params, managed_sql


class EmbeddingsAndTokens(PostgresConnections):
    """Token matrices and the embedding cache (mixed into `PostgresStore`)."""

    def token_matrices(self, org_id: str, rowids: Sequence[int]) -> dict[int, bytes]:
        if not rowids:
            return {}
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT t.passage_id, t.tokens FROM passage_tokens t"
                " JOIN passages p ON p.id = t.passage_id"
                " WHERE t.passage_id = ANY(%s) AND p.org_id = %s",
                ([int(r) for r in rowids], org_id),
            ).fetchall()
        return {r["passage_id"]: r["tokens"] for r in rows}

    def missing_tokens(self, limit: int, after: int = 0) -> list[tuple[int, str | None, str]]:
        """(passage id, title, text) of up to `limit` passages of any org without a token
        matrix, lowest id above `after` first: found across orgs by `relay_missing_tokens`
        (ids only), their text read under each org's own policy."""
        if limit <= 0:
            return []
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, org_id FROM relay_missing_tokens(%s, %s)", (limit, after)
            ).fetchall()
        found: list[tuple[int, str | None, str]] = []
        for org_id, ids in _by_org(rows).items():
            with self._tx(org_id) as conn:
                found += [
                    (r["id"], r["title"], r["text"])
                    for r in conn.execute(
                        "SELECT p.id, m.title, p.text FROM passages p"
                        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                        " WHERE p.org_id = %s AND p.id = ANY(%s)",
                        (org_id, ids),
                    )
                ]
        return sorted(found, key=lambda f: f[0])

    def store_tokens(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Token matrices for passages of any org, skipping passages gone since and those
        that have one. Each org's are written under its write lock, so no edit can delete a
        passage between the check and the insert. The generation stays: a matrix adds a
        feature to a passage's ranking, it changes no memory, and a bump would make every
        replica reload the org's vectors once per backfill batch."""
        tokens = {int(i): t for i, t in items}
        if not tokens:
            return
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, org_id FROM relay_passage_orgs(%s)", (list(tokens),)
            ).fetchall()
        for org_id, ids in _by_org(rows).items():
            with self._write(org_id) as conn:
                conn.execute(
                    "INSERT INTO passage_tokens (passage_id, tokens) SELECT t.id, t.tokens"
                    " FROM unnest(%s::bigint[], %s::bytea[]) AS t(id, tokens)"
                    " JOIN passages p ON p.id = t.id AND p.org_id = %s"
                    " ON CONFLICT (passage_id) DO NOTHING",
                    (ids, [tokens[i] for i in ids], org_id),
                )

    def cached_embeddings(
        self,
        model: str,
        hashes: Sequence[str],
        org_id: str | None = None,
        audiences: frozenset[str] | None = None,
    ) -> dict[str, bytes]:
        if not hashes:
            return {}
        held = ""
        params: dict[str, Any] = {"model": model, "hashes": list(hashes)}
        if org_id is not None:  # only texts the writer could read anyway: see `Store`
            params |= _params(org_id, audiences)
            held = (
                " AND EXISTS (SELECT 1 FROM passages p JOIN memories m"
                " ON m.org_id = p.org_id AND m.id = p.memory_id"
                f" WHERE p.content_hash = c.content_hash AND {managed_sql(audiences)})"
            )
        with self._tx(org_id) as conn:
            rows = conn.execute(
                "SELECT c.content_hash, c.embedding FROM embedding_cache c"
                f" WHERE c.model = %(model)s AND c.content_hash = ANY(%(hashes)s){held}",
                params,
            ).fetchall()
        return {r["content_hash"]: bytes(r["embedding"]) for r in rows}

    def cache_embeddings(self, model: str, items: dict[str, bytes]) -> None:
        if not items:
            return
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO embedding_cache (model, content_hash, embedding)"
                " SELECT %s, h, e FROM unnest(%s::text[], %s::bytea[]) AS t(h, e)"
                " ON CONFLICT DO NOTHING",
                (model, list(items), list(items.values())),
            )

    def forget_unheld_embeddings(self) -> int:
        with self._tx() as conn:  # the definer function sees every org's passages
            return one_row(conn.execute("SELECT relay_forget_unheld_embeddings() AS n"))["n"]


def _forget_embeddings(conn: PgConnection, hashes: set[str]) -> None:
    """Drop from the embedding cache the texts of `hashes` no passage of any org holds any
    more (vector and token matrix), in the transaction that removed them: a deleted text's
    embedding must not outlive it (migration 6's function: the app role sees one org). A
    write of the same text racing the delete may cache it again after: see
    `forget_unheld_embeddings`, run at start-up."""
    if hashes:
        conn.execute("SELECT relay_forget_embeddings(%s::text[])", (sorted(hashes),))


def _by_org(rows: Sequence[Any]) -> dict[str, list[int]]:
    """Passage ids grouped by their org, from rows of (id, org_id)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["org_id"], []).append(r["id"])
    return out
