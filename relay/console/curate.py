"""What the console adds on top of the store's reads: statuses, revision diffs.

The list's filters, statuses among them, are the store's (`relay.store.listing`): they
run inside its query, beside the tenant and audience checks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from relay.errors import InvalidRequestError, NotFoundError
from relay.models import CONTENT_FIELDS, Memory, Revision, iso
from relay.store import Store

PAGE = 500  # rows per store read while scanning


def statuses(m: Memory, now: datetime, expiring_days: int = 7) -> list[str]:
    """Every status that applies: expired, expiring, superseded, pinned; else active. The
    store's `status` filter (`relay.store.listing`) selects by the same rules, in SQL."""
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


def scan(store: Store, org_id: str, audiences: frozenset[str] | None) -> Iterator[Memory]:
    """Every memory the reader may manage, in id order (none moves while it pages)."""
    after = None
    while True:
        page, after = store.list_memories(org_id, audiences, PAGE, after, order="id")
        yield from page
        if after is None:
            return


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
