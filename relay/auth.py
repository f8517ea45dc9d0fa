"""API keys: minting, hashing at rest, and authorizing a request.

A key reads `relay_<key id>_<secret>`. Only sha256(secret) is stored: the
secret carries 192 random bits, so a slow password hash would add latency to
every request and no security. Comparison is constant-time, and an unknown key
id costs the same comparison as a known one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from relay import hygiene
from relay.errors import (
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    UnauthorizedError,
)
from relay.key_shape import PREFIX, is_key_id, split_key
from relay.models import SCOPES, ApiKey, Principal
from relay.store import Store

_KEY_IN_TEXT = re.compile(r"relay_([A-Za-z0-9]{1,64})_[A-Za-z0-9_-]{16,}")  # as minted
_DUMMY_HASH = hashlib.sha256(b"relay-unknown-key").hexdigest()
MISSING_KEY = "missing API key (send 'Authorization: Bearer <key>')"


@dataclass(frozen=True)
class MintedKey:
    key: ApiKey
    secret: str  # the full key string; shown once, never stored


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def withhold_secrets(text: str) -> str:
    """`text` with each whole key in it cut to its id, `relay_<id>_<secret withheld>`: an
    error that quotes what was typed must not print a secret into scrollback or a CI log."""
    return _KEY_IN_TEXT.sub(r"relay_\1_<secret withheld>", text)


def key_of(store: Store, token: str) -> ApiKey | None:
    """The key `token` (a whole `relay_<id>_<secret>`) is, revoked or expired alike; None
    unless its secret matches the stored hash. An unknown id costs the same comparison."""
    parts = split_key(token)
    found = store.key_for_auth(parts[0]) if parts else None
    stored_hash = found[1] if found else _DUMMY_HASH
    secret = parts[1] if parts else ""
    matches = hmac.compare_digest(hash_secret(secret), stored_hash)
    return found[0] if found is not None and matches else None


def check_scopes(scopes: frozenset[str]) -> frozenset[str]:
    unknown = scopes - set(SCOPES)
    if unknown:
        raise InvalidRequestError(
            f"unknown scope(s) {', '.join(sorted(unknown))}; known: {', '.join(SCOPES)}"
        )
    if not scopes:
        raise InvalidRequestError("a key needs at least one scope")
    return scopes


def mint_key(
    store: Store,
    org_id: str,
    name: str,
    scopes: frozenset[str],
    roles: frozenset[str],
    expires_at: datetime | None = None,
) -> MintedKey:
    check_scopes(scopes)
    roles = hygiene.check_roles(roles)  # named and normalised as the audiences they match
    hygiene.check_key_name(name)
    if expires_at is not None and expires_at <= datetime.now(UTC):
        raise InvalidRequestError("expires_at is in the past", field="expires_at")
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    key = store.create_key(org_id, key_id, hash_secret(secret), name, scopes, roles, expires_at)
    return MintedKey(key=key, secret=f"{PREFIX}{key_id}_{secret}")


def check_key_id(key_id: str) -> str:
    """`key_id` from a path, or 404 before the store is asked (a NUL in it failed
    PostgreSQL's query, a 500, where SQLite found nothing)."""
    if not is_key_id(key_id):
        whole = split_key(key_id)
        raise NotFoundError(
            f"no key {withhold_secrets(key_id)!r} in this organisation"
            + (f": that is a whole key; its id, which this takes, is {whole[0]}" if whole else "")
        )
    return key_id


def authorize(store: Store, authorization: str | None) -> Principal:
    """Turn an `Authorization: Bearer ...` header into a Principal, or raise UnauthorizedError."""
    if not authorization:
        raise UnauthorizedError(MISSING_KEY)
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError("malformed Authorization header; expected 'Bearer <key>'")
    key = key_of(store, token.strip())
    if key is None:
        raise UnauthorizedError("invalid API key")
    now = datetime.now(UTC)
    if key.revoked_at is not None:
        raise UnauthorizedError("this API key was revoked")
    if key.expires_at is not None and key.expires_at <= now:
        raise UnauthorizedError("this API key has expired")
    return Principal(org_id=key.org_id, key_id=key.id, scopes=key.scopes, roles=key.roles)


def require(principal: Principal, scope: str) -> None:
    """Admin implies every scope within its own organisation."""
    if scope not in principal.scopes and "admin" not in principal.scopes:
        raise ForbiddenError(f"this key lacks the {scope!r} scope")


def require_edit(principal: Principal) -> None:
    """An edit (PATCH) is a read-modify-write: it keeps every field it does not name, from
    the memory as stored, and answers with the whole new revision. So it needs
    `memory:read` as well as `memory:write`; with write alone, an empty PATCH read any
    memory the key's roles reach."""
    require(principal, "memory:write")
    if "memory:read" not in principal.scopes and "admin" not in principal.scopes:
        raise ForbiddenError(
            "this key lacks the 'memory:read' scope, which an edit needs as well as"
            " 'memory:write' (it reads the memory it changes)"
        )


def management_view(p: Principal) -> frozenset[str] | None:
    """The audiences whose memories a key manages (reads by id, lists, edits, supersedes):
    an admin the whole org (None), any other key what its roles may read."""
    return None if "admin" in p.scopes else p.audiences
