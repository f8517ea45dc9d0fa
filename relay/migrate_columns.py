"""The columns `relay migrate` copies and checks, and how each store holds their values.

The copy writes a SQLite row into PostgreSQL, and the check brings rows from both sides to
one canonical tuple. Both read a row through the one list of columns below, so the values
copied and the tuples compared cannot disagree on which columns there are or their order.
A column's kind says how each store keeps it: SQLite stores times as epoch seconds, lists
as JSON text and flags as integers, where PostgreSQL has timestamps, arrays and booleans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def sqlite_time(value: float | None) -> datetime | None:
    """A time as the SQLite store reads it (`relay.store.sqlite.rows._dt`): one past
    `LATEST_TIME`, which Relay once stored rounded up to year 10000, as that."""
    from relay.hygiene import LATEST_TIME

    if value is None:
        return None
    return datetime.fromtimestamp(min(value, LATEST_TIME.timestamp()), UTC)


def _maybe(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else read(value)


# kind: (read from SQLite, read from PostgreSQL), both into the values PostgreSQL takes.
_KINDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "": (lambda v: v, lambda v: v),
    "time": (sqlite_time, lambda v: v),
    "list": (_maybe(lambda v: list(json.loads(v))), _maybe(list)),
    # Scopes and roles: a set, whichever order it was written in.
    "set": (lambda v: sorted(json.loads(v)), sorted),
    "flag": (bool, bool),
    # A revision's pin is unknown (NULL) where it was recorded before revisions kept it and
    # migration 8 could not tell (`migrate.open_source` reads such a file as it is).
    "maybe_flag": (_maybe(bool), _maybe(bool)),
    "blob": (_maybe(bytes), _maybe(bytes)),
}


def _columns(spec: str) -> tuple[tuple[str, str], ...]:
    """ "name name:kind ..." as (name, kind) pairs; a bare name is kept as it is."""
    return tuple((name, kind) for name, _, kind in (w.partition(":") for w in spec.split()))


COLUMNS = {
    "orgs": _columns("id name created_at:time passage_count"),
    "api_keys": _columns(
        "id org_id secret_hash name scopes:set roles:set"
        " created_at:time expires_at:time revoked_at:time"
    ),
    "memories": _columns(
        "org_id id revision title body source tags:list audiences:list author"
        " created_at:time updated_at:time valid_until:time supersedes:list superseded_by"
        " pinned:flag deleted_at:time"
    ),
    "memory_audiences": _columns("org_id memory_id audience"),
    "memory_revisions": _columns(
        "org_id id revision action recorded_at:time author title body source tags:list"
        " audiences:list valid_until:time supersedes:list pinned:maybe_flag"
    ),
    "passages": _columns("org_id memory_id revision seq text lexical content_hash embedding:blob"),
    "passage_tokens": _columns("org_id memory_id seq tokens:blob"),
    "org_terms": _columns("org_id term df"),
    "audience_totals": _columns("org_id audiences:list passage_count"),
    "embedding_cache": _columns("model content_hash embedding:blob"),
}


def names(table: str) -> str:
    """The table's columns as a SQL list, in the order of the tuples below."""
    return ", ".join(name for name, _ in COLUMNS[table])


def insert(table: str) -> str:
    """PostgreSQL's INSERT of the table's columns, each a parameter, in their order."""
    return (
        f"INSERT INTO {table} ({names(table)}) VALUES ({', '.join('%s' for _ in COLUMNS[table])})"
    )


def from_sqlite(table: str, row: Any) -> tuple[Any, ...]:
    return tuple(_KINDS[kind][0](row[name]) for name, kind in COLUMNS[table])


def from_postgres(table: str, row: Any) -> tuple[Any, ...]:
    return tuple(_KINDS[kind][1](row[name]) for name, kind in COLUMNS[table])


def canonical(table: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """The values in a form JSON can hash alike from either side: times as ISO strings,
    blobs as their SHA-256."""
    return tuple(
        _CANONICAL.get(kind, _same)(value)
        for (_, kind), value in zip(COLUMNS[table], values, strict=True)
    )


def _same(value: Any) -> Any:
    return value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")


def blob_digest(value: bytes | None) -> str | None:
    return None if value is None else hashlib.sha256(value).hexdigest()


_CANONICAL: dict[str, Callable[[Any], Any]] = {"time": _iso, "blob": blob_digest}
