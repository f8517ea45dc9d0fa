"""Writing memories: save (one, or a batch in one transaction), delete, and the
supersession links between memories.

A save is judged by `relay.store.rules` (mode, revision, audiences, links, cycles) and
then writes the memory, its revision, its audiences and passages and both directions of
supersession, under its org's row lock; the org's counts (`totals`) are summed over the
transaction and applied once. A batch of distinct memories without supersession takes a
pipelined path (`_save_batch`) with the same checks and rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from relay.errors import ConflictError, NotFoundError, StoreError
from relay.models import Memory, MemoryDraft, PassageInput
from relay.store import SaveMode, batch_item
from relay.store.postgres.connection import (
    PgConnection,
    PostgresConnections,
    Vector,
    _bump,
    one_row,
)
from relay.store.postgres.embeddings import _forget_embeddings
from relay.store.postgres.reads import _as_read, _params, managed_sql
from relay.store.postgres.rows import _memory
from relay.store.postgres.totals import _TermDelta
from relay.store.rules import (
    LinkTarget,
    judge_audiences,
    judge_cycle,
    judge_format_characters,
    judge_replacement,
    judge_revision,
    judge_write,
    same_content,
    settle_expiry,
    settle_supersedes,
)


class MemoryWrites(PostgresConnections):
    """Saves and deletes of memories (mixed into `PostgresStore`)."""

    def save_memory(
        self,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None = None,
        audiences: frozenset[str] | None = None,
    ) -> tuple[Memory, bool]:
        expected = {} if expected_revision is None else {memory_id: expected_revision}
        (saved,) = self._save_many(
            org_id, [(memory_id, draft, passages)], author, mode, expected, audiences
        )
        return saved

    def save_memories(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        audiences: frozenset[str] | None = None,
        expected: Mapping[str, int] | None = None,
        known: Collection[str] | None = None,
    ) -> list[tuple[Memory, bool]]:
        """Many writes in one transaction: all land, or none do (a memory of `expected` not
        at its revision there refuses them all: ConflictError with `revision`; an audience
        neither `known` nor the memory's own, InvalidRequestError)."""
        return self._save_many(org_id, items, author, mode, expected or {}, audiences, known)

    def _save_many(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        expected: Mapping[str, int],
        audiences: frozenset[str] | None,
        known: Collection[str] | None = None,
    ) -> list[tuple[Memory, bool]]:
        try:
            with self._write(org_id) as conn:
                terms = _TermDelta()
                out: list[tuple[Memory, bool]] | None = None
                if _batchable(items):
                    out = self._save_batch(
                        conn, terms, org_id, items, author, mode, expected, audiences, known
                    )
                if out is None:
                    out = []
                    for i, (mid, d, ps) in enumerate(items):
                        with batch_item(i):
                            out.append(
                                self._save(
                                    conn,
                                    terms,
                                    org_id,
                                    mid,
                                    d,
                                    author,
                                    ps,
                                    mode,
                                    expected.get(mid),
                                    audiences,
                                    known,
                                )
                            )
                if any(changed for _, changed in out):
                    terms.apply(conn, org_id)
                    _bump(conn, org_id)
                shown = _as_read(conn, org_id, [m for m, _ in out], audiences)
                return [(m, changed) for m, (_, changed) in zip(shown, out, strict=True)]
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise ConflictError("the memory was written concurrently; retry") from None
            raise

    def _save(
        self,
        conn: PgConnection,
        terms: _TermDelta,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None,
        audiences: frozenset[str] | None,
        known: Collection[str] | None = None,
    ) -> tuple[Memory, bool]:
        row = conn.execute(
            "SELECT * FROM memories WHERE org_id = %s AND id = %s", (org_id, memory_id)
        ).fetchone()
        current, draft = _judge(row, memory_id, draft, mode, expected_revision, audiences, known)
        kept = () if current is None else current.supersedes
        draft = _check_supersedes(conn, org_id, memory_id, draft, audiences, kept)
        if current is not None and current.superseded_by is not None:
            replacements = conn.execute(
                "SELECT id, audiences FROM memories WHERE org_id = %s AND deleted_at IS NULL"
                " AND %s = ANY(supersedes) ORDER BY id != %s, updated_at DESC, id",
                (org_id, memory_id, current.superseded_by),
            ).fetchall()
            judge_replacement(
                memory_id,
                current.audiences,
                draft.audiences,
                [(r["id"], r["audiences"]) for r in replacements],
                audiences,
            )
        if current is not None and same_content(current, draft):
            return current, False
        values = _values(org_id, memory_id, draft, author, current)
        saved = one_row(conn.execute(UPSERT_MEMORY, values))
        conn.execute(INSERT_REVISION, values)
        conn.execute(
            "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = %s",
            (org_id, memory_id),
        )
        conn.execute(
            "INSERT INTO memory_audiences (org_id, memory_id, audience)"
            " SELECT %s, %s, unnest(%s::text[])",
            (org_id, memory_id, sorted(set(draft.audiences))),
        )
        old = conn.execute(
            "DELETE FROM passages WHERE org_id = %s AND memory_id = %s"
            " RETURNING lexical, content_hash",
            (org_id, memory_id),
        ).fetchall()
        terms.change(
            removed=[r["lexical"] for r in old],
            added=[p.lexical for p in passages],
            old_audiences=() if current is None else current.audiences,
            new_audiences=draft.audiences,
        )
        if passages:
            with conn.cursor() as cur:
                insert_passages(
                    cur,
                    _passage_rows(org_id, memory_id, values, passages),
                    [p.tokens for p in passages],
                )
        _forget_embeddings(conn, {r["content_hash"] for r in old})
        # Supersession is a relation between live memories: recompute both directions.
        _relink_superseded(conn, org_id, memory_id)
        if draft.supersedes:
            conn.execute(
                "UPDATE memories SET superseded_by = %s WHERE org_id = %s AND id = ANY(%s)",
                (memory_id, org_id, list(draft.supersedes)),
            )
        return _memory(saved), True

    def _save_batch(
        self,
        conn: PgConnection,
        terms: _TermDelta,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        expected: Mapping[str, int],
        audiences: frozenset[str] | None,
        known: Collection[str] | None = None,
    ) -> list[tuple[Memory, bool]] | None:
        """Many distinct memories without supersession: the same checks and rows as `_save`,
        in a handful of pipelined statements instead of ten round trips per memory. None
        when one of them already supersedes others or is superseded: `_save` carries or
        judges those links."""
        ids = [mid for mid, _, _ in items]
        rows = {
            r["id"]: r
            for r in conn.execute(
                "SELECT * FROM memories WHERE org_id = %s AND id = ANY(%s)", (org_id, ids)
            )
        }
        if any(r["supersedes"] or r["superseded_by"] for r in rows.values()):
            return None
        out: list[tuple[Memory, bool] | None] = []
        writes: list[tuple[int, dict[str, Any], MemoryDraft, Sequence[PassageInput]]] = []
        for i, (mid, draft, passages) in enumerate(items):
            with batch_item(i):
                current, draft = _judge(
                    rows.get(mid), mid, draft, mode, expected.get(mid), audiences, known
                )
            if current is not None and same_content(current, draft):
                out.append((current, False))
                continue
            out.append(None)
            writes.append((i, _values(org_id, mid, draft, author, current), draft, passages))
        if not writes:
            return out  # type: ignore[return-value]
        changed = [v["id"] for _, v, _, _ in writes]
        with conn.cursor() as cur:
            cur.executemany(UPSERT_MEMORY, [v for _, v, _, _ in writes], returning=True)
            saved = []
            while True:
                saved.append(one_row(cur))
                if not cur.nextset():
                    break
            cur.executemany(INSERT_REVISION, [v for _, v, _, _ in writes])
            conn.execute(
                "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = ANY(%s)",
                (org_id, changed),
            )
            pairs = [(v["id"], a) for _, v, d, _ in writes for a in sorted(set(d.audiences))]
            conn.execute(
                "INSERT INTO memory_audiences (org_id, memory_id, audience)"
                " SELECT %s, m, a FROM unnest(%s::text[], %s::text[]) AS t(m, a)",
                (org_id, [m for m, _ in pairs], [a for _, a in pairs]),
            )
            old: dict[str, list[str]] = {}
            replaced: set[str] = set()
            for r in conn.execute(
                "DELETE FROM passages WHERE org_id = %s AND memory_id = ANY(%s)"
                " RETURNING memory_id, lexical, content_hash",
                (org_id, changed),
            ):
                old.setdefault(r["memory_id"], []).append(r["lexical"])
                replaced.add(r["content_hash"])
            for _, v, d, ps in writes:
                before = rows.get(v["id"])
                terms.change(
                    removed=old.get(v["id"], []),
                    added=[p.lexical for p in ps],
                    old_audiences=() if before is None else before["audiences"],
                    new_audiences=d.audiences,
                )
            insert_passages(
                cur,
                [row for _, v, _, ps in writes for row in _passage_rows(org_id, v["id"], v, ps)],
                [p.tokens for _, _, _, ps in writes for p in ps],
            )
            _forget_embeddings(conn, replaced)
            # No supersession to recompute: none of these supersedes, or is superseded by, any
            # memory (else `_save` carries them, above), so no link points at one of them.
        for (i, _, _, _), row in zip(writes, saved, strict=True):
            out[i] = (_memory(row), True)
        return out  # type: ignore[return-value]

    def delete_memory(
        self,
        org_id: str,
        memory_id: str,
        author: str | None,
        audiences: frozenset[str] | None,
        expected_revision: int | None = None,
    ) -> None:
        params = _params(org_id, audiences, id=memory_id)
        with self._write(org_id) as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)} AND m.id = %(id)s",
                params,
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            judge_revision(memory_id, row["revision"], expected_revision)
            old = conn.execute(
                "DELETE FROM passages WHERE org_id = %s AND memory_id = %s"
                " RETURNING lexical, content_hash",
                (org_id, memory_id),
            ).fetchall()
            _forget_embeddings(conn, {r["content_hash"] for r in old})
            terms = _TermDelta()
            terms.change(
                removed=[r["lexical"] for r in old],
                added=[],
                old_audiences=row["audiences"],
                new_audiences=(),
            )
            terms.apply(conn, org_id)
            # The history keeps a tombstone, not the text.
            conn.execute(
                "UPDATE memory_revisions SET title = NULL, body = NULL"
                " WHERE org_id = %s AND id = %s",
                (org_id, memory_id),
            )
            now = datetime.now(UTC)
            conn.execute(
                "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author)"
                " VALUES (%s, %s, %s, 'delete', %s, %s)",
                (org_id, memory_id, row["revision"] + 1, now, author),
            )
            conn.execute(
                "UPDATE memories SET deleted_at = %s, revision = revision + 1, title = NULL,"
                " body = NULL, updated_at = %s WHERE org_id = %s AND id = %s",
                (now, now, org_id, memory_id),
            )
            _relink_superseded(conn, org_id, memory_id)
            _bump(conn, org_id)


UPSERT_MEMORY = (
    "INSERT INTO memories (org_id, id, revision, title, body, source, tags, audiences,"
    " author, created_at, updated_at, valid_until, supersedes, pinned) VALUES"
    " (%(org_id)s, %(id)s, %(revision)s, %(title)s, %(body)s, %(source)s, %(tags)s,"
    " %(audiences)s, %(author)s, %(created_at)s, %(updated_at)s, %(valid_until)s,"
    " %(supersedes)s, %(pinned)s)"
    " ON CONFLICT (org_id, id) DO UPDATE SET revision = excluded.revision,"
    " title = excluded.title, body = excluded.body, source = excluded.source,"
    " tags = excluded.tags, audiences = excluded.audiences, author = excluded.author,"
    " updated_at = excluded.updated_at, valid_until = excluded.valid_until,"
    " supersedes = excluded.supersedes, pinned = excluded.pinned RETURNING *"
)
INSERT_REVISION = (
    "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
    " title, body, source, tags, audiences, valid_until, supersedes, pinned) VALUES"
    " (%(org_id)s, %(id)s, %(revision)s, %(action)s, %(updated_at)s, %(author)s,"
    " %(title)s, %(body)s, %(source)s, %(tags)s, %(audiences)s, %(valid_until)s,"
    " %(supersedes)s, %(pinned)s)"
)
INSERT_PASSAGE = (
    "INSERT INTO passages (org_id, memory_id, revision, seq, text, lexical,"
    " token_count, content_hash, embedding) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " RETURNING id"
)


def _batchable(items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]]) -> bool:
    """The batch path needs items that cannot see each other: distinct ids, no supersession."""
    ids = [mid for mid, _, _ in items]
    return (
        len(items) > 1 and len(set(ids)) == len(ids) and not any(d.supersedes for _, d, _ in items)
    )


def _judge(
    row: dict[str, Any] | None,
    memory_id: str,
    draft: MemoryDraft,
    mode: SaveMode,
    expected_revision: int | None,
    audiences: frozenset[str] | None,
    known: Collection[str] | None = None,
) -> tuple[Memory | None, MemoryDraft]:
    """The write rules, the same for one memory or a batch: returns the current memory and
    the draft as it may be saved (`settle_expiry`)."""
    current = None if row is None else _memory(row)
    deleted = row is not None and row["deleted_at"] is not None
    judge_write(current, deleted, memory_id, mode, expected_revision, audiences)
    judge_audiences(draft, current, known)
    judge_format_characters(draft, current)
    return current, settle_expiry(draft, current)


def _values(
    org_id: str, memory_id: str, draft: MemoryDraft, author: str | None, current: Memory | None
) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "org_id": org_id,
        "id": memory_id,
        "revision": 1 if current is None else current.revision + 1,
        "title": draft.title,
        "body": draft.body,
        "source": draft.source,
        "tags": list(draft.tags),
        "audiences": list(draft.audiences),
        "author": author,
        "created_at": now if current is None else current.created_at,
        "updated_at": now,
        "valid_until": draft.valid_until,
        "supersedes": list(draft.supersedes),
        "pinned": draft.pinned,
        "action": "create" if current is None else "edit",
    }


def _passage_rows(
    org_id: str, memory_id: str, values: dict[str, Any], passages: Sequence[PassageInput]
) -> list[tuple[Any, ...]]:
    return [
        (
            org_id,
            memory_id,
            values["revision"],
            p.seq,
            p.text,
            p.lexical,
            len(p.lexical.split()),
            p.content_hash,
            Vector.of(p.embedding),
        )
        for p in passages
    ]


def insert_passages(
    cur: psycopg.Cursor[Any], rows: list[tuple[Any, ...]], tokens: Sequence[bytes | None]
) -> None:
    """Passage rows (`INSERT_PASSAGE`'s columns), then the token matrices of those that carry
    one, by the ids the rows were given (relay migrate numbers passages afresh too)."""
    if not rows:
        return
    cur.executemany(INSERT_PASSAGE, rows, returning=True)
    ids = []
    while True:
        ids.append(cur.fetchone()["id"])  # type: ignore[index]
        if not cur.nextset():
            break
    given = [(i, t) for i, t in zip(ids, tokens, strict=True) if t is not None]
    if given:
        cur.execute(
            "INSERT INTO passage_tokens (passage_id, tokens)"
            " SELECT * FROM unnest(%s::bigint[], %s::bytea[])",
            ([i for i, _ in given], [t for _, t in given]),
        )


def _check_supersedes(
    conn: PgConnection,
    org_id: str,
    memory_id: str,
    draft: MemoryDraft,
    writer: frozenset[str] | None,
    kept: Sequence[str],
) -> MemoryDraft:
    targets = list(dict.fromkeys([*draft.supersedes, *kept]))
    rows = (
        conn.execute(
            "SELECT id, audiences, deleted_at, revision FROM memories"
            " WHERE org_id = %s AND id = ANY(%s)",
            (org_id, targets),
        ).fetchall()
        if targets
        else []
    )
    stored = {r["id"]: LinkTarget(r["audiences"], r["deleted_at"], r["revision"]) for r in rows}
    draft = settle_supersedes(memory_id, draft, stored, writer, kept)
    new = [t for t in draft.supersedes if t not in kept]
    if new:
        judge_cycle(memory_id, new, kept, _reached(conn, org_id, memory_id, new), writer)
    return draft


def _reached(
    conn: PgConnection, org_id: str, memory_id: str, targets: Sequence[str]
) -> dict[str, tuple[list[str], list[str]]]:
    """The org's live memories `targets` reach by following `supersedes` (every link,
    whoever may read it), not past `memory_id`: each one's (supersedes, audiences)."""
    rows = conn.execute(
        "WITH RECURSIVE reach(id) AS (SELECT unnest(%(targets)s::text[])"
        " UNION SELECT s.id FROM reach JOIN memories m ON m.org_id = %(org)s"
        " AND m.id = reach.id AND m.deleted_at IS NULL, unnest(m.supersedes) AS s(id)"
        " WHERE reach.id <> %(me)s)"
        " SELECT m.id, m.supersedes, m.audiences FROM reach JOIN memories m"
        " ON m.org_id = %(org)s AND m.id = reach.id AND m.deleted_at IS NULL",
        {"targets": list(targets), "org": org_id, "me": memory_id},
    ).fetchall()
    return {r["id"]: (r["supersedes"], r["audiences"]) for r in rows}


def _relink_superseded(conn: PgConnection, org_id: str, memory_id: str) -> None:
    """Point each memory `memory_id` was marked as superseding (before this edit or delete,
    already saved) at the latest-written live memory that still supersedes it, or at none:
    two memories may supersede one, and losing one of them must not bring it back."""
    conn.execute(
        "UPDATE memories m SET superseded_by = ("
        " SELECT s.id FROM memories s WHERE s.org_id = m.org_id AND s.deleted_at IS NULL"
        " AND m.id = ANY(s.supersedes) ORDER BY s.updated_at DESC, s.id LIMIT 1)"
        " WHERE m.org_id = %s AND m.superseded_by = %s",
        (org_id, memory_id),
    )


def relink_org_superseded(conn: PgConnection, org_id: str) -> None:
    """Point every memory of the org at the latest-written live memory that supersedes it,
    or at none: `_relink_superseded`'s rule over the whole org, for rows written from
    elsewhere (`relay migrate` copies the source's superseded_by, which knows nothing of a
    link a replica made since, and would bring the memory it replaced back into recall)."""
    links = (
        "SELECT DISTINCT ON (t.id) t.id, s.id AS by FROM memories s, unnest(s.supersedes) t(id)"
        " WHERE s.org_id = %(org)s AND s.deleted_at IS NULL"
        " ORDER BY t.id, s.updated_at DESC, s.id"
    )
    conn.execute(
        f"UPDATE memories m SET superseded_by = l.by FROM ({links}) l"
        " WHERE m.org_id = %(org)s AND m.id = l.id AND m.superseded_by IS DISTINCT FROM l.by",
        {"org": org_id},
    )
    conn.execute(
        "UPDATE memories m SET superseded_by = NULL WHERE m.org_id = %(org)s"
        f" AND m.superseded_by IS NOT NULL AND m.id NOT IN (SELECT l.id FROM ({links}) l)",
        {"org": org_id},
    )
