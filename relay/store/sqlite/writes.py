"""Writing memories: save (one, or a batch in one transaction), delete, and the
supersession links between memories.

A save is judged by `relay.store.rules` (mode, revision, audiences, links, cycles) and
then writes the memory, its revision, its audiences and passages, the org's term counts
(`totals`) and both directions of supersession, in the writer's one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection, Mapping, Sequence

from relay.errors import NotFoundError
from relay.models import Memory, MemoryDraft, PassageInput
from relay.store import SaveMode, batch_item
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
from relay.store.sqlite.connection import SQLiteConnections, _bump
from relay.store.sqlite.embeddings import _forget_embeddings
from relay.store.sqlite.reads import _as_read, _audience_params, _managed_sql
from relay.store.sqlite.rows import _dt, _memory, _ts
from relay.store.sqlite.totals import _update_terms


class MemoryWrites(SQLiteConnections):
    """Saves and deletes of memories (mixed into `SQLiteStore`)."""

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
        with self._write() as conn:
            saved, changed = self._save(
                conn, org_id, memory_id, draft, author, passages, mode, expected_revision, audiences
            )
            (shown,) = _as_read(conn, org_id, [saved], audiences)
        return shown, changed

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
        expected = expected or {}
        saved = []
        with self._write() as conn:
            for i, (memory_id, draft, passages) in enumerate(items):
                with batch_item(i):
                    saved.append(
                        self._save(
                            conn,
                            org_id,
                            memory_id,
                            draft,
                            author,
                            passages,
                            mode,
                            expected.get(memory_id),
                            audiences,
                            known,
                        )
                    )
            shown = _as_read(conn, org_id, [m for m, _ in saved], audiences)
        return [(m, changed) for m, (_, changed) in zip(shown, saved, strict=True)]

    def _save(
        self,
        conn: sqlite3.Connection,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None = None,
        audiences: frozenset[str] | None = None,
        known: Collection[str] | None = None,
    ) -> tuple[Memory, bool]:
        now = time.time()
        row = conn.execute(
            "SELECT * FROM memories WHERE org_id = ? AND id = ?", (org_id, memory_id)
        ).fetchone()
        current = None if row is None else _memory(row)
        deleted = row is not None and row["deleted_at"] is not None
        judge_write(current, deleted, memory_id, mode, expected_revision, audiences)
        judge_audiences(draft, current, known)
        judge_format_characters(draft, current)
        draft = settle_expiry(draft, current)
        kept = () if current is None else current.supersedes
        draft = self._check_supersedes(conn, org_id, memory_id, draft, audiences, kept)
        if current is not None and current.superseded_by is not None:
            replacements = conn.execute(
                "SELECT s.id, s.audiences FROM memories s, json_each(s.supersedes) j"
                " WHERE s.org_id = ? AND s.deleted_at IS NULL AND j.value = ?"
                " ORDER BY s.id != ?, s.updated_at DESC, s.id",
                (org_id, memory_id, current.superseded_by),
            ).fetchall()
            judge_replacement(
                memory_id,
                current.audiences,
                draft.audiences,
                [(r["id"], json.loads(r["audiences"])) for r in replacements],
                audiences,
            )
        if current is not None and same_content(current, draft):
            return current, False
        revision = 1 if current is None else current.revision + 1
        created = now if current is None else _ts(current.created_at)
        values = {
            "org_id": org_id,
            "id": memory_id,
            "revision": revision,
            "title": draft.title,
            "body": draft.body,
            "source": draft.source,
            "tags": json.dumps(list(draft.tags)),
            "audiences": json.dumps(list(draft.audiences)),
            "author": author,
            "created_at": created,
            "updated_at": now,
            "valid_until": _ts(draft.valid_until),
            "supersedes": json.dumps(list(draft.supersedes)),
            "pinned": int(draft.pinned),
        }
        conn.execute(
            "INSERT INTO memories (org_id, id, revision, title, body, source, tags, audiences,"
            " author, created_at, updated_at, valid_until, supersedes, pinned) VALUES"
            " (:org_id, :id, :revision, :title, :body, :source, :tags, :audiences, :author,"
            " :created_at, :updated_at, :valid_until, :supersedes, :pinned)"
            " ON CONFLICT (org_id, id) DO UPDATE SET revision = :revision, title = :title,"
            " body = :body, source = :source, tags = :tags, audiences = :audiences,"
            " author = :author, updated_at = :updated_at, valid_until = :valid_until,"
            " supersedes = :supersedes, pinned = :pinned",
            values,
        )
        conn.execute(
            "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
            " title, body, source, tags, audiences, valid_until, supersedes, pinned) VALUES"
            " (:org_id, :id, :revision, :action, :updated_at, :author, :title, :body, :source,"
            " :tags, :audiences, :valid_until, :supersedes, :pinned)",
            {**values, "action": "create" if current is None else "edit"},
        )
        conn.execute(
            "DELETE FROM memory_audiences WHERE org_id = ? AND memory_id = ?",
            (org_id, memory_id),
        )
        conn.executemany(
            "INSERT INTO memory_audiences VALUES (?, ?, ?)",
            [(org_id, memory_id, a) for a in sorted(set(draft.audiences))],
        )
        replaced = conn.execute(
            "SELECT lexical, content_hash FROM passages WHERE org_id = ? AND memory_id = ?",
            (org_id, memory_id),
        ).fetchall()
        old = [r["lexical"] for r in replaced]
        conn.execute("DELETE FROM passages WHERE org_id = ? AND memory_id = ?", (org_id, memory_id))
        conn.executemany(
            "INSERT INTO passages (org_id, memory_id, revision, seq, text, lexical, content_hash,"
            " embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    org_id,
                    memory_id,
                    revision,
                    p.seq,
                    p.text,
                    p.lexical,
                    p.content_hash,
                    p.embedding,
                )
                for p in passages
            ],
        )
        conn.executemany(
            "INSERT INTO passage_tokens SELECT rowid, ? FROM passages"
            " WHERE org_id = ? AND memory_id = ? AND seq = ?",
            [(p.tokens, org_id, memory_id, p.seq) for p in passages if p.tokens is not None],
        )
        _forget_embeddings(conn, {r["content_hash"] for r in replaced})
        _update_terms(
            conn,
            org_id,
            removed=old,
            added=[p.lexical for p in passages],
            old_audiences=() if current is None else current.audiences,
            new_audiences=draft.audiences,
        )
        # Supersession is a relation between live memories: recompute both directions.
        _relink_superseded(conn, org_id, memory_id)
        conn.executemany(
            "UPDATE memories SET superseded_by = ? WHERE org_id = ? AND id = ?",
            [(memory_id, org_id, target) for target in draft.supersedes],
        )
        _bump(conn, org_id)
        saved = _memory(
            conn.execute(
                "SELECT * FROM memories WHERE org_id = ? AND id = ?", (org_id, memory_id)
            ).fetchone()
        )

        return saved, True

    @staticmethod
    def _check_supersedes(
        conn: sqlite3.Connection,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        writer: frozenset[str] | None,
        kept: Sequence[str],
    ) -> MemoryDraft:
        targets = list(dict.fromkeys([*draft.supersedes, *kept]))
        marks = ", ".join("?" for _ in targets)
        rows = (
            conn.execute(
                "SELECT id, audiences, deleted_at, revision FROM memories"
                f" WHERE org_id = ? AND id IN ({marks})",
                (org_id, *targets),
            ).fetchall()
            if targets
            else []
        )
        stored = {
            r["id"]: LinkTarget(json.loads(r["audiences"]), _dt(r["deleted_at"]), r["revision"])
            for r in rows
        }
        draft = settle_supersedes(memory_id, draft, stored, writer, kept)
        new = [t for t in draft.supersedes if t not in kept]
        if new:
            judge_cycle(memory_id, new, kept, _reached(conn, org_id, memory_id, new), writer)
        return draft

    def delete_memory(
        self,
        org_id: str,
        memory_id: str,
        author: str | None,
        audiences: frozenset[str] | None,
        expected_revision: int | None = None,
    ) -> None:
        now = time.time()
        params = {"org": org_id, "id": memory_id, **_audience_params(audiences)}
        with self._write() as conn:
            count = None if audiences is None else len(params) - 2
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {_managed_sql(count)} AND m.id = :id",
                params,
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            judge_revision(memory_id, row["revision"], expected_revision)
            removed = conn.execute(
                "SELECT lexical, content_hash FROM passages WHERE org_id = ? AND memory_id = ?",
                (org_id, memory_id),
            ).fetchall()
            old = [r["lexical"] for r in removed]
            conn.execute(
                "DELETE FROM passages WHERE org_id = ? AND memory_id = ?", (org_id, memory_id)
            )
            _forget_embeddings(conn, {r["content_hash"] for r in removed})
            _update_terms(
                conn,
                org_id,
                removed=old,
                added=[],
                old_audiences=json.loads(row["audiences"]),
                new_audiences=(),
            )
            # The history keeps a tombstone, not the text.
            conn.execute(
                "UPDATE memory_revisions SET title = NULL, body = NULL WHERE org_id = ? AND id = ?",
                (org_id, memory_id),
            )
            conn.execute(
                "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author)"
                " VALUES (?, ?, ?, 'delete', ?, ?)",
                (org_id, memory_id, row["revision"] + 1, now, author),
            )
            conn.execute(
                "UPDATE memories SET deleted_at = ?, revision = revision + 1, title = NULL,"
                " body = NULL, updated_at = ? WHERE org_id = ? AND id = ?",
                (now, now, org_id, memory_id),
            )
            _relink_superseded(conn, org_id, memory_id)
            _bump(conn, org_id)


def _reached(
    conn: sqlite3.Connection, org_id: str, memory_id: str, targets: Sequence[str]
) -> dict[str, tuple[list[str], list[str]]]:
    """The org's live memories `targets` reach by following `supersedes` (every link,
    whoever may read it), not past `memory_id`: each one's (supersedes, audiences)."""
    rows = conn.execute(
        "WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(:targets)"
        " UNION SELECT j.value FROM reach JOIN memories m ON m.org_id = :org AND m.id = reach.id"
        " AND m.deleted_at IS NULL, json_each(m.supersedes) j WHERE reach.id != :me)"
        " SELECT m.id, m.supersedes, m.audiences FROM reach JOIN memories m"
        " ON m.org_id = :org AND m.id = reach.id AND m.deleted_at IS NULL",
        {"targets": json.dumps(list(targets)), "org": org_id, "me": memory_id},
    ).fetchall()
    return {r["id"]: (json.loads(r["supersedes"]), json.loads(r["audiences"])) for r in rows}


def _relink_superseded(conn: sqlite3.Connection, org_id: str, memory_id: str) -> None:
    """Point each memory `memory_id` was marked as superseding (before this edit or delete,
    already saved) at the latest-written live memory that still supersedes it, or at none:
    two memories may supersede one, and losing one of them must not bring it back."""
    conn.execute(
        "UPDATE memories SET superseded_by = ("
        " SELECT s.id FROM memories s, json_each(s.supersedes) j"
        " WHERE s.org_id = memories.org_id AND s.deleted_at IS NULL"
        " AND s.supersedes != '[]' AND j.value = memories.id"
        " ORDER BY s.updated_at DESC, s.id LIMIT 1)"
        " WHERE org_id = ? AND superseded_by = ?",
        (org_id, memory_id),
    )
