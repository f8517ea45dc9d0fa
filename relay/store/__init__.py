"""The store: one narrow interface, two implementations (SQLite embedded, PostgreSQL).

Everything that decides who may see what lives inside the implementations'
queries (tenant, audience, expiry, deletion, supersession), so no caller can
forget a filter. `audiences=None` is reserved for admin-scoped management reads
of one organisation; recall always passes the key's audiences.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np

from relay import hygiene
from relay.errors import ConflictError, InvalidRequestError, NotFoundError, RelayError
from relay.models import (
    ApiKey,
    HookHistory,
    HookReport,
    Memory,
    MemoryDraft,
    Org,
    Passage,
    PassageInput,
    Revision,
)
from relay.store.listing import NO_FILTER, ListFilter, ListPosition

SaveMode = Literal["create", "edit", "upsert"]

COMMON_SHARE, COMMON_MIN = 0.05, 50  # lexical: terms in more passages do not pick candidates

_connect_by: ContextVar[float | None] = ContextVar("relay_connect_by", default=None)


@contextmanager
def connect_by(deadline: float | None) -> Iterator[None]:
    """Store calls made in this block wait for a database connection until `deadline`
    (`time.monotonic()`) at most, so a request with a deadline fails fast instead of late
    while the database is away (and PostgreSQL's are cut a little past it when it stops
    answering: `relay.store.postgres.watch`). Outside such a block, or with None (work
    whose result outlives the request), a store applies its own bound."""
    token = _connect_by.set(deadline)
    try:
        yield
    finally:
        _connect_by.reset(token)


def connect_deadline() -> float | None:
    """The deadline `connect_by` set for this context, if any."""
    return _connect_by.get()


@contextmanager
def batch_item(index: int) -> Iterator[None]:
    """A write rule's refusal of item `index` of a batch says which item it refused
    (`RelayError.item`), so the caller can name it as it names a field's (`items.N`)."""
    try:
        yield
    except (InvalidRequestError, NotFoundError, ConflictError) as exc:
        exc.item = index
        raise


# An organisation's id as the stores make it: "org_" and 12 hex digits.
ORG_ID_SHAPE = re.compile(r"org_[0-9a-f]+", re.IGNORECASE)


def check_org_name(name: str) -> str:
    """An organisation's name as stored (stripped), or refused: empty, or shaped like an
    organisation id. `--org` takes a name or an id, so a name that reads as an id (another
    org's, or one a later org may draw) would leave which org it means to chance."""
    name = name.strip()
    if not name:
        raise InvalidRequestError("organisation name is empty")
    hygiene.check_name(name, "acme platform")  # as a key's: one line, up to 200, no secret
    if ORG_ID_SHAPE.fullmatch(name):
        raise InvalidRequestError(
            f"organisation name {name!r} reads as an organisation id (org_ and hex digits),"
            " which --org would confuse with the org that has that id; choose another name"
        )
    return name


def candidate_terms(terms: Sequence[str], df: dict[str, int], n: int) -> list[str]:
    """The query terms that choose lexical candidates: those rare in the org, when any are.

    A term in more than `COMMON_SHARE` of the org's passages adds almost nothing to
    BM25 (its idf is near zero) but makes the index return, and the ranking score, a
    large part of the org. Candidates must match a rarer term; every query term still
    counts in their score. A query of common terms only uses them all.
    """
    cap = max(COMMON_MIN, COMMON_SHARE * n)
    rare = [t for t in terms if df.get(t, 0) <= cap]
    return rare or list(terms)


# How many passages the memory of passage `p` has: a search hit says so (`passages`), so a
# reader can tell one part of a long memory from the whole. The passages table holds only a
# memory's current revision; the revision is matched anyway. One lookup on passages_memory.
PASSAGE_COUNT_SQL = (
    "SELECT count(*) FROM passages q"
    " WHERE q.org_id = p.org_id AND q.memory_id = p.memory_id AND q.revision = p.revision"
)


# The orgs whose audience sets' passages no longer add up to the org's passage count, as
# (id, passage count, sum of the sets): what the start-up repair of each store counts again
# (`sqlite.totals.repair_passage_totals`, `postgres.totals._repair_passage_totals`).
DRIFTED_TOTALS_SQL = (
    "SELECT o.id, o.passage_count, coalesce(t.n, 0) FROM orgs o LEFT JOIN"
    " (SELECT org_id, sum(passage_count) AS n FROM audience_totals GROUP BY org_id) t"
    " ON t.org_id = o.id WHERE o.passage_count <> coalesce(t.n, 0)"
)


class Store(Protocol):
    """What the server needs from a database."""

    # Organisations and keys
    def create_org(self, name: str) -> Org: ...
    # `create_org`, only on a database that holds no organisation yet (`relay serve`'s first
    # start): None when it holds one, made by another process perhaps an instant before.
    def create_first_org(self, name: str) -> Org | None: ...
    def get_org(self, org_id: str) -> Org: ...
    def find_org(self, name_or_id: str) -> Org | None: ...
    def list_orgs(self) -> list[Org]: ...
    def create_key(
        self,
        org_id: str,
        key_id: str,
        secret_hash: str,
        name: str,
        scopes: frozenset[str],
        roles: frozenset[str],
        expires_at: datetime | None,
    ) -> ApiKey: ...
    def key_for_auth(self, key_id: str) -> tuple[ApiKey, str] | None: ...
    def list_keys(
        self, org_id: str, limit: int | None = None, after: str | None = None
    ) -> list[ApiKey]: ...
    def revoke_key(self, org_id: str, key_id: str) -> ApiKey: ...
    def known_audiences(self, org_id: str) -> set[str]: ...

    # Memories
    def save_memory(
        self,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None = None,
        audiences: frozenset[str] | None = None,
    ) -> tuple[Memory, bool]: ...
    def save_memories(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        audiences: frozenset[str] | None = None,
        expected: Mapping[str, int] | None = None,  # memory id -> the revision it must be at
        known: Collection[str] | None = None,  # `rules.judge_audiences`
    ) -> list[tuple[Memory, bool]]: ...
    def current_memory(self, org_id: str, memory_id: str) -> Memory | None: ...
    def delete_memory(
        self,
        org_id: str,
        memory_id: str,
        author: str | None,
        audiences: frozenset[str] | None,
        expected_revision: int | None = None,  # ConflictError (`revision`) unless at it
    ) -> None: ...
    def get_memory(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> Memory: ...
    def list_memories(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        limit: int,
        after: ListPosition | None = None,  # where the page before ended
        where: ListFilter = NO_FILTER,
        order: str = "updated",  # newest change first, or "id" (`listing`)
    ) -> tuple[list[Memory], ListPosition | None]: ...
    def deleted_count(
        self,
        org_id: str,
        audiences: frozenset[str] | None,  # a deleted memory's: those of its last revision
        source: str | None = None,
        source_prefix: str | None = None,
    ) -> int: ...
    def history(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> list[Revision]: ...
    def pinned(self, org_id: str, audiences: frozenset[str], now: datetime) -> list[Memory]: ...

    # Search
    def lexical_search(
        self,
        org_id: str,
        audiences: frozenset[str],
        now: datetime,
        terms: Sequence[str],
        limit: int,
    ) -> list[tuple[int, float]]: ...
    def semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]: ...
    def passages(
        self, org_id: str, audiences: frozenset[str], now: datetime, rowids: Sequence[int]
    ) -> list[Passage]: ...
    def doc_freq(self, org_id: str, terms: Sequence[str]) -> tuple[int, dict[str, int]]: ...
    # `doc_freq` as one reader may know it: the org's also counts memories this reader may
    # not read (see `relay.ranking.seen`). The total is of the passages of the memories whose
    # audiences meet `audiences` (kept per audience set at write time: one small read; like
    # the org's, it counts expired and superseded memories' passages), each term's count of
    # the passages the reader may see that hold it, counted up to `cap`.
    def seen_doc_freq(
        self, org_id: str, audiences: frozenset[str], now: datetime, terms: Sequence[str], cap: int
    ) -> tuple[int, dict[str, int]]: ...
    def generation(self, org_id: str) -> int: ...
    def next_expiry(self, org_id: str, now: datetime) -> datetime | None: ...

    # Token matrices for late interaction (relay.late), one per passage: written with the
    # passage, and backfilled for passages stored before they existed (`missing_tokens`:
    # (passage id, title, text) without one, ids above `after`, lowest first, any org).
    # `token_matrices` reads those of the org's passages among `rowids` that have one; no
    # access filter: search only orders the pool the access-filtered stages proposed with
    # them, and re-fetches what it keeps through the filter.
    def token_matrices(self, org_id: str, rowids: Sequence[int]) -> dict[int, bytes]: ...
    def missing_tokens(self, limit: int, after: int = 0) -> list[tuple[int, str | None, str]]: ...
    def store_tokens(self, items: Sequence[tuple[int, bytes]]) -> None: ...

    # Embedding cache, keyed by model and content hash. One entry serves every org that
    # holds the text, but a write is served only entries its own org holds in memories
    # `audiences` may read (None: the whole org; `org_id` None: any org, the backfill's):
    # an entry held elsewhere makes the write faster, which told a writer that another org,
    # or an audience it lacks, holds that exact text.
    def cached_embeddings(
        self,
        model: str,
        hashes: Sequence[str],
        org_id: str | None = None,
        audiences: frozenset[str] | None = None,
    ) -> dict[str, bytes]: ...
    def cache_embeddings(self, model: str, items: dict[str, bytes]) -> None: ...
    def forget_unheld_embeddings(self) -> int:
        """Drop cached embeddings of texts no passage holds (a write racing a delete of the
        same text can leave one); returns how many went. Run at start-up."""
        ...

    # Hook outcomes developers send (`POST /v1/hook-outcomes`), for the console's health view:
    # kept in the database so every replica shows them and a restart keeps them. A write
    # drops, in its own transaction, what passes `relay.models`' caps (REPORTS_PER_DEVELOPER,
    # NAMES_PER_KEY, DEVELOPERS_PER_ORG); the read gives each (key id, developer name) its
    # latest report and the streaks of all it keeps, oldest first.
    def add_hook_report(self, org_id: str, report: HookReport) -> None: ...
    def hook_reports(self, org_id: str) -> dict[tuple[str, str], HookHistory]: ...

    def warm(self) -> None:
        """Load what the first search of each org would otherwise wait for (seconds at most;
        the server calls it on a background thread at start-up)."""
        ...

    def close(self) -> None: ...


POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
NO_POSTGRES = "PostgreSQL support is not installed: pip install 'relay-memory[postgres]'"


UNENCODED_USERINFO = (
    "bad PostgreSQL URL: its user name or password holds a character that must be"
    " percent-encoded (@, :, /, #, ? or %: p@ss as p%40ss), so it splits elsewhere than meant"
)


def _unencoded_userinfo(netloc: str, query: str) -> bool:
    """Whether a URL's user name or password holds an `@`, a `%` that starts no escape, or
    a `?` (which leaves the rest for a query field without `=`): libpq then refused or
    split the URL with an error quoting the password, or the part of it after that
    character, into the terminal or the service's log."""
    userinfo, at, _ = netloc.rpartition("@")
    return bool(
        (at and "@" in userinfo)
        or re.search(r"%(?![0-9A-Fa-f]{2})", userinfo)
        or any("=" not in field for field in query.split("&") if field)
    )


def database_kind(url: str) -> Literal["sqlite", "postgresql"]:
    """Which store a database URL names: a path or sqlite:///path, or postgresql://.
    Anything else with a scheme is refused, never taken for a file name (which would
    create folders named after the URL and serve an empty store)."""
    if re.match(r"postgres(ql)?:(?!//)", url):  # never echoed: it may hold a password
        raise InvalidRequestError("a PostgreSQL URL starts postgresql:// (the // is missing)")
    found = _SCHEME.match(url)
    scheme = found.group(1).lower() if found else None
    if scheme in POSTGRES_SCHEMES:
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # an unclosed [ of an IPv6 host; the URL is never echoed
            raise InvalidRequestError(f"bad PostgreSQL URL: {exc}") from None
        if _unencoded_userinfo(parts.netloc, parts.query):
            raise InvalidRequestError(UNENCODED_USERINFO)
        return "postgresql"
    if scheme is None or url.startswith("sqlite:///"):
        return "sqlite"
    raise InvalidRequestError(
        f"unsupported database URL {scheme}://...: {_scheme_hint(scheme or '')}use a SQLite"
        " file path, sqlite:///path or postgresql://..."
    )


def _scheme_hint(scheme: str) -> str:
    """What a scheme meant for PostgreSQL says, before the list of those Relay takes: the
    refusal alone left `postgresq://` looking like a PostgreSQL URL Relay could not read."""
    import difflib

    base, plus, driver = scheme.partition("+")
    if plus and base in POSTGRES_SCHEMES:
        return f"+{driver} names a driver, as SQLAlchemy's URLs do; Relay's is postgresql://; "
    if difflib.get_close_matches(base, POSTGRES_SCHEMES, cutoff=0.75):
        return "did you mean postgresql://? "
    return ""


def sqlite_path(url: str) -> Path:
    """The file a SQLite database URL (a path, or sqlite:///path) names."""
    if url.startswith("sqlite:///"):
        return Path("/" + url.removeprefix("sqlite:///").lstrip("/"))
    return Path(url)


# Tables every version of the SQLite store has had (passage_tokens came later).
SQLITE_TABLES = ("orgs", "api_keys", "memories", "memory_audiences", "memory_revisions", "passages")


def open_relay_file(url: str) -> sqlite3.Connection:
    """The SQLite store a URL names, opened read-only once it is known to be one: never
    write Relay's tables into a file that is something else (or empty)."""
    path = sqlite_path(url)
    if not path.exists():
        raise InvalidRequestError(f"no SQLite store at {path}")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:  # not SQLite at all, or a folder; or damaged
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_CORRUPT:
            raise InvalidRequestError(
                f"{path} is damaged ({exc}): restore it from a backup (docs/deployment.md,"
                " 'Backing up and restoring the SQLite file')"
            ) from None
        raise InvalidRequestError(f"{path} is not a Relay SQLite store ({exc})") from None
    missing = [t for t in SQLITE_TABLES if t not in names]
    if missing:
        conn.close()
        raise InvalidRequestError(
            f"{path} is not a Relay SQLite store (tables missing: {', '.join(missing)})"
        )
    return conn


def redact_url(url: str) -> str:
    """The URL as it may be printed or logged: its password, if any, as ***."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and all(k != "password" for k, _ in query):
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    query = [(k, "***" if k == "password" else v) for k, v in query]
    return parts._replace(netloc=netloc, query=urlencode(query, safe="*/")).geturl()


def postgres_store(url: str) -> Store:
    """A PostgresStore on `url`, or one clear line when the `postgres` extra is missing."""
    try:
        from relay.store.postgres import PostgresStore
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("psycopg", "psycopg_pool"):
            raise
        raise RelayError(NO_POSTGRES) from None
    return PostgresStore(url)


def open_store(url: str) -> Store:
    """Open the store a URL names: a SQLite path (or sqlite:///path) or a postgresql:// URL."""
    if database_kind(url) == "postgresql":
        return postgres_store(url)
    from relay.store.sqlite import SQLiteStore

    return SQLiteStore(sqlite_path(url))
