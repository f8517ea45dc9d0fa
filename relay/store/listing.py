"""What a listing of memories may ask for (`ListFilter`), in which order, and where a page
of it ends (`ListPosition`), the same for both stores.

A listing runs newest change first (`updated`): `updated_at` descending, then `id`
descending for memories changed at the same moment (a restore stamps many alike). Pages
continue after a position (keyset), not at an offset, so a memory written while a client
pages moves to the front and shifts nothing behind the position: every memory left
unchanged while a client pages is listed exactly once, and one changed meanwhile is on a
listing from the start. Whatever must see every memory once however they change while it
pages (an export, an import's sync) lists in `id` order, where nothing moves. Every filter
is a clause of the store's query, beside the tenant and audience checks, so a page is never
thinned afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from relay.errors import InvalidRequestError

ORDERS = ("updated", "id")
STATUSES = ("any", "active", "expiring", "expired", "superseded", "pinned")
MAX_WORDS = 10  # words of a text filter; each one is a scan of every title and body


class ListPosition(NamedTuple):
    """The last memory of a page: its `updated_at` in seconds since the epoch, exactly as
    the store orders by it (SQLite keeps more than microseconds), and its id. A listing in
    id order has no time (None)."""

    updated_at: float | None
    id: str


@dataclass(frozen=True)
class ListFilter:
    """Conditions a listed memory meets, all of them; None or "any" leaves one out."""

    source: str | None = None  # exactly this source
    source_prefix: str | None = None  # a source starting with this text, taken literally
    tag: str | None = None
    text: str | None = None  # every word of it in the title or the body, case-insensitively
    audience: str | None = None  # written for this audience
    author: str | None = None  # key id
    status: str = "any"  # one of STATUSES, judged at `now` (`relay.console.curate.statuses`)
    expiring_days: int = 7
    now: datetime | None = None  # needed by every status but "any" and "superseded"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InvalidRequestError(
                f"status must be one of {', '.join(STATUSES)}", field="status"
            )
        if not 1 <= self.expiring_days <= 3650:
            raise InvalidRequestError(
                "expiring_days must be between 1 and 3650", field="expiring_days"
            )
        if self.status not in ("any", "superseded", "pinned") and self.now is None:
            raise ValueError(f"status {self.status!r} needs `now`")
        if len(self.words()) > MAX_WORDS:
            raise InvalidRequestError(
                f"the text filter has {len(self.words())} words; the limit is {MAX_WORDS}",
                field="q",
            )

    def words(self) -> list[str]:
        """The text filter's words, each matched on its own, anywhere, in any order."""
        return (self.text or "").split()

    def soon(self) -> datetime:
        """Where `expiring` ends."""
        assert self.now is not None
        return self.now + timedelta(days=self.expiring_days)


NO_FILTER = ListFilter()
