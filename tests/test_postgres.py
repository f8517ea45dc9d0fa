"""What only the PostgreSQL store has: row-level security, vector search routing, URL options."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from urllib.parse import urlsplit

import numpy as np
import psycopg
import pytest
from postgres_support import raw_count

from relay.errors import InvalidRequestError, StoreError
from relay.models import HookReport, MemoryDraft, PassageInput
from relay.store import connect_by, vector_index
from relay.store.postgres import (
    PostgresStore,
    candidate_terms,
    ef_search_for,
    parse_url,
    within_budget,
)
from relay.store.postgres.watch import GRACE_S

pytestmark = pytest.mark.postgres
EVERY = frozenset({"all"})


def _vectors(n: int, seed: int) -> np.ndarray:
    m = np.random.default_rng(seed).normal(size=(n, 384)).astype("<f4")
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _fill(store: PostgresStore, org: str, vectors: np.ndarray, prefix: str) -> None:
    items = [
        (
            f"{prefix}{i}",
            MemoryDraft(body=f"note {prefix} {i}"),
            [PassageInput(0, f"note {i}", f"note {i}", f"{prefix}{i}", v.tobytes())],
        )
        for i, v in enumerate(vectors)
    ]
    for start in range(0, len(items), 500):
        store.save_memories(org, items[start : start + 500], "t", "upsert")


def test_a_query_that_forgets_the_org_filter_sees_nothing(pg_store: PostgresStore):
    a, b = pg_store.create_org("acme").id, pg_store.create_org("globex").id
    for org in (a, b):
        _fill(pg_store, org, _vectors(3, 1), "m")
        pg_store.create_key(org, f"k{org}", "h", "n", frozenset({"admin"}), frozenset(), None)
        sent = HookReport(0.0, "alice", f"k{org}", None, None, 1, {}, 0, None, 0, None, {}, None)
        pg_store.add_hook_report(org, sent)
    assert pg_store.rls_enforced and pg_store.role == "relay_app"
    tables = ["orgs", "api_keys", "memories", "memory_audiences", "memory_revisions", "passages"]
    tables.append("hook_outcomes")
    unfiltered = [f"SELECT count(*) AS n FROM {t}" for t in tables]
    with pg_store._tx() as conn:  # no org set: every tenant table looks empty
        assert [conn.execute(q).fetchone()["n"] for q in unfiltered] == [0] * len(tables)
    with pg_store._tx(a) as conn:  # org a set: only a's rows, never b's
        assert [conn.execute(q).fetchone()["n"] for q in unfiltered] == [1, 1, 3, 3, 3, 3, 1]
        assert (
            conn.execute("SELECT count(*) AS n FROM memories WHERE org_id = %s", (b,)).fetchone()[
                "n"
            ]
            == 0
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor write into b
            conn.execute("INSERT INTO memory_audiences VALUES (%s, 'm0', 'x')", (b,))
    with pg_store._tx(a) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(
            "INSERT INTO hook_outcomes (org_id, key_id, developer, received_at, invocations,"
            " outcomes, unauthorized_streak, unavailable_streak, hook_ms)"
            " VALUES (%s, 'k', 'mallory', now(), 1, '{}', 0, 0, '{}')",
            (b,),
        )
    with pg_store._tx(key_id=f"k{a}") as conn:  # authentication sees one key and nothing else
        assert conn.execute("SELECT count(*) AS n FROM api_keys").fetchone()["n"] == 1
        assert conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"] == 0


def test_the_setting_lasts_one_transaction(pg_store: PostgresStore):
    org = pg_store.create_org("acme").id
    _fill(pg_store, org, _vectors(2, 2), "m")
    with pg_store.pool.connection() as conn:
        with conn.transaction():
            conn.execute("SELECT set_config('relay.org_id', %s, true)", (org,))
            assert conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"] == 2
        # Same pooled connection, next transaction: the org is gone with the last one.
        assert conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"] == 0


def test_small_org_gets_its_true_top_results_beside_a_big_one(pg_url: str):
    store = PostgresStore(pg_url, pool_size=2, exact_max=100)
    try:
        from postgres_support import truncate_all

        truncate_all(pg_url)
        owner = psycopg.connect(parse_url(pg_url).conninfo, autocommit=True)
        # Bulk-load, then build the index once: far faster than growing it row by row.
        owner.execute("DROP INDEX passages_embedding")
        big, mid, small = (store.create_org(n).id for n in ("big", "mid", "small"))
        _fill(store, big, _vectors(2400, 3), "b")
        _fill(store, mid, _vectors(1200, 4), "m")  # 33%: HNSW with a raised ef_search
        _fill(store, small, _vectors(60, 5), "s")  # 2%: exact
        owner.execute(
            "CREATE INDEX passages_embedding ON passages USING hnsw (embedding vector_cosine_ops)"
        )
        owner.execute("ANALYZE passages")
        owner.close()
        assert store.vector_plan(small, 40) == "exact"
        assert store.vector_plan(mid, 40).startswith("hnsw")
        now = datetime.now(UTC)
        queries = _vectors(20, 6)
        for org, want in ((small, 1.0), (mid, 0.9)):
            found = total = 0
            for q in queries:
                got = [r for r, _ in store.semantic_search(org, EVERY, now, q, 40)]
                exact = [r for r, _ in store.exact_semantic_search(org, EVERY, now, q, 5)]
                found += len(set(got[:5]) & set(exact))
                total += len(exact)
            assert found / total >= want
        # What the routing avoids: the plain HNSW query starves the small org.
        with store._tx(small) as conn:
            conn.execute("SET LOCAL enable_sort = off")  # the plan a larger org would get
            rows = conn.execute(
                "SELECT id FROM passages WHERE org_id = %s ORDER BY embedding <=> %s LIMIT 5",
                (small, _vector_param(queries[0])),
            ).fetchall()
        assert len(rows) < 5
    finally:
        store.close()


def test_exact_search_stays_exact_when_the_filter_hides_the_nearest(pg_store: PostgresStore):
    """The exact scan ranks the org's vectors first and filters a shortlist after: when the
    filter hides the whole shortlist it must still return the true visible top."""
    org = pg_store.create_org("acme").id
    pg_store.create_key(org, "k1", "h", "n", frozenset({"admin"}), frozenset({"sec"}), None)
    vectors = _vectors(400, 7)
    q = vectors[0]
    order = np.argsort(-(vectors @ q), kind="stable")
    hidden = set(order[:200].tolist())  # the 200 nearest: more than the 160-row shortlist
    items = [
        (
            f"m{i}",
            MemoryDraft(body=f"note {i}", audiences=("sec",) if i in hidden else ("all",)),
            [PassageInput(0, f"note {i}", f"note {i}", f"h{i}", v.tobytes())],
        )
        for i, v in enumerate(vectors)
    ]
    pg_store.save_memories(org, items, "t", "upsert")
    now = datetime.now(UTC)
    memory_of = {}
    with pg_store._tx(org) as conn:
        for r in conn.execute("SELECT id, memory_id FROM passages WHERE org_id = %s", (org,)):
            memory_of[r["id"]] = int(r["memory_id"][1:])
    for audiences, expect in (
        (EVERY, [int(i) for i in order if i not in hidden][:40]),
        (frozenset({"all", "sec"}), [int(i) for i in order[:40]]),
    ):
        # The replica's in-memory scan and PostgreSQL's own exact scan give one answer.
        got = pg_store.semantic_search(org, audiences, now, q, 40)
        sql = pg_store.exact_semantic_search(org, audiences, now, q, 40)
        assert [memory_of[r] for r, _ in got] == expect
        assert [r for r, _ in sql] == [r for r, _ in got]
        assert [s for _, s in sql] == pytest.approx([s for _, s in got], abs=1e-6)


def _vector_param(v: np.ndarray):  # noqa: ANN202
    from relay.store.postgres import Vector

    return Vector.of(v)


def test_ef_search_grows_with_a_shrinking_share():
    assert ef_search_for(40, 500_000, 1_000_000) == 480
    assert ef_search_for(40, 100_000, 1_000_000) is None  # 10%: beyond pgvector's ceiling
    assert ef_search_for(40, 10, 0) is None


def test_lexical_candidates_come_from_the_rarest_terms_within_a_budget():
    df = {"use": 9000, "pnpm": 3, "yarn": 1500, "lint": 900}
    assert within_budget(["use", "pnpm", "yarn", "lint"], df) == ["pnpm", "lint"]
    assert within_budget(["use"], df) == ["use"]  # never none
    assert within_budget(["use", "new"], df) == ["new"]  # unseen terms are the rarest
    assert candidate_terms(["use", "pnpm"], df, 1_000_000) == ["use", "pnpm"]  # shared rule first


def test_a_replica_logging_in_as_a_member_of_the_app_role_starts_and_serves(
    pg_store: PostgresStore, pg_url: str
):
    """QA: docs/deployment.md gives replicas a login of their own in relay_app, the owner
    applying migrations. Such a role may not create in the schema (PostgreSQL 15 on), and
    PostgreSQL checks that even for CREATE TABLE IF NOT EXISTS of a table that exists: every
    start failed with 'permission denied for schema public'. One pending migration is named."""
    org = pg_store.create_org("acme").id
    _fill(pg_store, org, _vectors(2, 3), "m")
    login = f"relay_server_{time.monotonic_ns()}"
    parts = urlsplit(pg_url)
    member_url = parts._replace(netloc=f"{login}:pw@{parts.netloc.rpartition('@')[2]}").geturl()
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD 'pw' IN ROLE relay_app")
    try:
        member = PostgresStore(member_url, pool_size=1)
        try:
            assert member.rls_enforced and member.role == "relay_app"
            assert {m.id for m in member.list_memories(org, EVERY, 10)[0]} == {"m0", "m1"}
        finally:
            member.close()
        last = raw_count(pg_store, "SELECT max(version) FROM schema_migrations")
        with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
            conn.execute("DELETE FROM schema_migrations WHERE version = %s", (last,))
            try:
                with pytest.raises(
                    StoreError,
                    match=f"schema migration {last} cannot be applied as this database user",
                ):
                    PostgresStore(member_url, pool_size=1)
            finally:
                conn.execute("INSERT INTO schema_migrations VALUES (%s, now())", (last,))
    finally:
        with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {login}")


def test_a_member_login_on_a_database_no_owner_has_set_up_is_told_who_may(
    pg_store: PostgresStore, pg_url: str
):
    """QA: a replica's own login (docs/deployment.md) started on a fresh database, before the
    owner ever ran, said only PostgreSQL's words and the statement they refused: 'database
    error: permission denied for schema public; LINE 1: CREATE TABLE schema_migrations ...'.
    It names the migration, and who may apply it, as a later pending one does."""
    suffix = time.monotonic_ns()
    database, login = f"relay_fresh_{suffix}", f"relay_server_{suffix}"
    parts = urlsplit(pg_url)
    member_url = parts._replace(
        netloc=f"{login}:pw@{parts.netloc.rpartition('@')[2]}", path=f"/{database}"
    ).geturl()
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
        conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD 'pw' IN ROLE relay_app")
    try:
        with pytest.raises(StoreError) as refused:
            PostgresStore(member_url, pool_size=1)
        assert str(refused.value) == (
            "schema migration 1 cannot be applied as this database user (permission denied for"
            " schema public): it takes the schema's owner (run `relay org list` with the"
            " owner's URL once), and the vector extension a superuser (docs/deployment.md)"
        )
    finally:
        with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database}")
            conn.execute(f"DROP ROLE {login}")


def test_first_starts_on_two_databases_of_one_cluster_share_the_app_role(
    pg_store: PostgresStore, pg_url: str
):
    """QA: roles belong to the cluster, the schema's lock to one database: first starts on two
    databases of one cluster (staging and production, say) at once each saw no app role and
    each created it, and one failed, exit 7: 'duplicate key value violates unique constraint
    "pg_authid_rolname_index"'. Both are held at CREATE ROLE (pg_authid locked against
    writes, not reads) until both are there, then let go together."""
    suffix = time.monotonic_ns()
    role, database = f"relay_app_{suffix}", f"relay_second_{suffix}"
    parts = urlsplit(pg_url)
    query = f"{parts.query}&app_role={role}"
    urls = [
        parts._replace(query=query, path=path).geturl() for path in (parts.path, f"/{database}")
    ]
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    hold, stores = psycopg.connect(pg_store.conninfo), []
    try:
        hold.execute("LOCK TABLE pg_authid IN EXCLUSIVE MODE")
        with (
            ThreadPoolExecutor(2) as pool,
            # autocommit: one transaction would see the same activity snapshot every poll
            psycopg.connect(pg_store.conninfo, autocommit=True) as watch,
        ):
            opening = [pool.submit(PostgresStore, url, 1) for url in urls]
            deadline = time.monotonic() + 60
            while not any(f.done() for f in opening):
                (waiting,) = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname IN (current_database(), %s)",
                    (database,),
                ).fetchone()
                if waiting >= 2:
                    break
                assert time.monotonic() < deadline, "the stores never reached CREATE ROLE"
                time.sleep(0.05)
            hold.commit()
            wait(opening)
        stores = [f.result() for f in opening if f.exception() is None]
        for f in opening:
            f.result()  # the one that failed to open, if any
        assert [store.role for store in stores] == [role, role]
    finally:
        for store in stores:
            store.close()
        hold.close()
        with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database}")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_relay_options_are_taken_out_of_the_url(monkeypatch):
    monkeypatch.setenv("RELAY_PG_POOL", "3")
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    opts = parse_url("postgresql://u@/db?host=/tmp/x&exact_max=7&app_role=r")
    assert (opts.pool_size, opts.exact_max, opts.app_role) == (3, 7, "r")
    assert opts.conninfo == "postgresql://u@/db?host=%2Ftmp%2Fx&connect_timeout=5"
    assert parse_url("postgresql://u@h/db?connect_timeout=30").conninfo.endswith("timeout=30")
    assert parse_url("postgresql://u@h/db?pool_size=12").pool_size == 12


@pytest.mark.parametrize(
    ("option", "variable", "text", "says"),
    [
        ("pool_size", "RELAY_PG_POOL", "x", "'x' is not a whole number"),
        ("pool_size", "RELAY_PG_POOL", "1_0", "'1_0' is not a whole number"),
        ("pool_size", "RELAY_PG_POOL", "0", "0 is below 1"),
        ("exact_max", "RELAY_PG_EXACT_MAX", "-5", "-5 is below 0"),
        ("vector_cache_mb", "RELAY_PG_VECTOR_CACHE_MB", " 64", "' 64' is not a whole number"),
    ],
)
def test_a_bad_option_is_named_where_it_was_set(monkeypatch, option, variable, text, says):
    """QA: RELAY_PG_POOL=abc said 'bad PostgreSQL URL option: invalid literal for int() with
    base 10', naming neither the option nor the variable (and sent the operator to the URL);
    1_0 was taken for 10 and a negative exact_max for a setting. Integers are read as every
    other setting reads them (decimal digits alone)."""
    with pytest.raises(InvalidRequestError) as in_url:
        parse_url(f"postgresql://u@h/db?{option}={text}")
    assert str(in_url.value) == f"bad PostgreSQL URL option {option}={text!r}: {says}"
    monkeypatch.setenv(variable, text)
    with pytest.raises(InvalidRequestError) as in_env:
        parse_url("postgresql://u@h/db")
    assert str(in_env.value) == f"{variable}={text!r} is not a valid {option}: {says}"


def test_the_socket_form_without_an_authority_connects(pg_url: str):
    """QA: postgresql:///db?host=/socket/dir (libpq's own form, in docs/deployment.md)
    became postgresql:/db..., which libpq refused as an invalid connection option."""
    bare = re.sub(r"^postgresql://[^/]*/", "postgresql:///", pg_url)
    user = urlsplit(pg_url).username
    url = f"{bare}&user={user}" if "?" in bare else f"{bare}?user={user}"
    with psycopg.connect(parse_url(url).conninfo) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_vector_cache_option_is_read_and_zero_turns_it_off(pg_url: str):
    assert parse_url("postgresql://u@h/db?vector_cache_mb=64").vector_cache_mb == 64
    with pytest.raises(InvalidRequestError):
        parse_url("postgresql://u@h/db?vector_cache_mb=-1")
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{sep}vector_cache_mb=0", pool_size=2)
    try:
        from postgres_support import truncate_all

        truncate_all(pg_url)
        org = store.create_org("acme").id
        _fill(store, org, _vectors(50, 8), "n")
        q = _vectors(1, 9)[0]
        got = store.semantic_search(org, EVERY, datetime.now(UTC), q, 10)
        assert store.vectors is None and len(got) == 10  # answered by PostgreSQL's own scan
    finally:
        store.close()


def test_a_small_orgs_vectors_load_past_a_searchs_deadline_for_the_searches_after_it(
    pg_store: PostgresStore,
):
    """The replica's copy of a small org's vectors serves every later search, so loading it
    is not cut short at the deadline of the search that happened to start it (`watch`): on
    a busy database an org near `exact_max`, its load cut every time, never got its copy."""
    org = pg_store.create_org("acme").id
    vectors = _vectors(20, 12)
    _fill(pg_store, org, vectors, "w")

    def search() -> list[tuple[int, float]]:
        with connect_by(time.monotonic() + 0.3):
            return pg_store.semantic_search(org, EVERY, datetime.now(UTC), vectors[0], 3)

    with psycopg.connect(pg_store.conninfo) as blocker, ThreadPoolExecutor(1) as pool:
        blocker.execute("LOCK TABLE passages IN ACCESS EXCLUSIVE MODE")  # the load waits
        running = pool.submit(search)
        time.sleep(GRACE_S + 1.0)
        blocker.commit()
        hits = running.result(timeout=30)
    assert pg_store.vectors is not None and org in pg_store.vectors
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)


def test_a_small_org_is_searched_from_memory_and_a_stale_copy_never_shows_the_deleted(
    pg_store: PostgresStore, monkeypatch
):
    """Between a write and the rebuild it starts, the replica's old copy of the vectors may
    answer (as on the embedded store): what it proposes is re-scored against the rows as
    they are, so a deleted passage never comes back and scores are the current ones."""
    monkeypatch.setattr(vector_index, "STALE_FROM", 1)  # treat this small org as a large one
    org = pg_store.create_org("acme").id
    vectors = _vectors(30, 10)
    _fill(pg_store, org, vectors, "v")
    q = vectors[3]
    now = datetime.now(UTC)
    first = pg_store.semantic_search(org, EVERY, now, q, 5)
    assert pg_store.vectors is not None and org in pg_store.vectors
    with pg_store._tx(org) as conn:
        ids = {r["memory_id"]: r["id"] for r in conn.execute("SELECT id, memory_id FROM passages")}
    assert first[0][0] == ids["v3"] and first[0][1] == pytest.approx(1.0, abs=1e-5)

    pg_store.delete_memory(org, "v3", "t", None)
    stale = pg_store.semantic_search(org, EVERY, now, q, 5)
    assert ids["v3"] not in {r for r, _ in stale}
    exact = pg_store.exact_semantic_search(org, EVERY, now, q, 5)
    assert {r for r, _ in stale} <= {
        r for r, _ in pg_store.exact_semantic_search(org, EVERY, now, q, 40)
    }
    assert [s for _, s in stale] == sorted((s for _, s in stale), reverse=True)
    deadline = time.monotonic() + 10  # the rebuild lands: the exact answer again
    while pg_store.semantic_search(org, EVERY, now, q, 5) != exact and time.monotonic() < deadline:
        time.sleep(0.05)
    fresh = pg_store.semantic_search(org, EVERY, now, q, 5)
    assert [r for r, _ in fresh] == [r for r, _ in exact]


def _passage(seq: int, text: str, tokens: bytes | None = None) -> PassageInput:
    return PassageInput(seq, text, text, f"h{text}", _vectors(1, seq)[0].tobytes(), tokens)


def _passage_ids(store: PostgresStore, org: str) -> dict[tuple[str, int], int]:
    with store._tx(org) as conn:
        rows = conn.execute("SELECT id, memory_id, seq FROM passages").fetchall()
    return {(r["memory_id"], r["seq"]): r["id"] for r in rows}


def _tokens_of(store: PostgresStore, org: str) -> dict[tuple[str, int], bytes | None]:
    ids = _passage_ids(store, org)
    matrices = store.token_matrices(org, list(ids.values()))
    assert all(type(t) is bytes for t in matrices.values())
    return {key: matrices.get(rowid) for key, rowid in ids.items()}


def test_token_matrices_are_saved_backfilled_and_go_with_their_passage(pg_store: PostgresStore):
    t1, t2, t3 = (bytes([n]) * 256 for n in (1, 2, 3))  # two int8 rows of 128 each
    a, b = pg_store.create_org("acme").id, pg_store.create_org("globex").id
    first = MemoryDraft(body="one", title="First")
    pg_store.save_memory(
        a, "m1", first, "t", [_passage(0, "alpha", t1), _passage(1, "beta")], "create"
    )
    batch = [  # two distinct memories: the batch path
        ("m2", MemoryDraft(body="two"), [_passage(0, "gamma")]),
        ("m3", MemoryDraft(body="three"), [_passage(0, "delta", t2)]),
    ]
    pg_store.save_memories(b, batch, "t", "create")
    assert _tokens_of(pg_store, a) == {("m1", 0): t1, ("m1", 1): None}
    assert _tokens_of(pg_store, b) == {("m2", 0): None, ("m3", 0): t2}
    ia, ib = _passage_ids(pg_store, a), _passage_ids(pg_store, b)
    missing = [(ia["m1", 1], "First", "beta"), (ib["m2", 0], None, "gamma")]  # across orgs
    assert pg_store.missing_tokens(10) == missing
    assert pg_store.missing_tokens(1) == missing[:1]

    # An edit replaces the passages: the old ones' matrices go, and only current ones lack.
    edit = MemoryDraft(body="one, edited", title="First")
    pg_store.save_memory(a, "m1", edit, "t", [_passage(0, "alpha, edited", t1)], "edit")
    assert raw_count(pg_store, "SELECT count(*) FROM passage_tokens") == 2  # m1's new, m3's
    old = "SELECT count(*) FROM passage_tokens WHERE passage_id = ?"
    assert raw_count(pg_store, old, (ia["m1", 0],)) == 0
    assert pg_store.missing_tokens(10) == [(ib["m2", 0], None, "gamma")]

    # The backfill skips a passage gone meanwhile and never overwrites a matrix.
    edited = _passage_ids(pg_store, a)["m1", 0]
    pg_store.store_tokens([(ia["m1", 1], t3), (ib["m2", 0], t3), (ib["m3", 0], t1), (edited, t3)])
    assert _tokens_of(pg_store, a) == {("m1", 0): t1}
    assert _tokens_of(pg_store, b) == {("m2", 0): t3, ("m3", 0): t2}
    assert pg_store.missing_tokens(10) == []
    pg_store.store_tokens([])

    pg_store.delete_memory(b, "m2", "t", None)
    assert raw_count(pg_store, "SELECT count(*) FROM passage_tokens") == 2
    pg_store.delete_memory(a, "m1", "t", None)
    assert raw_count(pg_store, "SELECT count(*) FROM passage_tokens") == 1


def test_token_matrices_are_seen_and_written_under_their_passages_org_only(
    pg_store: PostgresStore,
):
    a, b = pg_store.create_org("acme").id, pg_store.create_org("globex").id
    pg_store.save_memory(
        a, "m", MemoryDraft(body="x"), "t", [_passage(0, "x", b"\1" * 128)], "create"
    )
    pg_store.save_memory(b, "m", MemoryDraft(body="y"), "t", [_passage(0, "y")], "create")
    theirs = _passage_ids(pg_store, b)["m", 0]
    with pg_store._tx() as conn:  # no org set: none visible
        assert conn.execute("SELECT count(*) AS n FROM passage_tokens").fetchone()["n"] == 0
    with pg_store._tx(b) as conn:
        assert conn.execute("SELECT count(*) AS n FROM passage_tokens").fetchone()["n"] == 0
    with pg_store._tx(a) as conn:
        assert conn.execute("SELECT count(*) AS n FROM passage_tokens").fetchone()["n"] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor a matrix for b's passage
            conn.execute("INSERT INTO passage_tokens VALUES (%s, '\\x01')", (theirs,))
