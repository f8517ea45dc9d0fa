"""Organisations and API keys: created, found, listed, revoked; the audiences an
org's live keys carry (what a memory may name). Orgs are listed and found under the
`directory` policy (the one read across orgs); a key is looked up for authentication,
before its org is known, under the `key_lookup` policy."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import psycopg

from relay.errors import ConflictError, NotFoundError, StoreError
from relay.models import ApiKey, Org
from relay.store import check_org_name
from relay.store.postgres.connection import PostgresConnections, _bump, one_row
from relay.store.postgres.rows import _key, _org
from relay.store.rules import judge_revoke


class OrgsAndKeys(PostgresConnections):
    """Organisations and their keys (mixed into `PostgresStore`)."""

    def create_org(self, name: str) -> Org:
        org = self._insert_org(name, first=False)
        assert org is not None  # only a first org is ever declined
        return org

    def create_first_org(self, name: str) -> Org | None:
        return self._insert_org(name, first=True)

    def _insert_org(self, name: str, first: bool) -> Org | None:
        """An org named `name`; with `first`, only when there is none at all (None then).
        Every org is made under one transaction lock: two `relay serve` started together
        on an empty database each saw no org and each made one, the second exiting 5 on
        the name `default` (or making a second org under another `--org`)."""
        name = check_org_name(name)
        org = Org(id="org_" + secrets.token_hex(6), name=name, created_at=datetime.now(UTC))
        try:
            with self._tx(org.id, directory=True) as conn:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('relay orgs'))")
                if first and conn.execute("SELECT 1 FROM orgs LIMIT 1").fetchone():
                    return None
                conn.execute(
                    "INSERT INTO orgs (id, name, created_at) VALUES (%s, %s, %s)",
                    (org.id, org.name, org.created_at),
                )
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise ConflictError(f"an organisation named {name!r} already exists") from None
            raise
        return org

    def get_org(self, org_id: str) -> Org:
        with self._tx(org_id) as conn:
            row = conn.execute("SELECT * FROM orgs WHERE id = %s", (org_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no organisation {org_id!r}")
        return _org(row)

    def find_org(self, name_or_id: str) -> Org | None:
        """The org with this id, else the one with this name (a name made before names
        shaped like ids were refused may equal another org's id: the id wins)."""
        with self._tx(directory=True) as conn:
            row = conn.execute(
                "SELECT * FROM orgs WHERE id = %(v)s OR name = %(v)s"
                " ORDER BY id = %(v)s DESC LIMIT 1",
                {"v": name_or_id},
            ).fetchone()
        return None if row is None else _org(row)

    def list_orgs(self) -> list[Org]:
        with self._tx(directory=True) as conn:
            rows = conn.execute("SELECT * FROM orgs ORDER BY created_at").fetchall()
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
        with self._write(org_id) as conn:
            conn.execute(
                "INSERT INTO api_keys (id, org_id, secret_hash, name, scopes, roles, created_at,"
                " expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    key.id,
                    org_id,
                    secret_hash,
                    name,
                    sorted(scopes),
                    sorted(roles),
                    key.created_at,
                    expires_at,
                ),
            )
            _bump(conn, org_id)
        return key

    def key_for_auth(self, key_id: str) -> tuple[ApiKey, str] | None:
        # The org is not known yet: the `key_lookup` policy shows this one key and no other.
        with self._tx(key_id=key_id) as conn:
            row = conn.execute("SELECT * FROM api_keys WHERE id = %s", (key_id,)).fetchone()
        return None if row is None else (_key(row), row["secret_hash"])

    def list_keys(
        self, org_id: str, limit: int | None = None, after: str | None = None
    ) -> list[ApiKey]:
        with self._tx(org_id) as conn:
            rows = conn.execute(
                "SELECT * FROM api_keys WHERE org_id = %s AND (%s::text IS NULL"
                " OR (created_at, id) > (SELECT created_at, id FROM api_keys"
                " WHERE org_id = %s AND id = %s)) ORDER BY created_at, id LIMIT %s",
                (org_id, after, org_id, after, limit),
            ).fetchall()
        return [_key(r) for r in rows]

    def revoke_key(self, org_id: str, key_id: str) -> ApiKey:
        with self._write(org_id) as conn:
            row = conn.execute(
                "SELECT * FROM api_keys WHERE id = %s AND org_id = %s", (key_id, org_id)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no key {key_id!r} in this organisation")
            if row["revoked_at"] is None:
                org_keys = conn.execute("SELECT * FROM api_keys WHERE org_id = %s", (org_id,))
                judge_revoke(map(_key, org_keys), key_id)
                row = one_row(
                    conn.execute(
                        "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND org_id = %s"
                        " RETURNING *",
                        (key_id, org_id),
                    )
                )
                _bump(conn, org_id)
        return _key(row)

    def known_audiences(self, org_id: str) -> set[str]:
        """The roles that some live key of the org carries: the audiences a memory may name.
        A key is live until it is revoked or expires, by the clock `auth.authorize` reads
        (this process's, not the database server's)."""
        with self._tx(org_id) as conn:
            rows = conn.execute(
                "SELECT DISTINCT unnest(roles) FROM api_keys"
                " WHERE org_id = %s AND revoked_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > %s)",
                (org_id, datetime.now(UTC)),
            ).fetchall()
        return {r["unnest"] for r in rows}
