"""Reading memories: one, a page of them, a history, the pinned ones, and the access
filters every query that returns memory content carries.

Who may see what is decided by SQL (`visible_sql` for recall, `managed_sql` for
management reads, `history_sql` for revisions), never by filtering rows afterwards;
links to memories a reader may not read are withheld from what it gets (`_as_read`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from relay.errors import NotFoundError
from relay.models import EVERYONE, WITHHELD_FIELDS, Memory, Revision
from relay.store.listing import NO_FILTER, ListFilter, ListPosition
from relay.store.postgres.connection import PgConnection, PostgresConnections, one_row
from relay.store.postgres.rows import _memory, _revision
from relay.store.rules import Read, as_read, linked_ids


def visible_sql(audience_filter: bool) -> str:
    """The recall filter on `memories m` for one org: live, current, unexpired, audience."""
    clauses = [
        "m.org_id = %(org)s",
        "m.deleted_at IS NULL",
        "m.superseded_by IS NULL",
        "(m.valid_until IS NULL OR m.valid_until > %(now)s)",
    ]
    if audience_filter:
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = ANY(%(aud)s))"
        )
    return " AND ".join(clauses)


def managed_sql(audiences: frozenset[str] | None, deleted: bool = False) -> str:
    """Management reads see expired and superseded memories too (so they can be tended);
    `deleted`: the tombstones instead, each by the audiences of its last live revision."""
    clauses = ["m.org_id = %(org)s", f"m.deleted_at IS {'NOT ' if deleted else ''}NULL"]
    if audiences is not None:
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = ANY(%(aud)s))"
        )
    return " AND ".join(clauses)


def history_sql(audience_filter: bool) -> str:
    """A memory's revisions (`org`, `id`), oldest first, each one's content withheld
    (`WITHHELD_FIELDS` null, `withheld` true) unless its audiences meet the reader's `aud`;
    a deletion, which has none of its own, takes the memory's last. Without the filter (an
    admin management read) nothing is withheld."""
    readable = "true"
    if audience_filter:
        readable = "coalesce(r.audiences, m.audiences) && %(aud)s::text[]"
    content = ", ".join(f"CASE WHEN readable THEN {c} END AS {c}" for c in WITHHELD_FIELDS)
    return (
        f"SELECT id, revision, action, recorded_at, NOT readable AS withheld, {content}"
        f" FROM (SELECT r.*, {readable} AS readable FROM memory_revisions r"
        " JOIN memories m ON m.org_id = r.org_id AND m.id = r.id"
        " WHERE r.org_id = %(org)s AND r.id = %(id)s) AS v ORDER BY revision"
    )


def _params(org_id: str, audiences: frozenset[str] | None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"org": org_id, **extra}
    if audiences is not None:
        params["aud"] = sorted(audiences | {EVERYONE})
    return params


def _as_read(
    conn: PgConnection,
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
    rows = conn.execute(
        "SELECT DISTINCT memory_id FROM memory_audiences WHERE org_id = %s"
        " AND memory_id = ANY(%s) AND audience = ANY(%s)",
        (org_id, ids, sorted(audiences | {EVERYONE})),
    ).fetchall()
    return [as_read(item, {r["memory_id"] for r in rows}) for item in items]


def _filter_sql(where: ListFilter, params: dict[str, Any]) -> str:
    """`where` as clauses on `memories m` (each starting " AND "), its values put in `params`.
    Case is folded by lower(), as the database's collation folds it."""
    sql = ""
    if where.source:
        sql += " AND m.source = %(source)s"
        params["source"] = where.source
    if where.source_prefix:
        sql += " AND starts_with(m.source, %(prefix)s)"
        params["prefix"] = where.source_prefix
    if where.tag:
        sql += " AND %(tag)s = ANY(m.tags)"
        params["tag"] = where.tag
    for i, word in enumerate(where.words()):
        sql += (
            f" AND (strpos(lower(m.title), lower(%(w{i})s)) > 0"
            f" OR strpos(lower(m.body), lower(%(w{i})s)) > 0)"
        )
        params[f"w{i}"] = word
    if where.audience:
        sql += (
            " AND EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = %(audience)s)"
        )
        params["audience"] = where.audience
    if where.author:
        sql += " AND m.author = %(author)s"
        params["author"] = where.author
    if where.now is not None:
        params.update(now=where.now, soon=where.soon())
    sql += {
        "any": "",
        "active": " AND m.superseded_by IS NULL"
        " AND (m.valid_until IS NULL OR m.valid_until > %(now)s)",
        "expiring": " AND m.valid_until > %(now)s AND m.valid_until <= %(soon)s",
        "expired": " AND m.valid_until <= %(now)s",
        "superseded": " AND m.superseded_by IS NOT NULL",
        "pinned": " AND m.pinned",
    }[where.status]
    return sql


class MemoryReads(PostgresConnections):
    """Reads of memories and their histories (mixed into `PostgresStore`)."""

    def current_memory(self, org_id: str, memory_id: str) -> Memory | None:
        with self._tx(org_id) as conn:
            row = conn.execute(
                "SELECT * FROM memories WHERE org_id = %s AND id = %s AND deleted_at IS NULL",
                (org_id, memory_id),
            ).fetchone()
        return None if row is None else _memory(row)

    def get_memory(self, org_id: str, memory_id: str, audiences: frozenset[str] | None) -> Memory:
        params = _params(org_id, audiences, id=memory_id)
        with self._tx(org_id) as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)} AND m.id = %(id)s",
                params,
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
        params = _params(org_id, audiences, limit=limit + 1)
        query = f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)}"
        query += _filter_sql(where, params)
        if order == "id":
            if after is not None:
                query += " AND m.id > %(after_id)s"
                params["after_id"] = after.id
            query += " ORDER BY m.id LIMIT %(limit)s"
        else:
            if after is not None:
                query += (
                    " AND (m.updated_at < %(after_at)s"
                    " OR (m.updated_at = %(after_at)s AND m.id < %(after_id)s))"
                )
                # timestamptz keeps microseconds, which a float of seconds holds exactly
                since = datetime.fromtimestamp(after.updated_at or 0.0, UTC)
                params.update(after_at=since, after_id=after.id)
            query += " ORDER BY m.updated_at DESC, m.id DESC LIMIT %(limit)s"
        with self._tx(org_id) as conn:
            rows = conn.execute(query, params).fetchall()
            items = _as_read(conn, org_id, [_memory(r) for r in rows[:limit]], audiences)
        if len(rows) <= limit:
            return items, None
        last = rows[limit - 1]
        at = None if order == "id" else last["updated_at"].timestamp()
        return items, ListPosition(at, last["id"])

    def deleted_count(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        source: str | None = None,
        source_prefix: str | None = None,
    ) -> int:
        params = _params(org_id, audiences)
        query = f"SELECT count(*) AS n FROM memories m WHERE {managed_sql(audiences, True)}"
        query += _filter_sql(ListFilter(source=source, source_prefix=source_prefix), params)
        with self._tx(org_id) as conn:
            return int(one_row(conn.execute(query, params))["n"])

    def history(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> list[Revision]:
        params = _params(org_id, audiences, id=memory_id)
        # Listed to the keys that may read the memory: a deleted one keeps the audiences of
        # its last live revision, so deleting it shows its tombstone to nobody new.
        query = "SELECT 1 FROM memories m WHERE m.org_id = %(org)s AND m.id = %(id)s"
        if audiences is not None:
            query += (
                " AND EXISTS (SELECT 1 FROM memory_audiences ma"
                " WHERE ma.org_id = m.org_id AND ma.memory_id = m.id"
                " AND ma.audience = ANY(%(aud)s))"
            )
        with self._tx(org_id) as conn:
            if conn.execute(query, params).fetchone() is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            rows = conn.execute(history_sql(audiences is not None), params).fetchall()
            return _as_read(conn, org_id, [_revision(r) for r in rows], audiences)

    def pinned(self, org_id: str, audiences: frozenset[str], now: datetime) -> list[Memory]:
        params = _params(org_id, audiences, now=now)
        with self._tx(org_id) as conn:
            rows = conn.execute(
                f"SELECT m.* FROM memories m WHERE {visible_sql(True)} AND m.pinned"
                " ORDER BY m.updated_at DESC LIMIT 20",
                params,
            ).fetchall()
            return _as_read(conn, org_id, [_memory(r) for r in rows], audiences)
