"""The records that pass between the store, the search pipeline and the API."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

SCOPES = ("memory:read", "memory:write", "admin")
EVERYONE = "all"


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime | None) -> str | None:
    """UTC timestamps as ISO 8601 with a Z, the one format the API speaks."""
    if ts is None:
        return None
    return ts.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Org:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True)
class ApiKey:
    id: str
    org_id: str
    name: str
    scopes: frozenset[str]
    roles: frozenset[str]
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "org_id": self.org_id,
            "name": self.name,
            "scopes": sorted(self.scopes),
            "roles": sorted(self.roles),
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
        }


@dataclass(frozen=True)
class Principal:
    """Who is asking: an authorized key, its organisation, scopes and roles."""

    org_id: str
    key_id: str
    scopes: frozenset[str]
    roles: frozenset[str]

    @property
    def audiences(self) -> frozenset[str]:
        """The audiences this key may read: its roles plus everyone's."""
        return self.roles | {EVERYONE}


@dataclass(frozen=True)
class MemoryDraft:
    """What a writer supplies; the store assigns revision and timestamps."""

    body: str
    title: str | None = None
    source: str | None = None
    audiences: tuple[str, ...] = (EVERYONE,)
    tags: tuple[str, ...] = ()
    valid_until: datetime | None = None
    supersedes: tuple[str, ...] = ()
    pinned: bool = False


@dataclass(frozen=True)
class Memory:
    org_id: str
    id: str
    revision: int
    body: str
    title: str | None
    source: str | None
    audiences: tuple[str, ...]
    tags: tuple[str, ...]
    author: str | None
    created_at: datetime
    updated_at: datetime
    valid_until: datetime | None
    supersedes: tuple[str, ...]
    pinned: bool
    superseded_by: str | None = None
    # Links to memories the reader may not read are not shown, only counted (rules.as_read).
    supersedes_withheld: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "revision": self.revision,
            "title": self.title,
            "body": self.body,
            "source": self.source,
            "audiences": list(self.audiences),
            "tags": list(self.tags),
            "author": self.author,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "valid_until": iso(self.valid_until),
            "supersedes": list(self.supersedes),
            "supersedes_withheld": self.supersedes_withheld,
            "superseded_by": self.superseded_by,
            "pinned": self.pinned,
        }


# What a writer sets on a memory, and each revision records.
CONTENT_FIELDS = (
    "title",
    "body",
    "source",
    "audiences",
    "tags",
    "valid_until",
    "supersedes",
    "pinned",
)
# What a withheld revision does not show: all but its number, action and time.
WITHHELD_FIELDS = ("author", *CONTENT_FIELDS)


@dataclass(frozen=True)
class Revision:
    """One entry of a memory's history; a deletion leaves a tombstone with no text.

    `withheld`: the reader may read the memory but not this revision (written for audiences
    it lacks), so only that it happened, what it was and when are shown; its content, its
    author and its audiences are the store's to keep (WITHHELD_FIELDS: null)."""

    id: str
    revision: int
    action: str  # "create" | "edit" | "delete"
    recorded_at: datetime
    author: str | None
    title: str | None = None
    body: str | None = None
    source: str | None = None
    audiences: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    valid_until: datetime | None = None
    supersedes: tuple[str, ...] = ()
    # Whether this revision pinned the memory; None: not known (recorded before revisions
    # kept it, and not to be worked out from the ones after: store migration 8).
    pinned: bool | None = None
    withheld: bool = False
    supersedes_withheld: int = 0  # as a memory's: links the reader may not read, counted

    def to_dict(self) -> dict[str, object]:
        shown: dict[str, object] = {
            "id": self.id,
            "revision": self.revision,
            "action": self.action,
            "recorded_at": iso(self.recorded_at),
            "withheld": self.withheld,
            "author": self.author,
            "title": self.title,
            "body": self.body,
            "source": self.source,
            "audiences": list(self.audiences),
            "tags": list(self.tags),
            "valid_until": iso(self.valid_until),
            "supersedes": list(self.supersedes),
            "supersedes_withheld": self.supersedes_withheld,
            "pinned": self.pinned,
        }
        if self.withheld:  # null, not []: unknown to this reader, not empty
            shown.update(dict.fromkeys((*WITHHELD_FIELDS, "supersedes_withheld")))
        return shown


@dataclass(frozen=True)
class PassageInput:
    """A passage ready to store: its text, what the lexical index sees, and its vector."""

    seq: int
    text: str
    lexical: str
    content_hash: str
    embedding: bytes  # float32 little-endian, L2-normalised
    tokens: bytes | None = None  # int8 token matrix for late interaction (relay.late)


@dataclass(frozen=True)
class Passage:
    """A stored passage as search sees it, already checked against the reader's access."""

    rowid: int
    memory_id: str
    revision: int
    seq: int
    title: str | None
    source: str | None
    text: str
    lexical: str
    updated_at: datetime
    supersedes: tuple[str, ...] = field(default=())
    embedding: bytes | None = None  # float32 vector, for scoring candidates the vector stage missed
    passage_count: int = 1  # how many passages its memory's revision has (`seq` is one of them)


# The hook outcomes developers send (`relay stats --send`), kept by the store: the last
# REPORTS_PER_DEVELOPER of each (key, developer name), of at most NAMES_PER_KEY names per
# key and DEVELOPERS_PER_ORG per org, the least recently heard from dropped first, in the
# write's transaction. The name is the sender's word, so reports are kept per key and name:
# a key cannot overwrite another key's "alice", nor push the org's other developers out of
# the view by sending a thousand names.
REPORTS_PER_DEVELOPER = 100
NAMES_PER_KEY = 20
DEVELOPERS_PER_ORG = 1_000


@dataclass(frozen=True)
class HookReport:
    """One developer's aggregated hook outcomes, as received (`POST /v1/hook-outcomes`)."""

    received_at: float  # epoch seconds
    developer: str
    key_id: str
    period_since: str | None
    period_until: str | None
    invocations: int
    outcomes: dict[str, int]
    unauthorized_streak: int
    unauthorized_since: str | None
    unavailable_streak: int
    unavailable_since: str | None
    hook_ms: dict[str, float]
    breaker: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "received_at": self.received_at,
            "developer": self.developer,
            "key_id": self.key_id,
            "since": self.period_since,
            "until": self.period_until,
            "invocations": self.invocations,
            "outcomes": self.outcomes,
            "unauthorized_streak": {
                "length": self.unauthorized_streak,
                "since": self.unauthorized_since,
            },
            "unavailable_streak": {
                "length": self.unavailable_streak,
                "since": self.unavailable_since,
            },
            "hook_ms": self.hook_ms,
            "breaker": self.breaker,
        }


# The hook_outcomes table's columns after org_id, in both stores: the report's fields, its
# dicts kept as JSON.
HOOK_REPORT_COLUMNS = tuple(f.name for f in fields(HookReport))
HOOK_REPORT_JSON = ("outcomes", "hook_ms")


def hook_report_row(report: HookReport, received_at: object) -> tuple[object, ...]:
    """The report's values in HOOK_REPORT_COLUMNS order, its dicts as JSON text and its time
    as the store keeps it (`received_at`)."""
    row = asdict(report) | {k: json.dumps(getattr(report, k)) for k in HOOK_REPORT_JSON}
    return tuple(received_at if c == "received_at" else row[c] for c in HOOK_REPORT_COLUMNS)


def hook_report_from_row(row: Mapping[str, Any], received_at: float) -> HookReport:
    """A stored report back: its JSON as text (SQLite) or already read (PostgreSQL)."""
    values = {c: row[c] for c in HOOK_REPORT_COLUMNS} | {"received_at": received_at}
    for k in HOOK_REPORT_JSON:
        if isinstance(values[k], str):
            values[k] = json.loads(values[k])
    return HookReport(**values)


@dataclass(frozen=True)
class HookHistory:
    """One sender's reports as the console shows them: the latest whole, and the streaks of
    every report kept, oldest first, as (received_at, unauthorized, unavailable)."""

    latest: HookReport
    streaks: list[tuple[float, int, int]]
