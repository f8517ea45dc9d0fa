"""Organisations and API keys: created, found, listed, revoked; the audiences an
org's live keys carry (what a memory may name)."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime

from relay.errors import ConflictError, NotFoundError
from relay.models import ApiKey, Org
from relay.store import check_org_name
from relay.store.rules import judge_revoke
from relay.store.sqlite.connection import SQLiteConnections, _bump, translate_errors
from relay.store.sqlite.rows import _key, _org, _ts


class OrgsAndKeys(SQLiteConnections):
    """Organisations and their keys (mixed into `SQLiteStore`)."""

    def create_org(self, name: str) -> Org:
        org = self._insert_org(name, first=False)
        assert org is not None  # only a first org is ever declined
        return org

    def create_first_org(self, name: str) -> Org | None:
        return self._insert_org(name, first=True)

    def _insert_org(self, name: str, first: bool) -> Org | None:
        """An org named `name`; with `first`, only when there is none at all (None then).
        One write transaction (BEGIN IMMEDIATE) checks and inserts, so processes starting
        together on one file make one."""
        name = check_org_name(name)
        org = Org(id="org_" + secrets.token_hex(6), name=name, created_at=datetime.now(UTC))
        with self._write() as conn:
            if first and conn.execute("SELECT 1 FROM orgs LIMIT 1").fetchone():
                return None
            if conn.execute("SELECT 1 FROM orgs WHERE name = ?", (name,)).fetchone():
                raise ConflictError(f"an organisation named {name!r} already exists")
            conn.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)",
                (org.id, org.name, _ts(org.created_at)),
            )
        return org

    def get_org(self, org_id: str) -> Org:
        with translate_errors():
            row = self._reader().execute("SELECT * FROM orgs WHERE id = ?", (org_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no organisation {org_id!r}")
        return _org(row)

    def find_org(self, name_or_id: str) -> Org | None:
        """The org with this id, else the one with this name (a name made before names
        shaped like ids were refused may equal another org's id: the id wins)."""
        with translate_errors():
            row = (
                self._reader()
                .execute(
                    "SELECT * FROM orgs WHERE id = :v OR name = :v ORDER BY id = :v DESC LIMIT 1",
                    {"v": name_or_id},
                )
                .fetchone()
            )
        return None if row is None else _org(row)

    def list_orgs(self) -> list[Org]:
        with translate_errors():
            rows = self._reader().execute("SELECT * FROM orgs ORDER BY created_at").fetchall()
        return [_org(r) for r in rows]

    def create_key(
        self,
        org_id: str,
        key_id: str,
        secret_hash: str,
        name: str,
        scopes: frozenset[str],
        roles: frozenset[str],
        expires_at: datetime | None,
    ) -> ApiKey:
        key = ApiKey(
            id=key_id,
            org_id=org_id,
            name=name,
            scopes=scopes,
            roles=roles,
            created_at=datetime.now(UTC),
            expires_at=expires_at,
        )
        with self._write() as conn:
            if not conn.execute("SELECT 1 FROM orgs WHERE id = ?", (org_id,)).fetchone():
                raise NotFoundError(f"no organisation {org_id!r}")
            conn.execute(
                "INSERT INTO api_keys (id, org_id, secret_hash, name, scopes, roles, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.id,
                    org_id,
                    secret_hash,
                    name,
                    json.dumps(sorted(scopes)),
                    json.dumps(sorted(roles)),
                    _ts(key.created_at),
                    _ts(expires_at),
                ),
            )
            _bump(conn, org_id)
        return key

    def key_for_auth(self, key_id: str) -> tuple[ApiKey, str] | None:
        with translate_errors():
            row = (
                self._reader().execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
            )
        return None if row is None else (_key(row), row["secret_hash"])

    def list_keys(
        self, org_id: str, limit: int | None = None, after: str | None = None
    ) -> list[ApiKey]:
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT * FROM api_keys WHERE org_id = ? AND (? IS NULL OR (created_at, id)"
                    " > (SELECT created_at, id FROM api_keys WHERE org_id = ? AND id = ?))"
                    " ORDER BY created_at, id LIMIT ?",
                    (org_id, after, org_id, after, -1 if limit is None else limit),  # -1: all
                )
                .fetchall()
            )
        return [_key(r) for r in rows]

    def revoke_key(self, org_id: str, key_id: str) -> ApiKey:
        with self._write() as conn:
            row = conn.execute(
                "SELECT * FROM api_keys WHERE id = ? AND org_id = ?", (key_id, org_id)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no key {key_id!r} in this organisation")
            if row["revoked_at"] is None:
                org_keys = conn.execute("SELECT * FROM api_keys WHERE org_id = ?", (org_id,))
                judge_revoke(map(_key, org_keys), key_id)
                conn.execute(
                    "UPDATE api_keys SET revoked_at = ? WHERE id = ?", (time.time(), key_id)
                )
                _bump(conn, org_id)
            row = conn.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        return _key(row)

    def known_audiences(self, org_id: str) -> set[str]:
        """The roles that some live key of the org carries: the audiences a memory may name.
        A key is live until it is revoked or expires, by the clock `auth.authorize` reads."""
        with translate_errors():
            rows = (
                self._reader()
                .execute(
                    "SELECT DISTINCT value FROM api_keys, json_each(api_keys.roles)"
                    " WHERE org_id = ? AND revoked_at IS NULL"
                    " AND (expires_at IS NULL OR expires_at > ?)",
                    (org_id, time.time()),
                )
                .fetchall()
            )
        return {r[0] for r in rows}
