"""What a request to the HTTP API may carry: its body models, its query strings' integers,
list cursors, and the one line a refused body is named by.

Body models are strict (`"k": true` is not 1) and refuse unknown fields; text sizes are
judged after the key, by `relay.hygiene`, so an oversized field is a 413 naming its
limit. Every string at any depth is checked for lone surrogates, which JSON can spell
and no encoder accepts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from datetime import datetime
from typing import Annotated, Any, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from relay import hygiene, writes
from relay.errors import InvalidRequestError, TooLargeError
from relay.numerals import is_integer
from relay.search import MAX_K
from relay.store.listing import ListPosition


class TextBody(BaseModel):
    """A request body whose text is Unicode: JSON may spell a lone UTF-16 surrogate
    (`"\\ud800"`), which Python decodes into a string no encoder accepts, so a write
    failed deep in the store with a 500. Every string field, at any depth, is checked."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _unicode_text(cls, value: Any, info: ValidationInfo) -> Any:
        if not _holds_bodies(cls.model_fields[str(info.field_name)].annotation):
            found = hygiene.surrogate_in(value)
            if found:
                where, text = found
                problem = hygiene.unpaired_surrogate(text)
                raise ValueError(f"{where} {problem}" if where else problem)
        return value  # a nested body (a batch's items) is checked by its own model

    @model_validator(mode="before")
    @classmethod
    def _first_unknown_field(cls, data: Any) -> Any:
        """A body with unknown fields keeps only the first of them, which the refusal names:
        pydantic makes an error of each and FastAPI copies every one on the event loop, so
        300 KB of `{"k0": 1, "k1": 1, ...}` held every request (`/healthz` too) for 0.8 s,
        from a caller with no valid key, as a body is judged before its key is refused."""
        if cls.model_config.get("extra") != "forbid" or not isinstance(data, dict):
            return data
        fields = cls.model_fields
        unknown = (name for name in data if name not in fields)
        first = next(unknown, None)
        if first is None or next(unknown, None) is None:
            return data
        return {k: v for k, v in data.items() if k in fields or k == first}


def _holds_bodies(annotation: Any) -> bool:
    """Whether a field's type has request models in it (list[MemoryBody], Streak, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_bodies(arg) for arg in get_args(annotation))


class _Body(TextBody):
    # Strict: `"k": true` is not 1 and `"expected_revision": "2"` is not 2.
    model_config = ConfigDict(extra="forbid", strict=True)


def _query_integer(value: Any) -> Any:
    """A query string's integer as it is written: decimal digits, a minus sign at most. Read
    laxly, `?expected_revision=1.0` was revision 1, `?limit=1_0` a page of 10, and
    `?limit=%201` (a space) was 1: a typo or a client's float went unseen."""
    if isinstance(value, str) and not is_integer(value):
        said = repr(value) if len(value) <= 32 else "the value"  # a space shows between quotes
        raise ValueError(f"{said} is not an integer: write it in digits alone (1, not 1.0)")
    return value


# An integer in a query string (`?limit=`, `?expected_revision=`), as strict as a body's:
# its range comes with its `Query(...)`.
QueryInt = Annotated[int, BeforeValidator(_query_integer)]


# Written as text (a date, or a date and time, with or without an offset), read by us.
Time = Annotated[
    datetime,
    PlainValidator(hygiene.parse_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


# The longest query accepted (413 past it, naming it, like any text over its limit); the
# search itself reads the first relay.search.MAX_QUERY_CHARS of it.
MAX_QUERY_BODY_CHARS = 8000


def check_query(query: str) -> str:
    if len(query) > MAX_QUERY_BODY_CHARS:
        raise TooLargeError(
            f"query is {len(query):,} characters; the limit is {MAX_QUERY_BODY_CHARS:,}",
            field="query",
            limit=MAX_QUERY_BODY_CHARS,
        )
    return query


class SearchBody(_Body):
    query: str = Field(min_length=1)  # its size: check_query, after the key (413)
    k: int = Field(5, ge=1, le=MAX_K)
    deadline_ms: float = Field(1000.0, gt=0, le=30_000)
    mode: str = Field("hybrid", pattern="^(hybrid|lexical|semantic)$")


class MemoryBody(_Body):
    body: str  # sizes of text fields: judged by relay.hygiene (413, naming the limit)
    id: str | None = Field(None, pattern=f"^{writes.MEMORY_ID.pattern}$")
    title: str | None = None
    source: str | None = None
    audiences: list[str] | None = Field(None, max_length=64)
    tags: list[str] | None = Field(None, max_length=64)
    valid_until: Time | None = None
    supersedes: list[str] | None = Field(None, max_length=64)
    pinned: bool = False


class BatchItem(MemoryBody):
    # The revision the writer read the memory at (`relay import`): written only over that
    # one, else the batch is refused with a 409 naming the item and the revision it is at,
    # so an edit landing between the read and the write is never undone unseen. null: no
    # check, as when left out (a new memory, a restore).
    expected_revision: int | None = Field(None, ge=1)


class MemoryBatch(_Body):
    items: list[BatchItem] = Field(min_length=1, max_length=256)


_NOT_NULL = {
    "body": "a memory needs its text, so null cannot clear it (leave body out to keep it)",
    "audiences": "null cannot clear them: name at least one role, or 'all' for everyone "
    "(leave audiences out to keep them)",
    "pinned": "true or false, not null (leave pinned out to keep it)",
}


class MemoryPatch(_Body):
    """A field left out keeps its value; null clears title, source, valid_until, tags and
    supersedes, and is refused for body, audiences and pinned (writes.edited_draft)."""

    body: str | None = None
    title: str | None = None
    source: str | None = None
    audiences: list[str] | None = Field(None, max_length=64)
    tags: list[str] | None = Field(None, max_length=64)
    valid_until: Time | None = None
    supersedes: list[str] | None = Field(None, max_length=64)
    pinned: bool | None = None
    expected_revision: int | None = Field(None, ge=1)  # null: no check, as when left out

    @field_validator(*_NOT_NULL)
    @classmethod
    def _required(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:  # sent as null: a field left out is not validated
            raise ValueError(_NOT_NULL[str(info.field_name)])
        return value


class KeyBody(_Body):
    name: str  # blank, over its limit (413), control characters: judged by auth.mint_key
    scopes: list[str] = Field(min_length=1, max_length=3)
    roles: list[str] = Field(default_factory=list)  # named like audiences (hygiene, 413)
    expires_at: Time | None = None


# -- list cursors ----------------------------------------------------------------
# A cursor is where a page ended (a key id; a memory's change time and id), encoded with a
# check: a raw position could not tell a corrupted cursor ("garbage", a truncated one) from
# a real one, and the listing silently started over from wherever that text sorted.
_CURSOR_CHECK = b"relay list cursor\0"
_NOT_HANDED_OUT = (
    "cursor is not one this server handed out: send next_cursor back as it came, "
    "or leave cursor out to list from the beginning"
)


# What a memory listing's parameters mean, for the OpenAPI description of both listings.
CURSOR_HELP = (
    "next_cursor of the page before (same order and filters), as it came; absent: from the"
    " start. In `updated` order every memory left unchanged while you page is listed exactly"
    " once; one written meanwhile moves to the front, where a listing from the start shows it."
)
PREFIX_HELP = "A source starting with this text, taken literally (`docs/` lists `docs/a.md#x`)."
ORDER_HELP = (
    "`id` (the default): by id, where nothing moves while you page, so every memory is"
    " listed exactly once however they change meanwhile (an export, a sync). `updated`:"
    " newest change first (`updated_at`, then `id`, descending), as the console lists."
)
TEXT_HELP = (
    "Every word of it in the title or the body, anywhere, case-insensitively (`Migra db`"
    " matches `db migrations`); at most 10 words."
)


def _cursor_check(raw: bytes) -> str:
    return hashlib.sha256(_CURSOR_CHECK + raw).hexdigest()[:10]


def _sealed(text: str) -> str:
    raw = text.encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + _cursor_check(raw)


def _unsealed(cursor: str) -> str:
    """The text `_sealed` put in `cursor`, or 400. The check catches accidents, not forgery
    (it has no secret), so callers check the shape of what it carries too: a forged cursor
    holding a NUL reached PostgreSQL, which failed the query (a 500)."""
    text, _, check = cursor.rpartition(".")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if hmac.compare_digest(check.encode(), _cursor_check(raw).encode()):
            return raw.decode()
    except (ValueError, UnicodeError):  # binascii.Error is a ValueError
        pass
    raise InvalidRequestError(_NOT_HANDED_OUT, field="cursor")


def encode_cursor(last_id: str | None) -> str | None:
    """The opaque `next_cursor` for a page that ended at `last_id` (None: no more pages)."""
    return None if last_id is None else _sealed(last_id)


def decode_cursor(cursor: str | None) -> str | None:
    """The id a cursor from `encode_cursor` continues after; a blank or absent one starts at
    the beginning, and anything else is refused (400)."""
    if not cursor:
        return None
    last_id = _unsealed(cursor)
    if not writes.MEMORY_ID.fullmatch(last_id):
        raise InvalidRequestError(_NOT_HANDED_OUT, field="cursor")
    return last_id


def encode_position(last: ListPosition | None) -> str | None:
    """The opaque `next_cursor` of a page of memories that ended at `last` (None: no more)."""
    if last is None:
        return None
    if last.updated_at is None:  # id order: the bare id, as servers before `updated` wrote
        return encode_cursor(last.id)
    # repr: the shortest text that reads back as the same float, so no memory sits between
    return _sealed(f"{last.updated_at!r} {last.id}")


def decode_position(cursor: str | None, order: str = "updated") -> ListPosition | None:
    """Where a cursor from `encode_position` continues a listing in `order`; blank or absent:
    from its start. In id order a cursor is a bare id, as older servers wrote (so a client
    paging across an upgrade goes on); a cursor of the other order is refused (400) like any
    this server did not hand out: it names no place in this order."""
    if order == "id":
        last_id = decode_cursor(cursor)
        return None if last_id is None else ListPosition(None, last_id)
    if not cursor:
        return None
    at, _, last_id = _unsealed(cursor).partition(" ")
    try:
        updated_at = float(at)
    except ValueError:
        updated_at = math.nan
    if not (math.isfinite(updated_at) and writes.MEMORY_ID.fullmatch(last_id)):
        raise InvalidRequestError(
            _NOT_HANDED_OUT + f" (this listing is in {order} order)", field="cursor"
        )
    return ListPosition(updated_at, last_id)


def validation_message(error: dict[str, Any]) -> str:
    """One field-naming line for a request that failed validation (pydantic's first error)."""
    loc = [str(p) for p in error.get("loc", ())]
    where = ".".join(loc[1:] if loc[:1] == ["body"] else loc)
    kind = error.get("type", "")
    if kind == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'cannot parse')})"
    if loc == ["body"]:
        # No body, or one that is not an object: most often JSON sent without its type.
        return "send a JSON object as the body, with Content-Type: application/json"
    if kind == "missing":
        return f"{where}: required"
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")  # our validators' words
    return f"{where}: {msg}" if where else msg
