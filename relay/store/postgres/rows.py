"""Rows as Relay's models: orgs, keys, memories and revisions (psycopg returns
timestamps and text arrays as Python values already)."""

from __future__ import annotations

from typing import Any

from relay.models import ApiKey, Memory, Org, Revision


def _org(row: dict[str, Any]) -> Org:
    return Org(id=row["id"], name=row["name"], created_at=row["created_at"])


def _key(row: dict[str, Any]) -> ApiKey:
    return ApiKey(
        id=row["id"],
        org_id=row["org_id"],
        name=row["name"],
        scopes=frozenset(row["scopes"]),
        roles=frozenset(row["roles"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


def _memory(row: dict[str, Any]) -> Memory:
    return Memory(
        org_id=row["org_id"],
        id=row["id"],
        revision=row["revision"],
        body=row["body"],
        title=row["title"],
        source=row["source"],
        audiences=tuple(row["audiences"]),
        tags=tuple(row["tags"]),
        author=row["author"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        valid_until=row["valid_until"],
        supersedes=tuple(row["supersedes"]),
        pinned=bool(row["pinned"]),
        superseded_by=row["superseded_by"],
    )


def _revision(row: dict[str, Any]) -> Revision:
    def tup(v: list[str] | None) -> tuple[str, ...]:
        return () if v is None else tuple(v)

    return Revision(
        id=row["id"],
        revision=row["revision"],
        action=row["action"],
        recorded_at=row["recorded_at"],
        author=row["author"],
        title=row["title"],
        body=row["body"],
        source=row["source"],
        audiences=tup(row["audiences"]),
        tags=tup(row["tags"]),
        valid_until=row["valid_until"],
        supersedes=tup(row["supersedes"]),
        pinned=row["pinned"],
        withheld=row["withheld"],
    )
