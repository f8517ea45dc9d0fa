"""A replica that runs on while its database is restored (a dump restored into the database
recreated, point-in-time recovery) answers from the restored database, not from its caches.

The restore sets each organisation's `generation` back; the database is one of the test's
own, recreated from a template copy taken earlier, as a restore recreates it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from relay.auth import mint_key
from relay.cache import ResultCache
from relay.models import MemoryDraft, Principal
from relay.search import Searcher
from relay.store.postgres import PostgresStore
from relay.writes import save

pytestmark = pytest.mark.postgres


@pytest.fixture
def database(pg_store: PostgresStore, pg_url: str) -> Iterator[tuple[str, str]]:
    """(URL of a database of the test's own, its name)."""
    name = f"relay_restored_{time.monotonic_ns()}"
    admin(pg_store, f"CREATE DATABASE {name}")
    try:
        yield urlsplit(pg_url)._replace(path=f"/{name}").geturl(), name
    finally:
        admin(pg_store, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin(pg_store, f"DROP DATABASE IF EXISTS {name}_copy WITH (FORCE)")


def admin(pg_store: PostgresStore, statement: str) -> None:
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
        conn.execute(statement)


def copy_of(pg_store: PostgresStore, source: str, target: str) -> None:
    """`target` as a copy of `source` (its connections ended first, as a template needs)."""
    admin(pg_store, f"DROP DATABASE IF EXISTS {target} WITH (FORCE)")
    admin(
        pg_store,
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{source}'",
    )
    admin(pg_store, f"CREATE DATABASE {target} TEMPLATE {source}")


def test_a_replica_across_a_restore_answers_from_the_restored_database(
    pg_store: PostgresStore, database: tuple[str, str], embedder
):
    """QA: after a restore, the first write brought an org back to a generation the replica
    had cached searches (and vectors) for, from before the restore: a search answered, from
    its cache, with a memory the restored database does not hold (its GET was 404)."""
    url, name = database
    store = PostgresStore(url, pool_size=2)
    searcher = Searcher(store, embedder, cache=ResultCache())
    try:
        org = store.create_org("acme").id
        key = mint_key(store, org, "r", frozenset({"memory:read"}), frozenset()).key
        reader = Principal(org, key.id, key.scopes, key.roles)
        coffee = MemoryDraft(body="The coffee machine is upstairs.")
        save(store, embedder, org, "coffee", coffee, "t", "create")
        copy_of(pg_store, name, f"{name}_copy")  # the backup

        vpn = MemoryDraft(body="Dana renews the VPN certificate every quarter.")
        save(store, embedder, org, "vpn", vpn, "t", "create")
        asked = "who renews the vpn certificate"
        assert [r.id for r in searcher.search(reader, asked, k=3).results] == ["vpn"]

        copy_of(pg_store, f"{name}_copy", name)  # restored: the vpn memory is not in it
        lunch = MemoryDraft(body="Lunch is served at noon in the atrium.")
        save(store, embedder, org, "lunch", lunch, "t", "create")  # a generation cached before

        answer = searcher.search(reader, asked, k=3)
        assert not answer.cached and "vpn" not in [r.id for r in answer.results]
    finally:
        searcher.close()
        store.close()
