"""Stored values as Relay's models: times (stored as epoch seconds) and rows of
orgs, keys, memories and revisions (JSON arrays for tags, audiences, scopes, links)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from relay.hygiene import LATEST_TIME
from relay.models import ApiKey, Memory, Org, Revision


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    """A stored time. One past `LATEST_TIME` (rounded up to year 10000, as Relay once stored
    9999-12-31T23:59:59.9999999Z) reads as that: raising would fail every read of its row."""
    if value is None:
        return None
    return datetime.fromtimestamp(min(value, LATEST_TIME.timestamp()), UTC)


def _org(row: sqlite3.Row) -> Org:
    return Org(id=row["id"], name=row["name"], created_at=_dt(row["created_at"]))  # type: ignore[arg-type]


def _key(row: sqlite3.Row) -> ApiKey:
    return ApiKey(
        id=row["id"],
        org_id=row["org_id"],
        name=row["name"],
        scopes=frozenset(json.loads(row["scopes"])),
        roles=frozenset(json.loads(row["roles"])),
        created_at=_dt(row["created_at"]),  # type: ignore[arg-type]
        expires_at=_dt(row["expires_at"]),
        revoked_at=_dt(row["revoked_at"]),
    )


def _memory(row: sqlite3.Row) -> Memory:
    return Memory(
        org_id=row["org_id"],
        id=row["id"],
        revision=row["revision"],
        body=row["body"],
        title=row["title"],
        source=row["source"],
        audiences=tuple(json.loads(row["audiences"])),
        tags=tuple(json.loads(row["tags"])),
        author=row["author"],
        created_at=_dt(row["created_at"]),  # type: ignore[arg-type]
        updated_at=_dt(row["updated_at"]),  # type: ignore[arg-type]
        valid_until=_dt(row["valid_until"]),
        supersedes=tuple(json.loads(row["supersedes"])),
        pinned=bool(row["pinned"]),
        superseded_by=row["superseded_by"],
    )


def _revision(row: sqlite3.Row) -> Revision:
    def loads(v: str | None) -> tuple[str, ...]:
        return () if v is None else tuple(json.loads(v))

    return Revision(
        id=row["id"],
        revision=row["revision"],
        action=row["action"],
        recorded_at=_dt(row["recorded_at"]),  # type: ignore[arg-type]
        author=row["author"],
        title=row["title"],
        body=row["body"],
        source=row["source"],
        audiences=loads(row["audiences"]),
        tags=loads(row["tags"]),
        valid_until=_dt(row["valid_until"]),
        supersedes=loads(row["supersedes"]),
        pinned=None if row["pinned"] is None else bool(row["pinned"]),
        withheld=bool(row["withheld"]),
    )
