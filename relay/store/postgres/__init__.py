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

`PostgresStore` is put together from one part per concern, each a module here:
`connection` (URL options, pool, transactions, vectors on the wire), `failures` (psycopg's
errors in Relay's words),
`watch` (a transaction under a request's deadline cut short when the database stops answering),
`orgs` (organisations and keys), `writes` (saves, deletes, supersession links), `totals`
(the per-org counts writes keep for scoring, and their recount), `reads` (memory reads
and the access filters), `search` (the lexical stage, passages, document frequencies),
`vectors` (the vector stage and the HNSW index), `embeddings` (embedding cache and token
matrices), `reports` (the hook outcomes developers send) and `rows` (rows as models).
Migrating the schema (`migrations_postgres`) as the owner, and the app role, stay here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from relay.errors import StoreError
from relay.store import candidate_terms
from relay.store.migrations_postgres import GRANTS, MIGRATIONS
from relay.store.postgres.connection import (
    POOL_WAIT_S,
    RECONNECT_S,
    PostgresConnections,
    Vector,
    log,
    one_row,
    parse_url,
)
from relay.store.postgres.embeddings import EmbeddingsAndTokens
from relay.store.postgres.failures import driver_text, translate_errors
from relay.store.postgres.orgs import OrgsAndKeys
from relay.store.postgres.reads import MemoryReads
from relay.store.postgres.reports import HookOutcomes
from relay.store.postgres.search import SearchStages, within_budget
from relay.store.postgres.totals import _repair_passage_totals, recount_passage_totals
from relay.store.postgres.vectors import VectorSearch, ef_search_for
from relay.store.postgres.watch import StatementWatch
from relay.store.postgres.writes import MemoryWrites, insert_passages, relink_org_superseded
from relay.store.vector_index import VectorIndex

# What the rest of Relay (relay migrate, benchmarks, tests) imports from here.
__all__ = [
    "POOL_WAIT_S",
    "PostgresStore",
    "Vector",
    "candidate_terms",
    "ef_search_for",
    "insert_passages",
    "parse_url",
    "recount_passage_totals",
    "relink_org_superseded",
    "within_budget",
]


@contextmanager
def _as_owner(version: int) -> Iterator[None]:
    """A migration step this user may not take is named, with who may (PostgreSQL's words
    alone, with the SQL it refused, left the operator of a replica's own login guessing)."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        # PostgreSQL's message and hint, not the statement it quotes after them.
        said = ". ".join(filter(None, (exc.diag.message_primary, exc.diag.message_hint)))
        raise StoreError(
            f"schema migration {version} cannot be applied as this database user"
            f" ({said or driver_text(exc)}): it takes the schema's owner (run `relay org list`"
            " with the owner's URL once), and the vector extension a superuser"
            " (docs/deployment.md)"
        ) from exc


class PostgresStore(
    OrgsAndKeys,
    MemoryWrites,
    MemoryReads,
    SearchStages,
    VectorSearch,
    EmbeddingsAndTokens,
    HookOutcomes,
    PostgresConnections,
):
    """The shared store (see module docstring): its parts are mixed in from the modules
    beside this one, each holding one concern."""

    role: str  # the database role it works as
    rls_enforced: bool

    def __init__(self, url: str, pool_size: int | None = None, exact_max: int | None = None):
        opts = parse_url(url)
        self.url = url
        self.conninfo = opts.conninfo
        self.exact_max = opts.exact_max if exact_max is None else exact_max
        self.vectors = (
            VectorIndex(max_bytes=opts.vector_cache_mb << 20) if opts.vector_cache_mb else None
        )
        self.app_role = opts.app_role
        self.watch = StatementWatch()
        self.incarnation, self.epoch, self.epoch_lock = None, 0, threading.Lock()
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

    def _migrate(self) -> None:
        """Apply pending migrations as the owner, one transaction each, under an advisory lock.
        A member of the app role that is not the owner (docs/deployment.md: a replica's own
        login) finds none pending and touches nothing: it may not create in the schema, and
        PostgreSQL checks that even for a CREATE TABLE IF NOT EXISTS of a table that exists."""
        with translate_errors(), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(hashtext('relay schema'))")
            try:
                if one_row(conn.execute("SELECT to_regclass('schema_migrations')"))[0] is None:
                    with _as_owner(1):  # a database no owner has set up yet
                        conn.execute(
                            "CREATE TABLE schema_migrations"
                            " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL)"
                        )
                done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                for version, script in enumerate(MIGRATIONS, start=1):
                    if version in done:
                        continue
                    with _as_owner(version), conn.transaction():
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
            except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                # Roles are the cluster's, the schema lock one database's: a first start on
                # another database of this cluster made it an instant ago.
                pass
        schema = one_row(conn.execute("SELECT current_schema()"))[0]
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

    def schema_version(self) -> int:
        with self._tx() as conn:
            row = one_row(conn.execute("SELECT max(version) AS version FROM schema_migrations"))
        return row["version"]

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
        self.watch.close()
