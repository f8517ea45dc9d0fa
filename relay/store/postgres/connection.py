"""Connections to PostgreSQL: the URL's options, the pool, one transaction per call with
its tenant settings, and vectors on the wire.

Each transaction sets `relay.org_id` (and, for authentication, `relay.key_id`) for itself
alone, so the Row-Level Security policies hide every other org's rows; a write locks its
org's row first (`_write`). psycopg's errors become Relay's as each transaction ends
(`failures.translate_errors`).
"""

from __future__ import annotations

import logging
import os
import select
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.rows import DictRow, Row
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool

from relay.errors import InvalidRequestError, NotFoundError, StoreError
from relay.settings import whole
from relay.store import connect_deadline
from relay.store.migrations_postgres import APP_ROLE
from relay.store.postgres.failures import translate_errors

if TYPE_CHECKING:
    from relay.store.postgres.watch import StatementWatch

# One logger for the whole store, whichever part logs: operators and tests filter on it.
log = logging.getLogger("relay.store.postgres")

DEFAULT_POOL = 8
# How long a connection attempt may take, unless the URL (or PGCONNECT_TIMEOUT) says: a
# database that takes the connection and never answers held the CLI, a replica starting and
# the pool replacing a lost connection for psycopg's own default, 130 s.
CONNECT_TIMEOUT_S = 5
DEFAULT_EXACT_MAX = 20_000  # passages an org may have and still be searched exactly
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
# Read beside an org's `generation` wherever caches are keyed on it (`_versioned`): what a
# restore changes though it sets the counter back.
INCARNATION = (
    "(SELECT oid FROM pg_database WHERE datname = current_database())::int8 AS database_oid,"
    " tableoid::int8 AS table_oid, pg_postmaster_start_time() AS started"
)
EPOCH_BITS = 40  # room for an org's generations within one epoch

# A pooled connection: the pool makes its rows dicts (`row_factory=dict_row`).
PgConnection: TypeAlias = psycopg.Connection[DictRow]


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


def _make_dumper(oid: int) -> type[Dumper]:
    return type("VectorDumper", (_VectorDumper,), {"oid": oid})


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
    pool = _option(own, "pool_size", "RELAY_PG_POOL", DEFAULT_POOL, 1)
    exact = _option(own, "exact_max", "RELAY_PG_EXACT_MAX", DEFAULT_EXACT_MAX, 0)
    cache_mb = _option(
        own, "vector_cache_mb", "RELAY_PG_VECTOR_CACHE_MB", DEFAULT_VECTOR_CACHE_MB, 0
    )
    if "PGCONNECT_TIMEOUT" not in os.environ and all(k != "connect_timeout" for k, _ in rest):
        rest.append(("connect_timeout", str(CONNECT_TIMEOUT_S)))
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    if not parts.netloc:
        # urlunsplit drops the empty authority (postgresql:/db), which libpq then refuses:
        # keep the `///` of the socket form, postgresql:///db?host=/socket/dir.
        conninfo = conninfo.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return PgOptions(conninfo, pool, exact, own.get("app_role") or APP_ROLE, cache_mb)


def _option(own: dict[str, str], name: str, variable: str, default: int, low: int) -> int:
    """One of Relay's integer options: from the URL, else its environment variable, else the
    default; read as every integer setting is (`relay.settings.whole`: decimal digits alone,
    `low` or more), and named where it was set when it is wrong."""
    if own.get(name):
        text, bad = own[name], f"bad PostgreSQL URL option {name}={own[name]!r}"
    elif os.environ.get(variable):
        text, bad = (
            os.environ[variable],
            f"{variable}={os.environ[variable]!r} is not a valid {name}",
        )
    else:
        return default
    try:
        return whole(low)(text)
    except ValueError as exc:
        raise InvalidRequestError(f"{bad}: {exc}") from None


def _wait() -> float:
    """How long this call may wait for a pooled connection: `POOL_WAIT_S`, or less when the
    request's deadline comes first (never zero: a free connection is still taken at once)."""
    deadline = connect_deadline()
    if deadline is None:
        return POOL_WAIT_S
    return max(0.001, min(POOL_WAIT_S, deadline - time.monotonic()))


class PostgresConnections:
    """The pool and the transactions on it (mixed into `PostgresStore`, which opens the
    pool and sets these attributes)."""

    conninfo: str
    app_role: str
    pool: ConnectionPool[PgConnection]
    watch: StatementWatch
    incarnation: tuple[int, int, datetime] | None  # of the database `_versioned` last read
    epoch: int
    epoch_lock: threading.Lock

    def _versioned(self, row: DictRow) -> int:
        """An org's generation as this replica's caches (search results, vectors) key on it.
        A restore (a dump into the database recreated, point-in-time recovery) sets the
        database's counter back, and its next writes brought the org to generations cached
        from before the restore: a search answered with a memory the restored database does
        not hold. The database's and the orgs table's identities (a restore recreates one or
        both) and the server's start (a recovery restarts it) tell such a database apart;
        each new one starts an epoch above every generation of the last."""
        seen = (row["database_oid"], row["table_oid"], row["started"])
        with self.epoch_lock:
            if seen != self.incarnation:
                self.epoch += self.incarnation is not None
                self.incarnation = seen
            return (self.epoch << EPOCH_BITS) + row["generation"]

    def _configure(self, conn: PgConnection) -> None:
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

    def _check(self, conn: PgConnection) -> None:
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
    ) -> Iterator[PgConnection]:
        """One transaction, its tenant settings set for it alone (`set_config(..., true)`);
        under a request's deadline, cut short if the database stops answering (`watch`)."""
        with (
            translate_errors(),
            self.pool.connection(_wait()) as conn,
            self.watch.within(conn, connect_deadline()),
            conn.transaction(),
        ):
            conn.execute(
                "SELECT set_config('relay.org_id', %s, true), set_config('relay.key_id', %s, true),"
                " set_config('relay.directory', %s, true)",
                (org_id or "", key_id or "", "on" if directory else ""),
            )
            yield conn

    @contextmanager
    def _write(self, org_id: str) -> Iterator[PgConnection]:
        """A write transaction on one org: its row locked first, so writes never deadlock."""
        with self._tx(org_id) as conn:
            if not conn.execute(
                "SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org_id,)
            ).fetchone():
                raise NotFoundError(f"no organisation {org_id!r}")
            yield conn


def one_row(cursor: psycopg.Cursor[Row]) -> Row:
    """The row of a query that always returns one (an aggregate, a function's result, an
    UPDATE ... RETURNING of a row the transaction holds)."""
    row = cursor.fetchone()
    if row is None:
        raise StoreError("database error: no row where the query always returns one")
    return row


def _bump(conn: PgConnection, org_id: str) -> None:
    conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = %s", (org_id,))
