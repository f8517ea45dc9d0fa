"""What the console adds on top of the store's reads: filters, statuses, revision diffs.

Filters the store cannot express (audience, author, expiry, supersession) are
applied while paging through `Store.list_memories`, whose SQL already holds the
tenant and audience checks, so nothing here can widen what a key sees.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from relay.errors import InvalidRequestError, NotFoundError
from relay.models import CONTENT_FIELDS, Memory, Revision, iso
from relay.store import Store

STATUSES = ("any", "active", "expiring", "expired", "superseded", "pinned")
PAGE = 500  # rows per store read while scanning
SCAN_MAX = 5_000  # rows one list request may inspect before answering with a cursor


@dataclass(frozen=True)
class Filters:
    source: str | None = None
    tag: str | None = None
    audience: str | None = None
    author: str | None = None
    status: str = "any"
    expiring_days: int = 7

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InvalidRequestError(f"status must be one of {', '.join(STATUSES)}")
        if not 1 <= self.expiring_days <= 3650:
            raise InvalidRequestError("expiring_days must be between 1 and 3650")


def statuses(m: Memory, now: datetime, expiring_days: int = 7) -> list[str]:
    """Every status that applies: expired, expiring, superseded, pinned; else active."""
    out = []
    if m.valid_until is not None and m.valid_until <= now:
        out.append("expired")
    elif m.valid_until is not None and m.valid_until <= now + timedelta(days=expiring_days):
        out.append("expiring")
    if m.superseded_by:
        out.append("superseded")
    if not {"expired", "superseded"} & set(out):
        out.insert(0, "active")
    if m.pinned:
        out.append("pinned")
    return out


def matches(m: Memory, f: Filters, now: datetime) -> bool:
    if f.audience and f.audience not in m.audiences:
        return False
    if f.author and m.author != f.author:
        return False
    return f.status == "any" or f.status in statuses(m, now, f.expiring_days)


def scan(
    store: Store, org_id: str, audiences: frozenset[str] | None, cursor: str | None = None
) -> Iterator[Memory]:
    """Every memory the reader may manage, in id order, from `cursor` on."""
    while True:
        page, cursor = store.list_memories(org_id, audiences, PAGE, cursor)
        yield from page
        if cursor is None:
            return


def filtered(
    store: Store,
    org_id: str,
    audiences: frozenset[str] | None,
    f: Filters,
    limit: int,
    cursor: str | None = None,
    now: datetime | None = None,
) -> tuple[list[Memory], str | None]:
    """One page of matching memories and the cursor to continue from (None at the end)."""
    now = now or datetime.now(UTC)
    found: list[Memory] = []
    inspected = 0
    while True:
        page, nxt = store.list_memories(org_id, audiences, PAGE, cursor, f.source, f.tag)
        for m in page:
            inspected += 1
            if matches(m, f, now):
                found.append(m)
                if len(found) == limit:
                    more = m.id != page[-1].id or nxt is not None
                    return found, (m.id if more else None)
        if nxt is None:
            return found, None
        cursor = nxt
        if inspected >= SCAN_MAX:
            return found, cursor  # bounded work per request; the caller asks for more


def find_revision(history: list[Revision], number: int) -> Revision:
    """Revision `number` of a history, to compare: a withheld one has nothing to compare."""
    for r in history:
        if r.revision != number:
            continue
        if r.withheld:
            raise InvalidRequestError(
                f"revision {number} is withheld: it was written for audiences this key cannot read"
            )
        return r
    raise NotFoundError(f"no revision {number}")


def _lines(r: Revision, name: str) -> list[str]:
    value: Any = getattr(r, name)
    if name == "valid_until":
        value = iso(value)
    if value is None:  # a pin not known (recorded before revisions kept it): no line
        return []
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, tuple):
        if name == "supersedes" and r.supersedes_withheld:  # counted, never named
            return [*value, f"(and {r.supersedes_withheld} this key cannot read)"]
        return list(value)
    return str(value).splitlines()


def diff(old: Revision, new: Revision) -> list[dict[str, Any]]:
    """Line diff of every field between two revisions: ops ' ' (same), '-' (old), '+' (new)."""
    fields = []
    for name in CONTENT_FIELDS:
        a, b = _lines(old, name), _lines(new, name)
        lines: list[dict[str, str]] = []
        matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                lines.extend({"op": " ", "text": t} for t in a[i1:i2])
                continue
            lines.extend({"op": "-", "text": t} for t in a[i1:i2])
            lines.extend({"op": "+", "text": t} for t in b[j1:j2])
        fields.append({"field": name, "changed": a != b, "lines": lines})
    return fields
