"""The shared store: PostgreSQL with tsvector and pgvector, for several server replicas.

Same semantics as the SQLite store (same errors, revisions, tombstones,
supersession and per-org `generation`), with tenant isolation enforced twice:
every query names its org, and each transaction sets `relay.org_id` so the
Row-Level Security policies (see `migrations_postgres`) hide every other org's
rows from a query that forgets to. The server works as the non-owner role
`relay_app` (it switches to it with SET ROLE when the connecting user may, or
connect as a member of it); `rls_enforced` reports whether the policies apply
to the role in use (an owner, superuser or BYPASSRLS role escapes them).

Writes to one org serialise on its `orgs` row (taken first in every write
transaction), like SQLite's single writer but per tenant, so org counters
never deadlock. The generation is bumped in the same transaction as the write,
so every replica's cache sees the change at its next request.

Vector search: the HNSW index covers the whole table and pgvector 0.6 filters
its results afterwards, so an org that is a small share of the table would get
too few. Orgs up to `exact_max` passages are searched exactly (distances computed
for all of the org's vectors, read from a covering index); larger ones go through
HNSW with `hnsw.ef_search` raised in proportion to the org's share, and fall
back to the exact scan when the share is too small or too few rows come back.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import select
import struct
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.rows import dict_row
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool

from relay.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StoreError,
    UnavailableError,
)
from relay.models import (
    EVERYONE,
    WITHHELD_FIELDS,
    ApiKey,
    Memory,
    MemoryDraft,
    Org,
    Passage,
    PassageInput,
    Revision,
)
from relay.store import (
    PASSAGE_COUNT_SQL,
    SaveMode,
    batch_item,
    candidate_terms,
    check_org_name,
    connect_deadline,
)
from relay.store.migrations_postgres import APP_ROLE, GRANTS, MIGRATIONS
from relay.store.rules import (
    Read,
    as_read,
    judge_cycle,
    judge_replacement,
    judge_write,
    linked_ids,
    same_content,
    settle_supersedes,
)
from relay.store.vector_index import VectorIndex

log = logging.getLogger("relay.store.postgres")

# One org's passages per audience set, counted from its passages and audiences: the repair
# of `audience_totals` (`relay migrate` counts a copied org the same way).
_COUNT_AUDIENCE_TOTALS = (
    "INSERT INTO audience_totals (org_id, audiences, passage_count)"
    " SELECT %(org)s, coalesce(s.audiences, '{}'), count(*) FROM passages p LEFT JOIN"
    ' (SELECT memory_id, array_agg(audience COLLATE "C" ORDER BY audience COLLATE "C")'
    " AS audiences FROM memory_audiences WHERE org_id = %(org)s GROUP BY memory_id) AS s"
    " ON s.memory_id = p.memory_id WHERE p.org_id = %(org)s GROUP BY 2"
)
# Each term's passages in one org, as writes count them (`_TermDelta`: a passage's distinct
# words, split on spaces as `lexical` joins them).
_COUNT_ORG_TERMS = (
    "INSERT INTO org_terms (org_id, term, df) SELECT %(org)s, term, count(*) FROM"
    " (SELECT DISTINCT p.id, t.term FROM passages p, unnest(string_to_array(p.lexical, ' '))"
    " AS t(term) WHERE p.org_id = %(org)s AND t.term <> '') AS d GROUP BY term"
)


def recount_passage_totals(conn: psycopg.Connection, org_id: str) -> None:
    """Count again, from one org's passages, every total writes keep of them: the org's
    passages and tokens, each term's passages (`org_terms`) and each audience set's
    (`audience_totals`). The caller holds the org's row lock (as every write does first),
    so no write lands between a delete and its count."""
    params = {"org": org_id}
    conn.execute(
        "UPDATE orgs SET passage_count = c.n, token_count = c.t FROM (SELECT count(*) AS n,"
        " coalesce(sum(token_count), 0) AS t FROM passages WHERE org_id = %(org)s) AS c"
        " WHERE id = %(org)s",
        params,
    )
    conn.execute("DELETE FROM org_terms WHERE org_id = %(org)s", params)
    conn.execute(_COUNT_ORG_TERMS, params)
    conn.execute("DELETE FROM audience_totals WHERE org_id = %(org)s", params)
    conn.execute(_COUNT_AUDIENCE_TOTALS, params)


DIM = 384
DEFAULT_POOL = 8
DEFAULT_EXACT_MAX = 20_000  # passages an org may have and still be searched exactly
MAX_EF_SEARCH = 1000  # pgvector's ceiling for hnsw.ef_search
EF_FACTOR = 6  # ef_search = EF_FACTOR * limit / the org's share of the table (measured)
LEXICAL_BUDGET = 2000  # lexical candidates: rarest terms matching at most this many passages
SHORTLIST_FACTOR = 4  # exact vector scan: nearest passages per wanted result, before the filter
# Query parameters Relay reads from the URL itself; psycopg never sees them.
RELAY_PARAMS = ("pool_size", "exact_max", "app_role", "vector_cache_mb")
# Each replica keeps the vectors of recently searched orgs of at most `exact_max` passages
# in memory, up to this much. An org that does not fit is searched in PostgreSQL until an
# org held in memory has gone unsearched for CACHE_IDLE_S.
DEFAULT_VECTOR_CACHE_MB = 256
PASSAGE_BYTES = 1_950  # OrgVectors.nbytes() per passage: 18.5 MB for 10k measured, plus margin
CACHE_IDLE_S = 300.0
# While PostgreSQL is away a request waits this long for a pooled connection at most (a
# search only until its deadline: `relay.store.connect_by`), then fails with 503.
POOL_WAIT_S = 3.0
# How long the pool keeps retrying a lost connection (backing off 1, 2, 4 s ...) before it
# gives up and lets the next request start a fresh attempt: short, so a database that comes
# back after a long outage is used again within seconds, not after a minute-long backoff.
RECONNECT_S = 5.0
# SQLSTATEs that mean the connection, not the query, failed: class 08, and the server
# shutting down, crashing or still starting (57P01-03). Client-side errors have none.
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether the database went away (down, restarting, unreachable, no free connection),
    as opposed to refusing one query: the first is worth retrying, the second is not."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith(_CONNECTION_STATES)


@contextmanager
def translate_errors() -> Iterator[None]:
    """psycopg's errors become Relay's, once, here. Their text (hosts, ports, tables) is for
    the operator: a client of the server is told the error's `public` sentence."""
    try:
        yield
    except psycopg.Error as exc:
        if connection_lost(exc):
            lost = UnavailableError(f"database unreachable: {exc}")
            lost.public = "database unreachable: the server cannot reach its database right now"
            raise lost from exc
        raise StoreError(f"database error: {exc}") from exc


# -- vectors on the wire: float32 little-endian bytes <-> pgvector's binary format ------
class Vector(bytes):
    """A float32 little-endian vector, sent to PostgreSQL as `vector`."""

    @classmethod
    def of(cls, value: np.ndarray | bytes) -> Vector:
        if isinstance(value, bytes):
            return cls(value)
        return cls(np.asarray(value, dtype="<f4").tobytes())


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: bytes) -> bytes:
        dim = len(obj) // 4
        return struct.pack(">HH", dim, 0) + np.frombuffer(obj, dtype="<f4").astype(">f4").tobytes()


class _VectorLoader(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> bytes:
        dim = struct.unpack_from(">H", data)[0]
        return np.frombuffer(bytes(data)[4 : 4 + 4 * dim], dtype=">f4").astype("<f4").tobytes()


@dataclass(frozen=True)
class PgOptions:
    conninfo: str
    pool_size: int
    exact_max: int
    app_role: str
    vector_cache_mb: int = DEFAULT_VECTOR_CACHE_MB


def parse_url(url: str) -> PgOptions:
    """Split Relay's own options (`?pool_size=&exact_max=&app_role=`) from the libpq URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in RELAY_PARAMS}
    rest = [(k, v) for k, v in query if k not in RELAY_PARAMS]
    try:
        pool = int(own.get("pool_size") or os.environ.get("RELAY_PG_POOL") or DEFAULT_POOL)
        exact = int(
            own.get("exact_max") or os.environ.get("RELAY_PG_EXACT_MAX") or DEFAULT_EXACT_MAX
        )
        cache_mb = int(
            own.get("vector_cache_mb")
            or os.environ.get("RELAY_PG_VECTOR_CACHE_MB")
            or DEFAULT_VECTOR_CACHE_MB
        )
    except ValueError as exc:
        raise InvalidRequestError(f"bad PostgreSQL URL option: {exc}") from exc
    if pool < 1:
        raise InvalidRequestError("pool_size must be at least 1")
    if cache_mb < 0:
        raise InvalidRequestError("vector_cache_mb must be 0 (off) or more")
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    if not parts.netloc:
        # urlunsplit drops the empty authority (postgresql:/db), which libpq then refuses:
        # keep the `///` of the socket form, postgresql:///db?host=/socket/dir.
        conninfo = conninfo.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return PgOptions(conninfo, pool, exact, own.get("app_role") or APP_ROLE, cache_mb)


def _wait() -> float:
    """How long this call may wait for a pooled connection: `POOL_WAIT_S`, or less when the
    request's deadline comes first (never zero: a free connection is still taken at once)."""
    deadline = connect_deadline()
    if deadline is None:
        return POOL_WAIT_S
    return max(0.001, min(POOL_WAIT_S, deadline - time.monotonic()))


def lexical_sql() -> str:
    """BM25 candidates of the transaction's org among the passages matching a `chosen`
    term, found through the org's own index keys (see `relay_lexical_org` in the
    migrations)."""
    return (
        "SELECT id, score FROM relay_lexical_org(%(chosen)s, %(terms)s,"
        " %(n)s, %(avgdl)s, %(aud)s, %(now)s, %(limit)s)"
    )


def visible_sql(audience_filter: bool) -> str:
    """The recall filter on `memories m` for one org: live, current, unexpired, audience."""
    clauses = [
        "m.org_id = %(org)s",
        "m.deleted_at IS NULL",
        "m.superseded_by IS NULL",
        "(m.valid_until IS NULL OR m.valid_until > %(now)s)",
    ]
    if audience_filter:
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = ANY(%(aud)s))"
        )
    return " AND ".join(clauses)


def managed_sql(audiences: frozenset[str] | None) -> str:
    """Management reads see expired and superseded memories too (so they can be tended)."""
    clauses = ["m.org_id = %(org)s", "m.deleted_at IS NULL"]
    if audiences is not None:
        clauses.append(
            "EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id"
            " AND ma.memory_id = m.id AND ma.audience = ANY(%(aud)s))"
        )
    return " AND ".join(clauses)


def history_sql(audience_filter: bool) -> str:
    """A memory's revisions (`org`, `id`), oldest first, each one's content withheld
    (`WITHHELD_FIELDS` null, `withheld` true) unless its audiences meet the reader's `aud`;
    a deletion, which has none of its own, takes the memory's last. Without the filter (an
    admin management read) nothing is withheld."""
    readable = "true"
    if audience_filter:
        readable = "coalesce(r.audiences, m.audiences) && %(aud)s::text[]"
    content = ", ".join(f"CASE WHEN readable THEN {c} END AS {c}" for c in WITHHELD_FIELDS)
    return (
        f"SELECT id, revision, action, recorded_at, NOT readable AS withheld, {content}"
        f" FROM (SELECT r.*, {readable} AS readable FROM memory_revisions r"
        " JOIN memories m ON m.org_id = r.org_id AND m.id = r.id"
        " WHERE r.org_id = %(org)s AND r.id = %(id)s) AS v ORDER BY revision"
    )


def exact_vector_sql() -> str:
    """The org's passages nearest by true cosine distance, then the recall filter.

    The distances come from the org's vectors alone, read together from the covering
    btree `passages_org_vectors` (an index-only scan once the table is vacuumed), not
    from rows scattered over the heap; only the nearest `shortlist` are then joined to
    their memories and filtered. While at least `limit` of them survive the filter,
    they are exactly the top `limit` visible passages; otherwise `exact_filtered_sql`.
    `+ 0` keeps the planner off the HNSW index (which would post-filter).
    """
    return (
        "SELECT c.id, 1 - c.d AS cosine FROM (SELECT p.id, (p.embedding <=> %(q)s) + 0 AS d"
        " FROM passages p WHERE p.org_id = %(org)s ORDER BY 2, p.id LIMIT %(shortlist)s) AS c"
        " JOIN passages p ON p.id = c.id"
        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
        f" WHERE {visible_sql(True)} ORDER BY c.d, c.id LIMIT %(limit)s"
    )


def exact_filtered_sql() -> str:
    """Every visible passage of the org ranked by true cosine distance: the exact answer
    when the recall filter hides much of the org's nearest passages."""
    return (
        "SELECT p.id, 1 - (p.embedding <=> %(q)s) AS cosine FROM passages p"
        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
        f" WHERE p.org_id = %(org)s AND {visible_sql(True)}"
        " ORDER BY (p.embedding <=> %(q)s) + 0, p.id LIMIT %(limit)s"
    )


def hnsw_vector_sql() -> str:
    """Nearest passages through the HNSW index, then the recall filter on what came back."""
    return (
        "SELECT c.id, 1 - c.d AS cosine FROM (SELECT p.id, p.memory_id, p.embedding <=> %(q)s AS d"
        " FROM passages p WHERE p.org_id = %(org)s ORDER BY p.embedding <=> %(q)s"
        " LIMIT %(ef)s) AS c JOIN memories m ON m.org_id = %(org)s AND m.id = c.memory_id"
        f" WHERE {visible_sql(True)} ORDER BY c.d, c.id LIMIT %(limit)s"
    )


def within_budget(terms: Sequence[str], df: dict[str, int]) -> list[str]:
    """Of the candidate terms, the rarest whose document frequencies sum to at most
    `LEXICAL_BUDGET` passages (always at least one), so one query's lexical work is
    bounded however large the org grows. PostgreSQL scores each match row by row
    (unlike FTS5), so an OR of merely uncommon terms in a large org could still touch
    thousands of rows. Every query term still counts in a candidate's score, and an
    org's candidates are unchanged while its matches fit the budget.
    """
    chosen, spent = [], 0
    for term in sorted(terms, key=lambda t: df.get(t, 0)):
        cost = df.get(term, 0)
        if chosen and spent + cost > LEXICAL_BUDGET:
            break
        chosen.append(term)
        spent += cost
    return chosen


def ef_search_for(limit: int, org_rows: int, table_rows: float) -> int | None:
    """The `hnsw.ef_search` that should leave `limit` of the org's rows after filtering,
    or None when even pgvector's maximum would not (the org is too small a share)."""
    if table_rows <= 0 or org_rows <= 0:
        return None
    share = min(1.0, org_rows / table_rows)
    ef = math.ceil(EF_FACTOR * limit / share)
    return max(ef, 40) if ef <= MAX_EF_SEARCH else None


def _relink_superseded(conn: psycopg.Connection, org_id: str, memory_id: str) -> None:
    """Point each memory `memory_id` was marked as superseding (before this edit or delete,
    already saved) at the latest-written live memory that still supersedes it, or at none:
    two memories may supersede one, and losing one of them must not bring it back."""
    conn.execute(
        "UPDATE memories m SET superseded_by = ("
        " SELECT s.id FROM memories s WHERE s.org_id = m.org_id AND s.deleted_at IS NULL"
        " AND m.id = ANY(s.supersedes) ORDER BY s.updated_at DESC, s.id LIMIT 1)"
        " WHERE m.org_id = %s AND m.superseded_by = %s",
        (org_id, memory_id),
    )


def _forget_embeddings(conn: psycopg.Connection, hashes: set[str]) -> None:
    """Drop from the embedding cache the texts of `hashes` no passage of any org holds any
    more (vector and token matrix), in the transaction that removed them: a deleted text's
    embedding must not outlive it (migration 6's function: the app role sees one org). A
    write of the same text racing the delete may cache it again after: see
    `forget_unheld_embeddings`, run at start-up."""
    if hashes:
        conn.execute("SELECT relay_forget_embeddings(%s::text[])", (sorted(hashes),))


def _repair_passage_totals(conn: psycopg.Connection) -> None:
    """Count again the totals of the orgs whose audience sets no longer add up to their
    passage count (`recount_passage_totals`), so that they do after. A replica on code
    from before migration 5, still writing during a rolling upgrade, keeps the org's count
    but not the per-set totals; a `relay migrate` that copied the source's count (before it
    counted on the target) left it wrong on a target that had taken writes of its own.
    Which one did is not known here. Every start mends what either left (one cheap
    comparison when nothing drifted)."""
    drifted = conn.execute(
        "SELECT o.id, o.passage_count, coalesce(t.n, 0) FROM orgs o LEFT JOIN"
        " (SELECT org_id, sum(passage_count) AS n FROM audience_totals GROUP BY org_id) t"
        " ON t.org_id = o.id WHERE o.passage_count <> coalesce(t.n, 0)"
    ).fetchall()
    for org_id, passages, counted in drifted:
        with conn.transaction():
            conn.execute("SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org_id,))
            recount_passage_totals(conn, org_id)
            row = conn.execute("SELECT passage_count FROM orgs WHERE id = %s", (org_id,)).fetchone()
        log.warning(
            "org %s: its passage totals disagreed (audience sets %d, org %d: left by older"
            " code, a replica's writes during an upgrade or an earlier relay migrate);"
            " counted again from its passages: %d",
            org_id,
            counted,
            passages,
            row[0] if row else 0,
        )


class PostgresStore:
    """The shared store (see module docstring)."""

    def __init__(self, url: str, pool_size: int | None = None, exact_max: int | None = None):
        opts = parse_url(url)
        self.url = url
        self.conninfo = opts.conninfo
        self.exact_max = opts.exact_max if exact_max is None else exact_max
        self.vectors = (
            VectorIndex(max_bytes=opts.vector_cache_mb << 20) if opts.vector_cache_mb else None
        )
        self.app_role = opts.app_role
        self._vector_oid: int | None = None
        self._migrate()
        with translate_errors():
            self.pool = ConnectionPool(
                opts.conninfo,
                min_size=1,
                max_size=pool_size or opts.pool_size,
                kwargs={"autocommit": True, "row_factory": dict_row},
                configure=self._configure,
                check=self._check,
                timeout=POOL_WAIT_S,
                reconnect_timeout=RECONNECT_S,
                open=True,
                name="relay",
            )
            with self.pool.connection() as conn:
                row = conn.execute(
                    "SELECT current_user AS role, rolsuper OR rolbypassrls"
                    " OR oid = (SELECT relowner FROM pg_class WHERE oid = 'passages'::regclass)"
                    " AS bypass FROM pg_roles WHERE rolname = current_user"
                ).fetchone()
        self.role, bypass = (row["role"], bool(row["bypass"])) if row else ("?", True)
        self.rls_enforced = not bypass
        if bypass:
            log.warning(
                "working as %s, which owns the tables or bypasses row-level security; create"
                " role %s and grant it to the connecting user so the policies apply",
                self.role,
                self.app_role,
            )

    # -- connections -----------------------------------------------------------
    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute("SET TIME ZONE 'UTC'")
        member = conn.execute(
            "SELECT pg_has_role(current_user, oid, 'MEMBER') AS yes FROM pg_roles"
            " WHERE rolname = %s",
            (self.app_role,),
        ).fetchone()
        if member and member["yes"]:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.app_role)))
        info = TypeInfo.fetch(conn, "vector")
        if info is None:
            raise StoreError("the pgvector extension is not installed in this database")
        conn.adapters.register_dumper(Vector, _make_dumper(info.oid))
        conn.adapters.register_loader(info.oid, _VectorLoader)

    def _check(self, conn: psycopg.Connection) -> None:
        """Before the pool hands out `conn`: a connection the server closed meanwhile (a
        restart, an idle timeout) has its farewell or EOF waiting to be read, and only then
        is a round trip worth paying (on every use it cost ~0.1 ms a transaction, measured;
        a search makes six). A server that closed one has closed them all, so every idle
        connection is checked and replaced at once: the pool would otherwise back off 1, 2,
        4 s between one dead connection and the next, and a request wait for that."""
        if select.select([conn.fileno()], [], [], 0)[0]:
            self.pool.check()
            ConnectionPool.check_connection(conn)  # raises: the pool replaces it

    @contextmanager
    def _tx(
        self, org_id: str | None = None, key_id: str | None = None, directory: bool = False
    ) -> Iterator[psycopg.Connection]:
        """One transaction, its tenant settings set for it alone (`set_config(..., true)`)."""
        with translate_errors(), self.pool.connection(_wait()) as conn, conn.transaction():
            conn.execute(
                "SELECT set_config('relay.org_id', %s, true), set_config('relay.key_id', %s, true),"
                " set_config('relay.directory', %s, true)",
                (org_id or "", key_id or "", "on" if directory else ""),
            )
            yield conn

    @contextmanager
    def _write(self, org_id: str) -> Iterator[psycopg.Connection]:
        """A write transaction on one org: its row locked first, so writes never deadlock."""
        with self._tx(org_id) as conn:
            if not conn.execute(
                "SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org_id,)
            ).fetchone():
                raise NotFoundError(f"no organisation {org_id!r}")
            yield conn

    def _migrate(self) -> None:
        """Apply pending migrations as the owner, one transaction each, under an advisory lock."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(hashtext('relay schema'))")
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations"
                    " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                for version, script in enumerate(MIGRATIONS, start=1):
                    if version in done:
                        continue
                    with conn.transaction():
                        conn.execute(script)
                        conn.execute("INSERT INTO schema_migrations VALUES (%s, now())", (version,))
                self._ensure_role(conn)
                _repair_passage_totals(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtext('relay schema'))")

    def _ensure_role(self, conn: psycopg.Connection) -> None:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.app_role,))
        if not exists.fetchone():
            try:
                conn.execute(
                    sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(self.app_role))
                )
            except psycopg.errors.InsufficientPrivilege:
                log.warning("cannot create role %s; connecting as the owner", self.app_role)
                return
        schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        ident = sql.Identifier(schema).as_string(conn)
        role = sql.Identifier(self.app_role).as_string(conn)
        try:
            conn.execute(GRANTS.format(schema=ident).replace("relay_app", role))
        except psycopg.errors.InsufficientPrivilege:
            return  # a replica connecting as a member of the app role, not the owner: fine
        try:
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(self.app_role)))
        except psycopg.errors.Error:
            pass  # already a member, or not allowed: an operator grants it (see docs)

    def drop_vector_index(self) -> None:
        """Bulk loads: drop the HNSW index (searches stay exact meanwhile) ..."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("DROP INDEX IF EXISTS passages_embedding")

    def vector_index_exists(self) -> bool:
        query = "SELECT 1 FROM pg_class WHERE oid = to_regclass('passages_embedding')"
        with self._tx() as conn:
            return conn.execute(query).fetchone() is not None

    def holds_passages(self) -> bool:
        """Whether any org has passages, read as the owner (row-level security would hide
        every org's rows from a query that names none)."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM passages LIMIT 1").fetchone() is not None

    def build_vector_index(self, maintenance_work_mem: str = "1GB") -> float:
        """... and build it once afterwards: far faster than growing it row by row. Seconds."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(maintenance_work_mem))
            start = time.perf_counter()
            conn.execute(
                "CREATE INDEX IF NOT EXISTS passages_embedding ON passages"
                " USING hnsw (embedding vector_cosine_ops)"
            )
            took = time.perf_counter() - start
            # VACUUM as well: the exact scan reads only the covering index once the
            # visibility map marks the freshly loaded pages all-visible.
            conn.execute("VACUUM (ANALYZE) passages")
        return took

    def schema_version(self) -> int:
        with self._tx() as conn:
            return conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]  # type: ignore[index]

    def warm(self) -> None:
        """Bring the small orgs' vectors this replica holds up to date, waiting for them.
        Nothing else ahead of time: a small org's vectors load into memory on its first
        search (within `vector_cache_mb`; until then, and beyond it, PostgreSQL scans them)."""
        if self.vectors is None:
            return
        for org_id in self.vectors.held():
            load = functools.partial(self._vector_rows, org_id)
            self.vectors.get(org_id, self.generation(org_id), load, wait=True)

    def close(self) -> None:
        self.pool.close()

    # -- organisations and keys ---------------------------------------------------
    def create_org(self, name: str) -> Org:
        name = check_org_name(name)
        org = Org(id="org_" + secrets.token_hex(6), name=name, created_at=datetime.now(UTC))
        try:
            with self._tx(org.id) as conn:
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
                row = conn.execute(
                    "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND org_id = %s"
                    " RETURNING *",
                    (key_id, org_id),
                ).fetchone()
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

    # -- memories ------------------------------------------------------------------
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
    ) -> tuple[Memory, bool]:
        expected = {} if expected_revision is None else {memory_id: expected_revision}
        (saved,) = self._save_many(
            org_id, [(memory_id, draft, passages)], author, mode, expected, audiences
        )
        return saved

    def save_memories(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        audiences: frozenset[str] | None = None,
        expected: Mapping[str, int] | None = None,
    ) -> list[tuple[Memory, bool]]:
        """Many writes in one transaction: all land, or none do (a memory of `expected` not
        at its revision there refuses them all: ConflictError with `revision`)."""
        return self._save_many(org_id, items, author, mode, expected or {}, audiences)

    def _save_many(
        self,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        expected: Mapping[str, int],
        audiences: frozenset[str] | None,
    ) -> list[tuple[Memory, bool]]:
        try:
            with self._write(org_id) as conn:
                terms = _TermDelta()
                out: list[tuple[Memory, bool]] | None = None
                if _batchable(items):
                    out = self._save_batch(
                        conn, terms, org_id, items, author, mode, expected, audiences
                    )
                if out is None:
                    out = []
                    for i, (mid, d, ps) in enumerate(items):
                        with batch_item(i):
                            out.append(
                                self._save(
                                    conn,
                                    terms,
                                    org_id,
                                    mid,
                                    d,
                                    author,
                                    ps,
                                    mode,
                                    expected.get(mid),
                                    audiences,
                                )
                            )
                if any(changed for _, changed in out):
                    terms.apply(conn, org_id)
                    _bump(conn, org_id)
                shown = _as_read(conn, org_id, [m for m, _ in out], audiences)
                return [(m, changed) for m, (_, changed) in zip(shown, out, strict=True)]
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise ConflictError("the memory was written concurrently; retry") from None
            raise

    def _save(
        self,
        conn: psycopg.Connection,
        terms: _TermDelta,
        org_id: str,
        memory_id: str,
        draft: MemoryDraft,
        author: str | None,
        passages: Sequence[PassageInput],
        mode: SaveMode,
        expected_revision: int | None,
        audiences: frozenset[str] | None,
    ) -> tuple[Memory, bool]:
        row = conn.execute(
            "SELECT * FROM memories WHERE org_id = %s AND id = %s", (org_id, memory_id)
        ).fetchone()
        current = _judge(row, memory_id, draft, mode, expected_revision, audiences)
        kept = () if current is None else current.supersedes
        draft = _check_supersedes(conn, org_id, memory_id, draft, audiences, kept)
        if current is not None and current.superseded_by is not None:
            replacement = conn.execute(
                "SELECT audiences FROM memories WHERE org_id = %s AND id = %s"
                " AND deleted_at IS NULL",
                (org_id, current.superseded_by),
            ).fetchone()
            if replacement is not None:
                judge_replacement(
                    memory_id,
                    current.audiences,
                    draft.audiences,
                    current.superseded_by,
                    replacement["audiences"],
                    audiences,
                )
        if current is not None and same_content(current, draft):
            return current, False
        values = _values(org_id, memory_id, draft, author, current)
        saved = conn.execute(UPSERT_MEMORY, values).fetchone()
        conn.execute(INSERT_REVISION, values)
        conn.execute(
            "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = %s",
            (org_id, memory_id),
        )
        conn.execute(
            "INSERT INTO memory_audiences (org_id, memory_id, audience)"
            " SELECT %s, %s, unnest(%s::text[])",
            (org_id, memory_id, sorted(set(draft.audiences))),
        )
        old = conn.execute(
            "DELETE FROM passages WHERE org_id = %s AND memory_id = %s"
            " RETURNING lexical, content_hash",
            (org_id, memory_id),
        ).fetchall()
        terms.change(
            removed=[r["lexical"] for r in old],
            added=[p.lexical for p in passages],
            old_audiences=() if current is None else current.audiences,
            new_audiences=draft.audiences,
        )
        if passages:
            with conn.cursor() as cur:
                insert_passages(
                    cur,
                    _passage_rows(org_id, memory_id, values, passages),
                    [p.tokens for p in passages],
                )
        _forget_embeddings(conn, {r["content_hash"] for r in old})
        # Supersession is a relation between live memories: recompute both directions.
        _relink_superseded(conn, org_id, memory_id)
        if draft.supersedes:
            conn.execute(
                "UPDATE memories SET superseded_by = %s WHERE org_id = %s AND id = ANY(%s)",
                (memory_id, org_id, list(draft.supersedes)),
            )
        return _memory(saved), True

    def _save_batch(
        self,
        conn: psycopg.Connection,
        terms: _TermDelta,
        org_id: str,
        items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]],
        author: str | None,
        mode: SaveMode,
        expected: Mapping[str, int],
        audiences: frozenset[str] | None,
    ) -> list[tuple[Memory, bool]] | None:
        """Many distinct memories without supersession: the same checks and rows as `_save`,
        in a handful of pipelined statements instead of ten round trips per memory. None
        when one of them already supersedes others or is superseded: `_save` carries or
        judges those links."""
        ids = [mid for mid, _, _ in items]
        rows = {
            r["id"]: r
            for r in conn.execute(
                "SELECT * FROM memories WHERE org_id = %s AND id = ANY(%s)", (org_id, ids)
            )
        }
        if any(r["supersedes"] or r["superseded_by"] for r in rows.values()):
            return None
        out: list[tuple[Memory, bool] | None] = []
        writes: list[tuple[int, dict[str, Any], MemoryDraft, Sequence[PassageInput]]] = []
        for i, (mid, draft, passages) in enumerate(items):
            with batch_item(i):
                current = _judge(rows.get(mid), mid, draft, mode, expected.get(mid), audiences)
            if current is not None and same_content(current, draft):
                out.append((current, False))
                continue
            out.append(None)
            writes.append((i, _values(org_id, mid, draft, author, current), draft, passages))
        if not writes:
            return out  # type: ignore[return-value]
        changed = [v["id"] for _, v, _, _ in writes]
        with conn.cursor() as cur:
            cur.executemany(UPSERT_MEMORY, [v for _, v, _, _ in writes], returning=True)
            saved = []
            while True:
                saved.append(cur.fetchone())
                if not cur.nextset():
                    break
            cur.executemany(INSERT_REVISION, [v for _, v, _, _ in writes])
            conn.execute(
                "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = ANY(%s)",
                (org_id, changed),
            )
            pairs = [(v["id"], a) for _, v, d, _ in writes for a in sorted(set(d.audiences))]
            conn.execute(
                "INSERT INTO memory_audiences (org_id, memory_id, audience)"
                " SELECT %s, m, a FROM unnest(%s::text[], %s::text[]) AS t(m, a)",
                (org_id, [m for m, _ in pairs], [a for _, a in pairs]),
            )
            old: dict[str, list[str]] = {}
            replaced: set[str] = set()
            for r in conn.execute(
                "DELETE FROM passages WHERE org_id = %s AND memory_id = ANY(%s)"
                " RETURNING memory_id, lexical, content_hash",
                (org_id, changed),
            ):
                old.setdefault(r["memory_id"], []).append(r["lexical"])
                replaced.add(r["content_hash"])
            for _, v, d, ps in writes:
                before = rows.get(v["id"])
                terms.change(
                    removed=old.get(v["id"], []),
                    added=[p.lexical for p in ps],
                    old_audiences=() if before is None else before["audiences"],
                    new_audiences=d.audiences,
                )
            insert_passages(
                cur,
                [row for _, v, _, ps in writes for row in _passage_rows(org_id, v["id"], v, ps)],
                [p.tokens for _, _, _, ps in writes for p in ps],
            )
            _forget_embeddings(conn, replaced)
            # No supersession to recompute: none of these supersedes, or is superseded by, any
            # memory (else `_save` carries them, above), so no link points at one of them.
        for (i, _, _, _), row in zip(writes, saved, strict=True):
            out[i] = (_memory(row), True)
        return out  # type: ignore[return-value]

    def current_memory(self, org_id: str, memory_id: str) -> Memory | None:
        with self._tx(org_id) as conn:
            row = conn.execute(
                "SELECT * FROM memories WHERE org_id = %s AND id = %s AND deleted_at IS NULL",
                (org_id, memory_id),
            ).fetchone()
        return None if row is None else _memory(row)

    def delete_memory(
        self, org_id: str, memory_id: str, author: str | None, audiences: frozenset[str] | None
    ) -> None:
        params = _params(org_id, audiences, id=memory_id)
        with self._write(org_id) as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)} AND m.id = %(id)s",
                params,
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            old = conn.execute(
                "DELETE FROM passages WHERE org_id = %s AND memory_id = %s"
                " RETURNING lexical, content_hash",
                (org_id, memory_id),
            ).fetchall()
            _forget_embeddings(conn, {r["content_hash"] for r in old})
            terms = _TermDelta()
            terms.change(
                removed=[r["lexical"] for r in old],
                added=[],
                old_audiences=row["audiences"],
                new_audiences=(),
            )
            terms.apply(conn, org_id)
            # The history keeps a tombstone, not the text.
            conn.execute(
                "UPDATE memory_revisions SET title = NULL, body = NULL"
                " WHERE org_id = %s AND id = %s",
                (org_id, memory_id),
            )
            now = datetime.now(UTC)
            conn.execute(
                "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author)"
                " VALUES (%s, %s, %s, 'delete', %s, %s)",
                (org_id, memory_id, row["revision"] + 1, now, author),
            )
            conn.execute(
                "UPDATE memories SET deleted_at = %s, revision = revision + 1, title = NULL,"
                " body = NULL, updated_at = %s WHERE org_id = %s AND id = %s",
                (now, now, org_id, memory_id),
            )
            _relink_superseded(conn, org_id, memory_id)
            _bump(conn, org_id)

    def get_memory(self, org_id: str, memory_id: str, audiences: frozenset[str] | None) -> Memory:
        params = _params(org_id, audiences, id=memory_id)
        with self._tx(org_id) as conn:
            row = conn.execute(
                f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)} AND m.id = %(id)s",
                params,
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            (memory,) = _as_read(conn, org_id, [_memory(row)], audiences)
        return memory

    def list_memories(
        self,
        org_id: str,
        audiences: frozenset[str] | None,
        limit: int,
        cursor: str | None = None,
        source: str | None = None,
        tag: str | None = None,
        source_prefix: str | None = None,
    ) -> tuple[list[Memory], str | None]:
        params = _params(org_id, audiences, limit=limit + 1)
        query = f"SELECT m.* FROM memories m WHERE {managed_sql(audiences)}"
        if cursor:
            query += " AND m.id > %(cursor)s"
            params["cursor"] = cursor
        if source:
            query += " AND m.source = %(source)s"
            params["source"] = source
        if source_prefix:
            query += " AND starts_with(m.source, %(prefix)s)"
            params["prefix"] = source_prefix
        if tag:
            query += " AND %(tag)s = ANY(m.tags)"
            params["tag"] = tag
        query += " ORDER BY m.id LIMIT %(limit)s"
        with self._tx(org_id) as conn:
            rows = conn.execute(query, params).fetchall()
            items = _as_read(conn, org_id, [_memory(r) for r in rows[:limit]], audiences)
        return items, (items[-1].id if len(rows) > limit else None)

    def history(
        self, org_id: str, memory_id: str, audiences: frozenset[str] | None
    ) -> list[Revision]:
        params = _params(org_id, audiences, id=memory_id)
        # Listed to the keys that may read the memory: a deleted one keeps the audiences of
        # its last live revision, so deleting it shows its tombstone to nobody new.
        query = "SELECT 1 FROM memories m WHERE m.org_id = %(org)s AND m.id = %(id)s"
        if audiences is not None:
            query += (
                " AND EXISTS (SELECT 1 FROM memory_audiences ma"
                " WHERE ma.org_id = m.org_id AND ma.memory_id = m.id"
                " AND ma.audience = ANY(%(aud)s))"
            )
        with self._tx(org_id) as conn:
            if conn.execute(query, params).fetchone() is None:
                raise NotFoundError(f"no memory {memory_id!r}")
            rows = conn.execute(history_sql(audiences is not None), params).fetchall()
            return _as_read(conn, org_id, [_revision(r) for r in rows], audiences)

    def pinned(self, org_id: str, audiences: frozenset[str], now: datetime) -> list[Memory]:
        params = _params(org_id, audiences, now=now)
        with self._tx(org_id) as conn:
            rows = conn.execute(
                f"SELECT m.* FROM memories m WHERE {visible_sql(True)} AND m.pinned"
                " ORDER BY m.updated_at DESC LIMIT 20",
                params,
            ).fetchall()
            return _as_read(conn, org_id, [_memory(r) for r in rows], audiences)

    # -- search ----------------------------------------------------------------------
    def lexical_search(
        self,
        org_id: str,
        audiences: frozenset[str],
        now: datetime,
        terms: Sequence[str],
        limit: int,
    ) -> list[tuple[int, float]]:
        if not terms:
            return []
        params = _params(org_id, audiences, now=now, terms=list(terms), limit=limit)
        with self._tx(org_id) as conn:
            stats = conn.execute(
                "SELECT passage_count, token_count FROM orgs WHERE id = %s", (org_id,)
            ).fetchone()
            if not stats or not stats["passage_count"]:
                return []
            n = stats["passage_count"]
            df = {
                r["term"]: r["df"]
                for r in conn.execute(
                    "SELECT term, df FROM org_terms WHERE org_id = %s AND term = ANY(%s)",
                    (org_id, list(terms)),
                )
            }
            params["n"] = float(n)
            params["avgdl"] = max(1.0, stats["token_count"] / n)
            params["chosen"] = within_budget(candidate_terms(terms, df, n), df)
            rows = conn.execute(lexical_sql(), params).fetchall()
        return [(r["id"], float(r["score"])) for r in rows]

    def semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]:
        with self._tx(org_id) as conn:
            ef, generation, org_rows = self._ef_search(conn, org_id, limit)
            # A small org is searched in this replica's memory when its vectors fit there.
            in_memory = (
                ef is None
                and self.vectors is not None
                and self.vectors.admit(org_id, org_rows * PASSAGE_BYTES, CACHE_IDLE_S)
            )
            if not in_memory:
                params = _params(org_id, audiences, now=now, q=Vector.of(vector), limit=limit)
                rows: list[dict[str, Any]] = []
                if ef is not None:
                    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                    rows = conn.execute(hnsw_vector_sql(), {**params, "ef": ef}).fetchall()
                if len(rows) < limit:  # too few survived the filter: the exact answer instead
                    rows = _exact(conn, params)
                return [(r["id"], float(r["cosine"])) for r in rows]
        assert self.vectors is not None
        return self.vectors.search(
            org_id,
            generation,
            functools.partial(self._vector_rows, org_id),
            functools.partial(self._stored_vectors, org_id),
            vector,
            audiences | {EVERYONE},
            now.timestamp(),
            limit,
        )

    def _ef_search(
        self, conn: psycopg.Connection, org_id: str, limit: int
    ) -> tuple[int | None, int, int]:
        """(None: search the org exactly, else the ef_search HNSW needs; the org's
        generation; its passages)."""
        row = conn.execute(
            "SELECT passage_count AS org_rows, generation, (SELECT reltuples FROM pg_class"
            " WHERE oid = 'passages'::regclass) AS table_rows FROM orgs WHERE id = %s",
            (org_id,),
        ).fetchone()
        if row is None:
            return None, -1, 0
        org_rows, generation = row["org_rows"], row["generation"]
        if org_rows <= self.exact_max:
            return None, generation, org_rows
        return ef_search_for(limit, org_rows, row["table_rows"]), generation, org_rows

    def _stored_vectors(self, org_id: str, ids: list[int]) -> list[tuple[int, bytes]]:
        """(id, embedding) of those of `ids` that are still the org's passages."""
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT id, embedding FROM passages WHERE org_id = %s AND id = ANY(%s)",
                (org_id, ids),
            ).fetchall()
        return [(r["id"], r["embedding"]) for r in rows]

    def _vector_rows(self, org_id: str) -> list[tuple[int, bytes, float | None, str]]:
        """Every live, current passage's vector, expiry and audiences (as `visible_sql`
        would filter them, expiry and audience left to the in-memory scan)."""
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT p.id, p.embedding, extract(epoch FROM m.valid_until)::float8 AS until,"
                " (SELECT string_agg(ma.audience, ',') FROM memory_audiences ma"
                "   WHERE ma.org_id = m.org_id AND ma.memory_id = m.id) AS audiences"
                " FROM passages p JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                " WHERE p.org_id = %s AND m.deleted_at IS NULL AND m.superseded_by IS NULL",
                (org_id,),
            ).fetchall()
        return [(r["id"], r["embedding"], r["until"], r["audiences"] or "") for r in rows]

    def vector_plan(self, org_id: str, limit: int = 40) -> str:
        """Which vector path an org's searches take: 'exact' or 'hnsw(ef_search=N)'."""
        with self._tx(org_id) as conn:
            ef, _, _ = self._ef_search(conn, org_id, limit)
        return "exact" if ef is None else f"hnsw(ef_search={ef})"

    def exact_semantic_search(
        self, org_id: str, audiences: frozenset[str], now: datetime, vector: np.ndarray, limit: int
    ) -> list[tuple[int, float]]:
        """The exact answer, whatever the org's size: the yardstick for recall."""
        params = _params(org_id, audiences, now=now, q=Vector.of(vector), limit=limit)
        with self._tx(org_id) as conn:
            rows = _exact(conn, params)
        return [(r["id"], float(r["cosine"])) for r in rows]

    def passages(
        self, org_id: str, audiences: frozenset[str], now: datetime, rowids: Sequence[int]
    ) -> list[Passage]:
        if not rowids:
            return []
        params = _params(org_id, audiences, now=now, ids=[int(r) for r in rowids])
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT p.id, p.memory_id, p.revision, p.seq, p.text, p.lexical, m.title,"
                " m.source, m.updated_at, m.supersedes, p.embedding,"
                f" ({PASSAGE_COUNT_SQL}) AS passage_count FROM passages p"
                " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                f" WHERE p.id = ANY(%(ids)s) AND p.org_id = %(org)s AND {visible_sql(True)}",
                params,
            ).fetchall()
        return [
            Passage(
                rowid=r["id"],
                memory_id=r["memory_id"],
                revision=r["revision"],
                seq=r["seq"],
                title=r["title"],
                source=r["source"],
                text=r["text"],
                lexical=r["lexical"],
                updated_at=r["updated_at"],
                supersedes=tuple(r["supersedes"]),
                embedding=r["embedding"],
                passage_count=r["passage_count"],
            )
            for r in rows
        ]

    def seen_doc_freq(
        self, org_id: str, audiences: frozenset[str], now: datetime, terms: Sequence[str], cap: int
    ) -> tuple[int, dict[str, int]]:
        # Through the org's own lexeme keys (`relay_org_terms`, migration 2), as the lexical
        # stage finds its matches.
        sql = (
            "SELECT count(*) AS n FROM (SELECT 1 FROM passages p"
            " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
            " WHERE relay_org_terms(p.org_id, p.tsv) && ARRAY[%(org)s || ' ' || %(term)s]"
            f" AND p.org_id = %(org)s AND {visible_sql(True)} LIMIT %(cap)s) AS seen"
        )
        params = _params(org_id, audiences, now=now, cap=cap)
        with self._tx(org_id) as conn:
            # The reader's total: a sum over the org's few audience sets (`audience_totals`).
            total = conn.execute(
                "SELECT coalesce(sum(passage_count), 0) AS n FROM audience_totals"
                " WHERE org_id = %(org)s AND audiences && %(aud)s::text[]",
                params,
            ).fetchone()["n"]
            counts = {t: conn.execute(sql, {**params, "term": t}).fetchone()["n"] for t in terms}
        return int(total), counts

    def doc_freq(self, org_id: str, terms: Sequence[str]) -> tuple[int, dict[str, int]]:
        with self._tx(org_id) as conn:
            total = conn.execute(
                "SELECT passage_count FROM orgs WHERE id = %s", (org_id,)
            ).fetchone()
            rows = (
                conn.execute(
                    "SELECT term, df FROM org_terms WHERE org_id = %s AND term = ANY(%s)",
                    (org_id, list(terms)),
                ).fetchall()
                if terms
                else []
            )
        return (0 if total is None else total["passage_count"]), {r["term"]: r["df"] for r in rows}

    def generation(self, org_id: str) -> int:
        with self._tx(org_id) as conn:
            row = conn.execute("SELECT generation FROM orgs WHERE id = %s", (org_id,)).fetchone()
        return -1 if row is None else row["generation"]

    def next_expiry(self, org_id: str, now: datetime) -> datetime | None:
        with self._tx(org_id) as conn:
            row = conn.execute(
                "SELECT min(valid_until) AS t FROM memories WHERE org_id = %s"
                " AND deleted_at IS NULL AND valid_until > %s",
                (org_id, now),
            ).fetchone()
        return None if row is None else row["t"]

    # -- token matrices (relay.late) -------------------------------------------------
    def token_matrices(self, org_id: str, rowids: Sequence[int]) -> dict[int, bytes]:
        if not rowids:
            return {}
        with self._tx(org_id) as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT t.passage_id, t.tokens FROM passage_tokens t"
                " JOIN passages p ON p.id = t.passage_id"
                " WHERE t.passage_id = ANY(%s) AND p.org_id = %s",
                ([int(r) for r in rowids], org_id),
            ).fetchall()
        return {r["passage_id"]: r["tokens"] for r in rows}

    def missing_tokens(self, limit: int, after: int = 0) -> list[tuple[int, str | None, str]]:
        """(passage id, title, text) of up to `limit` passages of any org without a token
        matrix, lowest id above `after` first: found across orgs by `relay_missing_tokens`
        (ids only), their text read under each org's own policy."""
        if limit <= 0:
            return []
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, org_id FROM relay_missing_tokens(%s, %s)", (limit, after)
            ).fetchall()
        found: list[tuple[int, str | None, str]] = []
        for org_id, ids in _by_org(rows).items():
            with self._tx(org_id) as conn:
                found += [
                    (r["id"], r["title"], r["text"])
                    for r in conn.execute(
                        "SELECT p.id, m.title, p.text FROM passages p"
                        " JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id"
                        " WHERE p.org_id = %s AND p.id = ANY(%s)",
                        (org_id, ids),
                    )
                ]
        return sorted(found, key=lambda f: f[0])

    def store_tokens(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Token matrices for passages of any org, skipping passages gone since and those
        that have one. Each org's are written under its write lock, so no edit can delete a
        passage between the check and the insert. The generation stays: a matrix adds a
        feature to a passage's ranking, it changes no memory, and a bump would make every
        replica reload the org's vectors once per backfill batch."""
        tokens = {int(i): t for i, t in items}
        if not tokens:
            return
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, org_id FROM relay_passage_orgs(%s)", (list(tokens),)
            ).fetchall()
        for org_id, ids in _by_org(rows).items():
            with self._write(org_id) as conn:
                conn.execute(
                    "INSERT INTO passage_tokens (passage_id, tokens) SELECT t.id, t.tokens"
                    " FROM unnest(%s::bigint[], %s::bytea[]) AS t(id, tokens)"
                    " JOIN passages p ON p.id = t.id AND p.org_id = %s"
                    " ON CONFLICT (passage_id) DO NOTHING",
                    (ids, [tokens[i] for i in ids], org_id),
                )

    # -- embedding cache -------------------------------------------------------------
    def cached_embeddings(self, model: str, hashes: Sequence[str]) -> dict[str, bytes]:
        if not hashes:
            return {}
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT content_hash, embedding FROM embedding_cache"
                " WHERE model = %s AND content_hash = ANY(%s)",
                (model, list(hashes)),
            ).fetchall()
        return {r["content_hash"]: bytes(r["embedding"]) for r in rows}

    def cache_embeddings(self, model: str, items: dict[str, bytes]) -> None:
        if not items:
            return
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO embedding_cache (model, content_hash, embedding)"
                " SELECT %s, h, e FROM unnest(%s::text[], %s::bytea[]) AS t(h, e)"
                " ON CONFLICT DO NOTHING",
                (model, list(items), list(items.values())),
            )

    def forget_unheld_embeddings(self) -> int:
        with self._tx() as conn:  # the definer function sees every org's passages
            return conn.execute("SELECT relay_forget_unheld_embeddings() AS n").fetchone()["n"]


# -- helpers -----------------------------------------------------------------------
def _exact(conn: psycopg.Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The exact vector answer: from the shortlist when enough of it is visible."""
    # One core scans an org's narrow index faster than a parallel plan gathers and sorts
    # wide rows (measured at 1M passages: BENCHMARKS.md, PostgreSQL).
    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    limit = params["limit"]
    shortlist = {**params, "shortlist": SHORTLIST_FACTOR * limit}
    rows = conn.execute(exact_vector_sql(), shortlist).fetchall()
    if len(rows) < limit:
        rows = conn.execute(exact_filtered_sql(), params).fetchall()
    return rows


def _make_dumper(oid: int) -> type[Dumper]:
    return type("VectorDumper", (_VectorDumper,), {"oid": oid})


def _params(org_id: str, audiences: frozenset[str] | None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"org": org_id, **extra}
    if audiences is not None:
        params["aud"] = sorted(audiences | {EVERYONE})
    return params


UPSERT_MEMORY = (
    "INSERT INTO memories (org_id, id, revision, title, body, source, tags, audiences,"
    " author, created_at, updated_at, valid_until, supersedes, pinned) VALUES"
    " (%(org_id)s, %(id)s, %(revision)s, %(title)s, %(body)s, %(source)s, %(tags)s,"
    " %(audiences)s, %(author)s, %(created_at)s, %(updated_at)s, %(valid_until)s,"
    " %(supersedes)s, %(pinned)s)"
    " ON CONFLICT (org_id, id) DO UPDATE SET revision = excluded.revision,"
    " title = excluded.title, body = excluded.body, source = excluded.source,"
    " tags = excluded.tags, audiences = excluded.audiences, author = excluded.author,"
    " updated_at = excluded.updated_at, valid_until = excluded.valid_until,"
    " supersedes = excluded.supersedes, pinned = excluded.pinned RETURNING *"
)
INSERT_REVISION = (
    "INSERT INTO memory_revisions (org_id, id, revision, action, recorded_at, author,"
    " title, body, source, tags, audiences, valid_until, supersedes) VALUES"
    " (%(org_id)s, %(id)s, %(revision)s, %(action)s, %(updated_at)s, %(author)s,"
    " %(title)s, %(body)s, %(source)s, %(tags)s, %(audiences)s, %(valid_until)s,"
    " %(supersedes)s)"
)
INSERT_PASSAGE = (
    "INSERT INTO passages (org_id, memory_id, revision, seq, text, lexical,"
    " token_count, content_hash, embedding) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " RETURNING id"
)


def _batchable(items: Sequence[tuple[str, MemoryDraft, Sequence[PassageInput]]]) -> bool:
    """The batch path needs items that cannot see each other: distinct ids, no supersession."""
    ids = [mid for mid, _, _ in items]
    return (
        len(items) > 1 and len(set(ids)) == len(ids) and not any(d.supersedes for _, d, _ in items)
    )


def _judge(
    row: dict[str, Any] | None,
    memory_id: str,
    draft: MemoryDraft,
    mode: SaveMode,
    expected_revision: int | None,
    audiences: frozenset[str] | None,
) -> Memory | None:
    """The write rules, the same for one memory or a batch: returns the current memory."""
    current = None if row is None else _memory(row)
    deleted = row is not None and row["deleted_at"] is not None
    judge_write(current, deleted, memory_id, mode, expected_revision, audiences)
    return current


def _values(
    org_id: str, memory_id: str, draft: MemoryDraft, author: str | None, current: Memory | None
) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "org_id": org_id,
        "id": memory_id,
        "revision": 1 if current is None else current.revision + 1,
        "title": draft.title,
        "body": draft.body,
        "source": draft.source,
        "tags": list(draft.tags),
        "audiences": list(draft.audiences),
        "author": author,
        "created_at": now if current is None else current.created_at,
        "updated_at": now,
        "valid_until": draft.valid_until,
        "supersedes": list(draft.supersedes),
        "pinned": draft.pinned,
        "action": "create" if current is None else "edit",
    }


def _passage_rows(
    org_id: str, memory_id: str, values: dict[str, Any], passages: Sequence[PassageInput]
) -> list[tuple[Any, ...]]:
    return [
        (
            org_id,
            memory_id,
            values["revision"],
            p.seq,
            p.text,
            p.lexical,
            len(p.lexical.split()),
            p.content_hash,
            Vector.of(p.embedding),
        )
        for p in passages
    ]


def insert_passages(
    cur: psycopg.Cursor[Any], rows: list[tuple[Any, ...]], tokens: Sequence[bytes | None]
) -> None:
    """Passage rows (`INSERT_PASSAGE`'s columns), then the token matrices of those that carry
    one, by the ids the rows were given (relay migrate numbers passages afresh too)."""
    if not rows:
        return
    cur.executemany(INSERT_PASSAGE, rows, returning=True)
    ids = []
    while True:
        ids.append(cur.fetchone()["id"])  # type: ignore[index]
        if not cur.nextset():
            break
    given = [(i, t) for i, t in zip(ids, tokens, strict=True) if t is not None]
    if given:
        cur.execute(
            "INSERT INTO passage_tokens (passage_id, tokens)"
            " SELECT * FROM unnest(%s::bigint[], %s::bytea[])",
            ([i for i, _ in given], [t for _, t in given]),
        )


def _by_org(rows: Sequence[Any]) -> dict[str, list[int]]:
    """Passage ids grouped by their org, from rows of (id, org_id)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["org_id"], []).append(r["id"])
    return out


def _check_supersedes(
    conn: psycopg.Connection,
    org_id: str,
    memory_id: str,
    draft: MemoryDraft,
    writer: frozenset[str] | None,
    kept: Sequence[str],
) -> MemoryDraft:
    targets = list(dict.fromkeys([*draft.supersedes, *kept]))
    rows = (
        conn.execute(
            "SELECT id, audiences, deleted_at IS NULL AS live FROM memories"
            " WHERE org_id = %s AND id = ANY(%s)",
            (org_id, targets),
        ).fetchall()
        if targets
        else []
    )
    stored = {r["id"]: (r["audiences"], r["live"]) for r in rows}
    draft = settle_supersedes(memory_id, draft, stored, writer, kept)
    new = [t for t in draft.supersedes if t not in kept]
    if new:
        judge_cycle(memory_id, new, kept, _reached(conn, org_id, memory_id, new), writer)
    return draft


def _reached(
    conn: psycopg.Connection, org_id: str, memory_id: str, targets: Sequence[str]
) -> dict[str, tuple[list[str], list[str]]]:
    """The org's live memories `targets` reach by following `supersedes` (every link,
    whoever may read it), not past `memory_id`: each one's (supersedes, audiences)."""
    rows = conn.execute(
        "WITH RECURSIVE reach(id) AS (SELECT unnest(%(targets)s::text[])"
        " UNION SELECT s.id FROM reach JOIN memories m ON m.org_id = %(org)s"
        " AND m.id = reach.id AND m.deleted_at IS NULL, unnest(m.supersedes) AS s(id)"
        " WHERE reach.id <> %(me)s)"
        " SELECT m.id, m.supersedes, m.audiences FROM reach JOIN memories m"
        " ON m.org_id = %(org)s AND m.id = reach.id AND m.deleted_at IS NULL",
        {"targets": list(targets), "org": org_id, "me": memory_id},
    ).fetchall()
    return {r["id"]: (r["supersedes"], r["audiences"]) for r in rows}


def _as_read(
    conn: psycopg.Connection,
    org_id: str,
    items: Sequence[Read],
    audiences: frozenset[str] | None,
) -> list[Read]:
    """`items` as a reader of `audiences` sees them (`rules.as_read`): their links to
    memories it may not read (a deleted one by its last audiences) withheld. None: an
    admin management read, which sees every link."""
    ids = sorted(linked_ids(items))
    if audiences is None or not ids:
        return list(items)
    rows = conn.execute(
        "SELECT DISTINCT memory_id FROM memory_audiences WHERE org_id = %s"
        " AND memory_id = ANY(%s) AND audience = ANY(%s)",
        (org_id, ids, sorted(audiences | {EVERYONE})),
    ).fetchall()
    return [as_read(item, {r["memory_id"] for r in rows}) for item in items]


def _bump(conn: psycopg.Connection, org_id: str) -> None:
    conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = %s", (org_id,))


def _audience_key(audiences: Sequence[str]) -> tuple[str, ...]:
    """A memory's audiences as a key of `audience_totals`: distinct, in code point order
    (bytewise UTF-8, COLLATE "C": the order migration 5's backfill builds it in)."""
    return tuple(sorted(set(audiences)))


class _TermDelta:
    """Per-org document frequencies and sizes (the org's passages and tokens, and each
    audience set's passages), summed over a transaction and applied once."""

    def __init__(self) -> None:
        self.df: Counter[str] = Counter()
        self.passages = 0
        self.tokens = 0
        self.audiences: Counter[tuple[str, ...]] = Counter()

    def change(
        self,
        removed: Sequence[str],
        added: Sequence[str],
        old_audiences: Sequence[str],
        new_audiences: Sequence[str],
    ) -> None:
        """`removed` were passages of a memory for `old_audiences`, `added` are passages of
        one for `new_audiences`."""
        self.audiences[_audience_key(old_audiences)] -= len(removed)
        self.audiences[_audience_key(new_audiences)] += len(added)
        for lexical in removed:
            tokens = lexical.split()
            self.df.subtract(set(tokens))
            self.passages -= 1
            self.tokens -= len(tokens)
        for lexical in added:
            tokens = lexical.split()
            self.df.update(set(tokens))
            self.passages += 1
            self.tokens += len(tokens)

    def apply(self, conn: psycopg.Connection, org_id: str) -> None:
        changes = sorted((t, d) for t, d in self.df.items() if d)
        if changes:
            conn.execute(
                "INSERT INTO org_terms (org_id, term, df)"
                " SELECT %s, t, d FROM unnest(%s::text[], %s::int[]) AS c(t, d)"
                " ON CONFLICT (org_id, term) DO UPDATE SET df = org_terms.df + excluded.df",
                (org_id, [t for t, _ in changes], [d for _, d in changes]),
            )
            if any(d < 0 for _, d in changes):
                conn.execute(
                    "DELETE FROM org_terms WHERE org_id = %s AND term = ANY(%s) AND df <= 0",
                    (org_id, [t for t, d in changes if d < 0]),
                )
        if self.passages or self.tokens:
            conn.execute(
                "UPDATE orgs SET passage_count = passage_count + %s,"
                " token_count = token_count + %s WHERE id = %s",
                (self.passages, self.tokens, org_id),
            )
        totals = sorted((list(k), d) for k, d in self.audiences.items() if d)
        if totals:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO audience_totals (org_id, audiences, passage_count)"
                    " VALUES (%s, %s, %s) ON CONFLICT (org_id, audiences) DO UPDATE"
                    " SET passage_count = audience_totals.passage_count + excluded.passage_count",
                    [(org_id, k, d) for k, d in totals],
                )
            if any(d < 0 for _, d in totals):
                conn.execute(
                    "DELETE FROM audience_totals WHERE org_id = %s AND passage_count <= 0",
                    (org_id,),
                )
        self.df.clear()
        self.audiences.clear()
        self.passages = self.tokens = 0


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
        withheld=row["withheld"],
    )
