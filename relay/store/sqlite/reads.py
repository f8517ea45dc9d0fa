"""Reading memories: one, a page of them, a history, the pinned ones, and the access
filters every query that returns memory content carries.

Who may see what is decided by SQL (`visible_sql` for recall, `_managed_sql` for
management reads, `history_sql` for revisions), never by filtering rows afterwards;
links to memories a reader may not read are withheld from what it gets (`_as_read`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime

from relay.errors import NotFoundError
from relay.models import EVERYONE, WITHHELD_FIELDS, Memory, Revision
from relay.store.listing import NO_FILTER, ListFilter, ListPosition
from relay.store.rules import Read, as_read, linked_ids
from relay.store.sqlite.connection import SQLiteConnections, translate_errors
from relay.store.sqlite.rows import _memory, _revision


def visible_sql(audience_count: int | None) -> str:
    """The access filter on `memories m` for one org (`:org`), at time `:now`.

    `audience_count` is the number of `?`-free named parameters :a0..:aN the
    caller binds; None means an admin management read (no audience filter).
    """
    clauses = [
        "m.org_id = :org",
        "m.deleted_at IS NULL",
    ]
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        clauses += [
            "m.superseded_by IS NULL",
            "(m.valid_until IS NULL OR m.valid_until > :now)",
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            f" AND ma.memory_id = m.id AND ma.audience IN ({names}))",
        ]
    return " AND ".join(clauses)


def history_sql(audience_count: int | None) -> str:
    """A memory's revisions (`:org`, `:id`), oldest first, each one's content withheld
    (`WITHHELD_FIELDS` null, `withheld` 1) unless its audiences meet the reader's
    :a0..:aN; a deletion, which has none of its own, takes the memory's last. None: an
    admin management read, which withholds nothing."""
    readable = "1"
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        readable = (
            "EXISTS (SELECT 1 FROM json_each(coalesce(r.audiences, m.audiences))"
            f" WHERE json_each.value IN ({names}))"
        )
    content = ", ".join(f"CASE WHEN readable THEN {c} END AS {c}" for c in WITHHELD_FIELDS)
    return (
        f"SELECT id, revision, action, recorded_at, NOT readable AS withheld, {content}"
        f" FROM (SELECT r.*, {readable} AS readable FROM memory_revisions r"
        " JOIN memories m ON m.org_id = r.org_id AND m.id = r.id"
        " WHERE r.org_id = :org AND r.id = :id) ORDER BY revision"
    )


def _audience_params(audiences: frozenset[str] | None) -> dict[str, str]:
    if audiences is None:
        return {}
    return {f"a{i}": a for i, a in enumerate(sorted(audiences | {EVERYONE}))}


def _managed_sql(audience_count: int | None, deleted: bool = False) -> str:
    """Management reads see expired and superseded memories too (so they can be tended);
    `deleted`: the tombstones instead, each by the audiences of its last live revision."""
    clauses = ["m.org_id = :org", f"m.deleted_at IS {'NOT ' if deleted else ''}NULL"]
    if audience_count is not None:
        names = ", ".join(f":a{i}" for i in range(audience_count))
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            f" AND ma.memory_id = m.id AND ma.audience IN ({names}))"
        )
    return " AND ".join(clauses)


def _as_read(
    conn: sqlite3.Connection,
    org_id: str,
    items: Sequence[Read],
    audiences: frozenset[str] | None,
) -> list[Read]:
    """`items` as a reader of `audiences` sees them (`rules.as_read`): their links to
    memories it may not read (a deleted one by its last audiences) withheld. None: an
    admin management read, which sees every link."""
    ids = sorted(linked_ids(items))
    if audiences is None or not ids:
        return list(items)
    readable = _readable(conn, org_id, ids, audiences)
    return [as_read(item, readable) for item in items]


def _readable(
    conn: sqlite3.Connection, org_id: str, ids: Sequence[str], audiences: frozenset[str]
) -> set[str]:
    """Which of `ids` name memories of the org, live or deleted, that `audiences` read."""
    reader = sorted(audiences | {EVERYONE})
    found: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        sql = (
            "SELECT DISTINCT memory_id FROM memory_audiences WHERE org_id = ?"
            f" AND memory_id IN ({', '.join('?' * len(chunk))})"
            f" AND audience IN ({', '.join('?' * len(reader))})"
        )
        found.update(r[0] for r in conn.execute(sql, (org_id, *chunk, *reader)))
    return found


def _filter_sql(where: ListFilter, params: dict[str, object]) -> str:
    """`where` as clauses on `memories m` (each starting " AND "), its values put in `params`.
    Case is folded by SQLite's lower(), which folds ASCII letters only."""
    sql = ""
    if where.source:
        sql += " AND m.source = :source"
        params["source"] = where.source
    if where.source_prefix:
        sql += " AND substr(m.source, 1, length(:prefix)) = :prefix"
        params["prefix"] = where.source_prefix
    if where.tag:
        sql += " AND EXISTS (SELECT 1 FROM json_each(m.tags) WHERE json_each.value = :tag)"
        params["tag"] = where.tag
    for i, word in enumerate(where.words()):
        sql += (
            f" AND (instr(lower(m.title), lower(:w{i})) > 0"
            f" OR instr(lower(m.body), lower(:w{i})) > 0)"
        )
        params[f"w{i}"] = word
    if where.audience:
        sql += (
            " AND EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = :audience)"
        )
        params["audience"] = where.audience
    if where.author:
        sql += " AND m.author = :author"
        params["author"] = where.author
    if where.now is not None:
        params.update(now=where.now.timestamp(), soon=where.soon().timestamp())
    sql += {
        "any": "",
        "active": " AND m.superseded_by IS NULL"
        " AND (m.valid_until IS NULL OR m.valid_until > :now)",
        "expiring": " AND m.valid_until > :now AND m.valid_until <= :soon",
        "expired": " AND m.valid_until <= :now",
        "superseded": " AND m.superseded_by IS NOT NULL",
        "pinned": " AND m.pinned = 1",
    }[where.status]
    return sql


class MemoryReads(SQLiteConnections):
    """Reads of memories and their histories (mixed into `SQLiteStore`)."""

    def current_memory(self, org_id: str, memory_id: str) -> Memory | None:
        with translate_errors():
            row = (
                self._reader()
                .execute(
                    "SELECT * FROM memories WHERE org_id = ? AND id = ? AND deleted_at IS NULL",
                    (org_id, memory_id),
                )
                .fetchone()
            )
        return None if row is None else _memory(row)

    def get_memory(self, org_id: str, memory_id: str, audiences: frozenset[str] | None) -> Memory:
        params = {"org": org_id, "id": memory_id, "now": time.time(), **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 3
        with self._read() as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {_managed_sql(count)} AND m.id = :id", params
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            (memory,) = _as_read(conn, org_id, [_memory(row)], audiences)
        return memory

    def list_memories(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        limit: int,
        after: ListPosition | None = None,
        where: ListFilter = NO_FILTER,
        order: str = "updated",  # or "id" (`listing.ORDERS`)
    ) -> tuple[list[Memory], ListPosition | None]:
        params: dict[str, object] = {"org": org_id, **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 1
        sql = f"SELECT m.* FROM memories m WHERE {_managed_sql(count)}{_filter_sql(where, params)}"
        if order == "id":
            if after is not None:
                sql += " AND m.id > :after_id"
                params["after_id"] = after.id
            sql += " ORDER BY m.id LIMIT :limit"
        else:
            if after is not None:
                sql += (
                    " AND (m.updated_at < :after_at"
                    " OR (m.updated_at = :after_at AND m.id < :after_id))"
                )
                params.update(after_at=after.updated_at, after_id=after.id)
            sql += " ORDER BY m.updated_at DESC, m.id DESC LIMIT :limit"
        params["limit"] = limit + 1
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
            items = _as_read(conn, org_id, [_memory(r) for r in rows[:limit]], audiences)
        if len(rows) <= limit:
            return items, None
        last = rows[limit - 1]
        return items, ListPosition(None if order == "id" else last["updated_at"], last["id"])

    def deleted_count(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        source: str | None = None,
        source_prefix: str | None = None,
    ) -> int:
        params: dict[str, object] = {"org": org_id, **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 1
        where = _filter_sql(ListFilter(source=source, source_prefix=source_prefix), params)
        sql = f"SELECT count(*) FROM memories m WHERE {_managed_sql(count, deleted=True)}{where}"
        with self._read() as conn:
            return int(conn.execute(sql, params).fetchone()[0])

    def history(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> list[Revision]:
        params: dict[str, object] = {"org": org_id, "id": memory_id, **_audience_params(audiences)}
        count = None if audiences is None else len(params) - 2
        with self._read() as conn:
            # Listed to the keys that may read the memory: a deleted one keeps the audiences
            # of its last live revision, so deleting it shows its tombstone to nobody new.
            sql = "SELECT 1 FROM memories m WHERE m.org_id = :org AND m.id = :id"
            if count is not None:
                names = ", ".join(f":a{i}" for i in range(count))
                sql += (
                    " AND EXISTS (SELECT 1 FROM memory_audiences ma"
                    " WHERE ma.org_id = m.org_id AND ma.memory_id = m.id"
                    f" AND ma.audience IN ({names}))"
                )
            if conn.execute(sql, params).fetchone() is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            rows = conn.execute(history_sql(count), params).fetchall()
            return _as_read(conn, org_id, [_revision(r) for r in rows], audiences)

    def pinned(self, org_id: str, audiences: frozenset[str], now: datetime) -> list[Memory]:
        params = {"org": org_id, "now": now.timestamp(), **_audience_params(audiences)}
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT m.* FROM memories m WHERE {visible_sql(len(params) - 2)}"
                " AND m.pinned = 1 ORDER BY m.updated_at DESC LIMIT 20",
                params,
            ).fetchall()
            return _as_read(conn, org_id, [_memory(r) for r in rows], audiences)
