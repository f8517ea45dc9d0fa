"""PostgreSQL for the tests: one real server per session, a clean database for each test.

`pg_url` starts PostgreSQL 16 + pgvector from the PyPI package `pgserver` in a
temporary folder (or takes RELAY_TEST_POSTGRES_URL, which must name a
throwaway database: every test empties it). `pg_store` hands each test a
`PostgresStore` over emptied tables (TRUNCATE, a few ms), so tests stay
independent without paying for a new database each.

Hook in from tests/conftest.py with `from postgres_support import *  # noqa: F403`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = [
    "pg_url",
    "pg_store",
    "raw_count",
    "raw_rows",
    "renamed_table",
    "recounted_totals",
    "stored_totals",
    "truncate_all",
    "PrivatePostgres",
]


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("RELAY_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on import
        import pgserver

        # Outside pytest's basetemp: a newer pytest run on the machine prunes old basetemps,
        # which would delete a running server's data folder under it.
        folder = tempfile.mkdtemp(prefix="relay-pg-")
        server = pgserver.get_server(Path(folder) / "data", cleanup_mode="delete")
    import psycopg

    base = server.get_uri()
    with psycopg.connect(base, autocommit=True) as conn:
        # A throwaway server: durability buys nothing here and costs seconds.
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE DATABASE relay_test")
    yield base.replace("/postgres?", "/relay_test?", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


def truncate_all(url: str) -> None:
    """Empty every Relay table (as the owner: TRUNCATE is not subject to row security)."""
    import psycopg

    from relay.store.postgres import parse_url

    with psycopg.connect(parse_url(url).conninfo, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename <> 'schema_migrations'"
            )
        ]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


@pytest.fixture
def pg_store(pg_url: str):  # noqa: ANN201
    from relay.store.postgres import PostgresStore

    store = PostgresStore(pg_url, pool_size=4)
    truncate_all(pg_url)
    yield store
    store.close()


def raw_count(store, query: str, params: tuple = ()) -> int:  # noqa: ANN001
    """A count straight from the tables, beneath the store's API: SQLite's own connection, or
    PostgreSQL as the connecting user (the tests' superuser, so row-level security is bypassed
    and rows of every org are counted)."""
    return raw_rows(store, query, params)[0][0]


def raw_rows(store, query: str, params: tuple = ()) -> list[tuple]:  # noqa: ANN001
    """Rows straight from the tables, as `raw_count` reads them."""
    conninfo = getattr(store, "conninfo", None)
    if conninfo is None:
        with store._read() as conn:
            return [tuple(r) for r in conn.execute(query, params)]
    import psycopg

    with psycopg.connect(conninfo) as conn:
        return conn.execute(query.replace("?", "%s"), params).fetchall()


def execute_beneath(store, statement: str) -> None:  # noqa: ANN001
    """Run `statement` on `store`'s database beneath its API (SQLite's writer, or its own
    PostgreSQL connection), committed."""
    conninfo = getattr(store, "conninfo", None)
    if conninfo is None:
        with store._write() as conn:
            conn.execute(statement)
        return
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(statement)


@contextmanager
def renamed_table(store, table: str) -> Iterator[None]:  # noqa: ANN001
    """`table` under another name for the block, so the store's queries on it fail the way
    a broken database fails them (a real StoreError, no mock); renamed back after it."""
    away = f"{table}_away"

    def ddl(statement: str) -> None:
        execute_beneath(store, statement)

    ddl(f"ALTER TABLE {table} RENAME TO {away}")
    try:
        yield
    finally:
        ddl(f"ALTER TABLE {away} RENAME TO {table}")


def stored_totals(store, org: str) -> dict[tuple[str, ...], int]:
    """`audience_totals` as the store keeps them."""
    rows = raw_rows(
        store, "SELECT audiences, passage_count FROM audience_totals WHERE org_id = ?", (org,)
    )
    return {tuple(json.loads(a) if isinstance(a, str) else a): n for a, n in rows}


def recounted_totals(store, org: str) -> dict[tuple[str, ...], int]:
    """The same, counted again from the passages and their memories' audiences."""
    audiences: dict[str, list[str]] = {}
    for memory_id, audience in raw_rows(
        store, "SELECT memory_id, audience FROM memory_audiences WHERE org_id = ?", (org,)
    ):
        audiences.setdefault(memory_id, []).append(audience)
    totals: Counter[tuple[str, ...]] = Counter()
    for memory_id, n in raw_rows(
        store,
        "SELECT memory_id, count(*) FROM passages WHERE org_id = ? GROUP BY memory_id",
        (org,),
    ):
        totals[tuple(sorted(audiences.get(memory_id, [])))] += n
    return dict(totals)


class PrivatePostgres:
    """A PostgreSQL server of its own, for tests that stop and restart it (the shared one
    stays up for every other test). `url` stays valid across restarts. Its folder is made
    outside pytest's basetemp, like `pg_url`'s."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            self.folder = tempfile.mkdtemp(prefix="relay-pg-private-")
            self.server = pgserver.get_server(Path(self.folder) / "data", cleanup_mode="delete")
        self.url = self.server.get_uri()

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl  # runs it as the server's system user

        pg_ctl(["-w", *args], pgdata=self.server.pgdata, user=self.server.system_user)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def restart(self) -> None:
        """What an operator's restart does: every open connection is terminated."""
        self._pg_ctl("-m", "fast", "restart")

    def _processes(self) -> list[int]:
        """The postmaster and every process it started (a backend per open connection)."""
        main = int((Path(self.server.pgdata) / "postmaster.pid").read_text().split()[0])
        children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
        return [main, *map(int, children)]

    def freeze(self) -> None:
        """A database that stops answering but keeps its connections open (its host frozen,
        its storage stalled; the network cut without a reset looks the same to a client)."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._processes():
            os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        import psutil  # pgserver's own dependency

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self.server.cleanup()
            except psutil.NoSuchProcess:
                # Stopped by the test, the postmaster was still exiting when pgserver looked
                # and gone when it signalled it (CI once): gone is what closing wants.
                pass
        shutil.rmtree(self.folder, ignore_errors=True)
