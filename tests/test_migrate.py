"""`relay migrate`: a populated SQLite store round-trips into PostgreSQL, every revision intact."""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner
from integration_support import relay
from postgres_support import raw_count, raw_rows, recounted_totals, stored_totals

from relay.errors import InvalidRequestError, NotFoundError
from relay.migrate import Migration, migrate, open_source, verify
from relay.models import HookReport, MemoryDraft, PassageInput
from relay.store.postgres import PostgresStore, parse_url
from relay.store.sqlite import SQLiteStore
from relay.text import lexical_terms

pytestmark = pytest.mark.postgres
EVERY = frozenset({"all"})


def _passages(body: str, seed: int) -> list[PassageInput]:
    v = np.random.default_rng(seed).normal(size=384).astype("<f4")
    v /= np.linalg.norm(v)
    parts = body.split(" | ")
    return [
        PassageInput(i, p, " ".join(lexical_terms(p)), f"h{seed}.{i}", v.tobytes())
        for i, p in enumerate(parts)
    ]


def _populate(path: Path) -> list[str]:
    s = SQLiteStore(path)
    now = datetime.now(UTC)
    orgs = []
    for n, name in enumerate(("acme", "globex")):
        org = s.create_org(name).id
        orgs.append(org)
        s.create_key(
            org, f"k{n}a", "hash-a", "laptop", frozenset({"memory:read"}), frozenset({"dev"}), None
        )
        s.create_key(
            org, f"k{n}b", "hash-b", "ci", frozenset({"admin"}), frozenset(), now + timedelta(1)
        )
        s.revoke_key(org, f"k{n}a")

        def put(mid: str, body: str, seed: int, mode: str = "upsert", org: str = org, **f) -> None:  # noqa: ANN003
            s.save_memory(
                org, mid, MemoryDraft(body=body, **f), "alice", _passages(body, seed), mode
            )

        for i in range(7):
            put(f"m{i}", f"Fact {i} about the {name} deploy | second part {i}", seed=i)
        put("m1", "Fact 1, edited once", seed=11)
        put("m1", "Fact 1, edited twice | with a tail", seed=12, tags=("ops",), pinned=True)
        put("m2", "Only for SREs", seed=13, audiences=("sre",), title="Pager")
        put("m3", "Expires soon", seed=14, valid_until=now + timedelta(hours=1))
        put("new", "Deploys go out on Thursdays", seed=15, supersedes=("m4",))
        s.delete_memory(org, "m5", "bob", None)  # a tombstone, history kept
        # a developer's hook report: operational data that migrate leaves behind
        s.add_hook_report(
            org, HookReport(0.0, "alice", f"k{n}b", None, None, 1, {}, 4, None, 0, None, {}, None)
        )
    # the cache of the texts stored, and of one whose memory was deleted before migration 6
    s.cache_embeddings("model-x", {f"h{i}.0": bytes([i]) * 8 for i in range(7)})
    s.cache_embeddings("model-x", {"deleted-text": b"gone" * 2})
    s.close()
    return orgs


def test_round_trip_keeps_every_revision(tmp_path: Path, pg_url: str, pg_store: PostgresStore):
    db = tmp_path / "relay.db"
    orgs = _populate(db)
    args = ["--from", f"sqlite:///{db}", "--to", pg_url, "--defer-index"]
    result = CliRunner().invoke(migrate, args)
    assert result.exit_code == 0, result.output
    assert "verified: every table matches" in result.output
    assert "memory_revisions" in result.output

    src = SQLiteStore(db)
    now = datetime.now(UTC)
    for org in orgs:
        ids = [m.id for m in src.list_memories(org, None, 100)[0]] + ["m5"]
        for mid in ids:
            assert pg_store.history(org, mid, None) == src.history(org, mid, None)
        assert pg_store.list_memories(org, None, 100) == src.list_memories(org, None, 100)
        assert pg_store.generation(org) > src.generation(org)
        assert pg_store.doc_freq(org, ["fact", "deploy", "sre"]) == src.doc_freq(
            org, ["fact", "deploy", "sre"]
        )
        for terms in (["fact", "deploy"], ["thursday"], ["sre"]):
            pg = [p.memory_id for p in _found(pg_store, org, terms, now)]
            sq = [p.memory_id for p in _found(src, org, terms, now)]
            assert sorted(pg) == sorted(sq)
        assert [k.revoked_at is not None for k in pg_store.list_keys(org)] == [True, False]
        assert src.hook_reports(org) and pg_store.hook_reports(org) == {}  # skipped, verified
    # each revision's pin (migration 8) too: m1's third revision pinned it
    assert [r.pinned for r in pg_store.history(orgs[0], "m1", None)] == [False, False, True]
    key, secret_hash = pg_store.key_for_auth("k0b")
    assert (key.org_id, secret_hash) == (orgs[0], "hash-b")
    assert pg_store.cached_embeddings("model-x", ["h6.0"]) == {"h6.0": bytes([6]) * 8}
    assert pg_store.cached_embeddings("model-x", ["deleted-text"]) == {}  # not carried on
    src.close()

    # Running it again copies the same rows over themselves and still verifies.
    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert again.exit_code == 0 and "verified: every table matches" in again.output, again.output


def test_a_re_run_keeps_the_token_matrices_the_target_made_for_a_file_from_before_them(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """QA: a file from before token matrices (SQLite migration 4) holds none, and the target
    gets them from its server's backfill; a re-run then took every passage for changed and
    replaced them all (an HNSW insertion each), the matrices thrown away, and --verify-only
    failed on passage_tokens (exit 7): the only difference was what the target had made."""
    db = tmp_path / "relay.db"
    _populate(db)
    with sqlite3.connect(db) as conn:  # as such a file is: no table, no record of it
        conn.execute("DROP TABLE passage_tokens")
        conn.execute("DELETE FROM schema_migrations WHERE version = 4")
    first = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert first.exit_code == 0, first.output
    backfill = pg_store.missing_tokens(1000)  # what `relay serve` does on the target
    pg_store.store_tokens([(row[0], f"matrix {row[0]}".encode()) for row in backfill])
    made = raw_rows(pg_store, "SELECT passage_id, tokens FROM passage_tokens ORDER BY 1")
    assert len(made) == len(backfill) == raw_count(pg_store, "SELECT count(*) FROM passages")

    checked = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url, "--verify-only"])
    assert checked.exit_code == 0 and "verified: every table matches" in checked.output, (
        checked.output
    )
    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert again.exit_code == 0 and "verified: every table matches" in again.output, again.output
    assert raw_rows(pg_store, "SELECT passage_id, tokens FROM passage_tokens ORDER BY 1") == made


def test_a_store_not_opened_since_revisions_kept_pins_migrates_with_them_filled_in(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """QA: a file from before migration 8 (no server of this version opened it) was copied
    with every revision's pin null, where a server opening it fills in what it can. migrate
    still leaves its source as it is, and computes the same fill-in as it reads."""
    import shutil

    db = tmp_path / "relay.db"
    orgs = _populate(db)
    s = SQLiteStore(db)
    six = "Fact 6 about the acme deploy | second part 6"  # as _populate wrote it
    for pinned in (True, False, True):  # pin-only edits: revisions 2, 3 and 4
        draft = MemoryDraft(body=six, pinned=pinned)
        s.save_memory(orgs[0], "m6", draft, "alice", _passages(six, 6), "upsert")
    s.close()
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE memory_revisions DROP COLUMN pinned")
        conn.execute("DELETE FROM schema_migrations WHERE version = 8")
    conn.close()
    upgraded = tmp_path / "upgraded.db"
    shutil.copy(db, upgraded)
    before = db.read_bytes()
    result = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert result.exit_code == 0, result.output
    assert "verified: every table matches" in result.output
    assert db.read_bytes() == before  # read, never upgraded

    server = SQLiteStore(upgraded)  # what a server opening the file fills in: migration 8
    for org in orgs:
        for mid in [f"m{i}" for i in range(7)] + ["new"]:
            assert [r.pinned for r in pg_store.history(org, mid, None)] == [
                r.pinned for r in server.history(org, mid, None)
            ]
    server.close()
    assert [r.pinned for r in pg_store.history(orgs[0], "m6", None)] == [False, True, False, True]
    # m1's first two revisions differ from the next in text: not known, as on the server
    assert [r.pinned for r in pg_store.history(orgs[0], "m1", None)] == [None, None, True]


def test_a_rerun_brings_the_target_up_to_date(tmp_path: Path, pg_url: str, pg_store: PostgresStore):
    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    first = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert first.exit_code == 0, first.output

    # The SQLite server kept taking writes after the first copy.
    src = SQLiteStore(db)
    src.create_key(acme, "k0c", "hash-c", "ci 2", frozenset({"admin"}), frozenset(), None)
    src.revoke_key(acme, "k0b")  # not acme's last admin key now: that one is never revoked
    src.save_memory(
        acme, "m0", MemoryDraft(body="Fact 0, rewritten"), "bob", _passages("x", 20), "upsert"
    )
    src.delete_memory(acme, "m6", "bob", None)
    src.save_memory(
        acme, "late", MemoryDraft(body="Written after"), "bob", _passages("y", 21), "create"
    )
    newcomer = src.create_org("initech").id
    src.save_memory(newcomer, "n0", MemoryDraft(body="Hello"), "eve", _passages("z", 22), "create")
    src.close()

    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert again.exit_code == 0, again.output
    assert "verified: every table matches" in again.output

    key, _ = pg_store.key_for_auth("k0b")
    assert key.revoked_at is not None
    with pytest.raises(NotFoundError):
        pg_store.get_memory(acme, "m6", None)
    assert pg_store.get_memory(acme, "m0", None).body == "Fact 0, rewritten"
    assert pg_store.get_memory(acme, "late", None).body == "Written after"
    assert pg_store.get_memory(newcomer, "n0", None).body == "Hello"
    query = "SELECT count(*) FROM passages WHERE org_id = ? AND memory_id = 'm0'"
    assert raw_count(pg_store, query, (acme,)) == 1  # the old second passage is gone


def test_a_rerun_never_undoes_a_revocation_a_delete_or_an_edit_made_on_the_target(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """QA: after the switch, a replica revoked a leaked key, deleted a memory and edited
    another; running `relay migrate` again (as docs/deployment.md offers, to catch the
    source's late writes) made the key work again and brought the deleted memory back into
    recall at its old revision, its history still ending in the delete."""
    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    assert CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url]).exit_code == 0
    pg_store.create_key(acme, "k0c", "hash-c", "ci 2", frozenset({"admin"}), frozenset(), None)
    pg_store.revoke_key(acme, "k0b")
    pg_store.delete_memory(acme, "m0", "eve", None)
    body = "Fact 6, edited on PostgreSQL"
    pg_store.save_memory(acme, "m6", MemoryDraft(body=body), "eve", _passages(body, 40), "upsert")
    src = SQLiteStore(db)  # the source took a late write of its own meanwhile
    src.save_memory(
        acme, "m4", MemoryDraft(body="Fact 4, late"), "bob", _passages("w", 41), "upsert"
    )
    src.close()

    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert "the target differs" in str(again.exception), again.output
    assert "acme: 2 memories left as the target holds them" in again.output

    assert pg_store.key_for_auth("k0b")[0].revoked_at is not None
    with pytest.raises(NotFoundError):
        pg_store.get_memory(acme, "m0", None)
    assert [r.action for r in pg_store.history(acme, "m0", None)][-1] == "delete"
    now = datetime.now(UTC)
    assert "m0" not in {p.memory_id for p in _found(pg_store, acme, ["fact"], now)}
    assert (
        pg_store.get_memory(acme, "m6", None).body,
        pg_store.get_memory(acme, "m6", None).revision,
    ) == (body, 2)
    assert pg_store.get_memory(acme, "m4", None).body == "Fact 4, late"
    assert stored_totals(pg_store, acme) == recounted_totals(pg_store, acme)


def test_a_rerun_never_brings_back_a_memory_superseded_on_the_target(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """Superseding a memory does not move its revision, so a re-run copied the source's
    superseded_by (none) over the link a replica made: the replaced fact came back into
    recall beside its replacement. A link the source drops since (its replacement deleted
    there) is dropped on the target too."""
    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    assert CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url]).exit_code == 0
    body = "Fact 6, replaced on PostgreSQL"
    draft = MemoryDraft(body=body, supersedes=("m6",))
    pg_store.save_memory(acme, "repl", draft, "eve", _passages(body, 42), "create")
    src = SQLiteStore(db)
    src.delete_memory(acme, "new", "bob", None)  # `new` superseded m4: m4 is current again
    src.close()

    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert "the target differs" in str(again.exception), again.output
    assert pg_store.get_memory(acme, "m6", None).superseded_by == "repl"
    assert pg_store.get_memory(acme, "m4", None).superseded_by is None
    found = {p.memory_id for p in _found(pg_store, acme, ["fact"], datetime.now(UTC))}
    assert "m6" not in found and {"repl", "m4"} <= found


def test_a_rerun_onto_a_target_that_took_writes_keeps_its_totals_true(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
):
    """QA: run again onto a target that had served writes ("target differs"), migrate set
    the org's passage count to the source's, below what the target held; every later open
    then said its audience sets counted more passages than the org (blaming a replica) and
    counted them again, never the org's own count, so the repair never took."""
    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    assert CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url]).exit_code == 0
    body = "Served straight from PostgreSQL"
    pg_store.save_memory(
        acme, "served", MemoryDraft(body=body), "eve", _passages(body, 30), "create"
    )
    held = raw_count(pg_store, "SELECT count(*) FROM passages WHERE org_id = ?", (acme,))

    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert "the target differs" in str(again.exception), again.output
    total, df = pg_store.doc_freq(acme, ["serv", "fact"])
    assert (total, df["serv"]) == (held, 1)
    assert df["fact"] == raw_count(
        pg_store,
        "SELECT count(*) FROM passages WHERE org_id = ? AND lexical ~ '(^| )fact( |$)'",
        (acme,),
    )
    assert stored_totals(pg_store, acme) == recounted_totals(pg_store, acme)
    with caplog.at_level("WARNING", logger="relay.store.postgres"):
        PostgresStore(pg_url, pool_size=2).close()
    assert not [r for r in caplog.records if "counted again" in r.getMessage()]


def test_totals_an_earlier_migrate_left_wrong_are_mended_at_the_next_open(
    pg_url: str, pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
):
    """What an earlier `relay migrate` left (the org's count below its passages, the sets
    right) is counted again once, and then agrees: no warning at every start."""
    org = pg_store.create_org("acme").id
    for i in range(3):
        pg_store.save_memory(
            org, f"m{i}", MemoryDraft(body=f"fact {i}"), "t", _passages(f"fact {i}", i), "create"
        )
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:
        conn.execute("UPDATE orgs SET passage_count = 2 WHERE id = %s", (org,))
    with caplog.at_level("WARNING", logger="relay.store.postgres"):
        PostgresStore(pg_url, pool_size=2).close()
    said = [r.getMessage() for r in caplog.records if "counted again" in r.getMessage()]
    assert said == [
        f"org {org}: its passage totals disagreed (audience sets 3, org 2: left by older code,"
        " a replica's writes during an upgrade or an earlier relay migrate); counted again"
        " from its passages: 3"
    ]
    assert pg_store.doc_freq(org, ["fact"]) == (3, {"fact": 3})
    caplog.clear()
    with caplog.at_level("WARNING", logger="relay.store.postgres"):
        PostgresStore(pg_url, pool_size=2).close()
    assert not [r for r in caplog.records if "counted again" in r.getMessage()]


def test_a_rerun_rewrites_only_the_passages_that_changed(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    assert CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url]).exit_code == 0
    before = _passage_ids(pg_url)
    src = SQLiteStore(db)
    src.save_memory(
        acme, "m0", MemoryDraft(body="Fact 0, rewritten"), "bob", _passages("x", 20), "upsert"
    )
    src.close()

    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert again.exit_code == 0, again.output
    after = _passage_ids(pg_url)
    rewritten = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert rewritten == {(acme, "m0", 0), (acme, "m0", 1)}  # an edit to one passage, one gone


def _passage_ids(pg_url: str) -> dict[tuple[str, str, int], int]:
    """Every passage's id: a rewritten passage gets a new one."""
    with psycopg.connect(parse_url(pg_url).conninfo) as owner:
        rows = owner.execute("SELECT org_id, memory_id, seq, id FROM passages").fetchall()
    return {(o, m, s): i for o, m, s, i in rows}


def test_a_resumed_migration_ends_with_the_vector_index(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
):
    db = tmp_path / "relay.db"
    _populate(db)
    real, calls = Migration._copy_batch, []

    def killed_midway(self, conn, org, ids):  # noqa: ANN001, ANN202
        calls.append(ids)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if the operator pressed Ctrl-C mid-batch
        return real(self, conn, org, ids)

    monkeypatch.setattr(Migration, "_copy_batch", killed_midway)
    args = ["--from", str(db), "--to", pg_url, "--batch", "3"]
    interrupted = CliRunner().invoke(migrate, [*args, "--defer-index"])
    assert interrupted.exit_code != 0
    assert _vector_index_oid(pg_store) is None  # dropped for the bulk load, not yet rebuilt

    monkeypatch.setattr(Migration, "_copy_batch", real)
    resumed = CliRunner().invoke(migrate, args)  # without --defer-index
    assert resumed.exit_code == 0, resumed.output
    assert _vector_index_oid(pg_store) is not None


def test_a_rerun_with_defer_index_keeps_a_live_index(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    db = tmp_path / "relay.db"
    _populate(db)
    args = ["--from", str(db), "--to", pg_url, "--defer-index"]
    assert CliRunner().invoke(migrate, args).exit_code == 0
    built = _vector_index_oid(pg_store)
    again = CliRunner().invoke(migrate, args)
    assert again.exit_code == 0, again.output
    assert "keeping the vector index" in again.output
    assert _vector_index_oid(pg_store) == built  # the same index, never dropped meanwhile


def _vector_index_oid(store: PostgresStore) -> int | None:
    with store._tx() as conn:
        return conn.execute("SELECT to_regclass('passages_embedding')::oid AS oid").fetchone()[
            "oid"
        ]


@pytest.mark.parametrize(
    ("content", "why"),
    [("hello\n", "file is not a database"), ("", "tables missing: orgs, api_keys, memories")],
)
def test_a_source_that_is_no_relay_store_is_said_in_one_line(
    tmp_path: Path, pg_url: str, content: str, why: str
):
    db = tmp_path / "x.db"
    db.write_text(content)  # empty: a valid SQLite database without Relay's tables
    done = relay(tmp_path, "migrate", "--from", str(db), "--to", pg_url)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"relay: error: {db} is not a Relay SQLite store ({why}")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_an_org_name_the_target_already_uses_stops_the_migration_before_it_writes(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    db = tmp_path / "relay.db"
    _populate(db)
    sqlite_default = SQLiteStore(db)
    sqlite_default.create_org("default")
    sqlite_default.close()
    pg_store.create_org("default")  # what `relay serve` does on its first start

    result = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert isinstance(result.exception, InvalidRequestError), result.output
    assert "'default'" in result.exception.message
    assert "migrate into an empty database" in result.exception.message
    assert [o.name for o in pg_store.list_orgs()] == ["default"]  # nothing copied


def _found(store, org, terms, now):  # noqa: ANN001, ANN202
    rowids = [r for r, _ in store.lexical_search(org, EVERY, now, terms, 50)]
    return store.passages(org, EVERY, now, rowids)


def test_an_interrupted_migration_resumes(tmp_path: Path, pg_url: str, pg_store: PostgresStore):
    db = tmp_path / "relay.db"
    _populate(db)
    src = open_source(str(db))
    calls = 0
    real = Migration._copy_batch

    def flaky(self, conn, org, ids):  # noqa: ANN001, ANN202
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt  # as if the operator pressed Ctrl-C mid-batch
        return real(self, conn, org, ids)

    first = Migration(src, pg_store, "src", batch=3)
    first._copy_batch = flaky.__get__(first)  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert any(a != b for _, a, b in verify(src, pg_store))

    copied: list[list[str]] = []
    second = Migration(src, pg_store, "src", batch=3)
    second._copy_batch = lambda conn, org, ids: (copied.append(ids), real(second, conn, org, ids))[
        1
    ]  # type: ignore[method-assign]
    second.run()
    assert copied[0] == ["m6", "new"]  # resumed after the two committed batches
    assert all(a == b for _, a, b in verify(src, pg_store))
    src.close()


def test_token_matrices_follow_their_passages_new_ids(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    db = tmp_path / "relay.db"
    orgs = _populate(db)
    with sqlite3.connect(db) as conn:  # first parts get a matrix, second parts wait for one
        conn.execute(
            "CREATE TABLE IF NOT EXISTS passage_tokens (rowid INTEGER PRIMARY KEY"
            " REFERENCES passages(rowid) ON DELETE CASCADE, tokens BLOB NOT NULL)"
        )
        rows = conn.execute("SELECT rowid, org_id, memory_id, seq, text FROM passages").fetchall()
        conn.executemany(
            "INSERT INTO passage_tokens (rowid, tokens) VALUES (?, ?)",
            [(r[0], _matrix(r[1], r[2])) for r in rows if r[3] == 0],
        )
    conn.close()
    result = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url, "--batch", "3"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("passage_tokens"))
    with_matrix = sum(r[3] == 0 for r in rows)
    assert line.split()[1:3] == [str(with_matrix)] * 2 and line.endswith("ok")

    for org in orgs:
        with pg_store._tx(org) as c:
            got = {
                (r["memory_id"], r["seq"]): bytes(r["tokens"])
                for r in c.execute(
                    "SELECT p.memory_id, p.seq, t.tokens FROM passage_tokens t"
                    " JOIN passages p ON p.id = t.passage_id"
                )
            }
        assert got == {(r[2], 0): _matrix(org, r[2]) for r in rows if r[1] == org and r[3] == 0}
    waiting = sorted(text for _, _, text in pg_store.missing_tokens(100))
    assert waiting == sorted(r[4] for r in rows if r[3] != 0)

    # The checksum sees a matrix that differs.
    with psycopg.connect(pg_store.conninfo, autocommit=True) as owner:
        owner.execute(
            "UPDATE passage_tokens SET tokens = '\\x00' WHERE passage_id IN"
            " (SELECT min(passage_id) FROM passage_tokens)"
        )
    check = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url, "--verify-only"])
    assert check.exit_code != 0 and "DIFFERS" in check.output


def _matrix(org: str, memory_id: str) -> bytes:
    return hashlib.sha256(f"{org}/{memory_id}".encode()).digest() * 4  # one int8 row of 128


def test_each_audience_sets_passages_are_counted_on_the_target(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """Search sums a reader's passage total from `audience_totals`: the copy must leave it
    equal to a count of what it copied, from a source written before the table (SQLite
    migration 5) too, and after a rerun that moved memories to other audiences."""
    db = tmp_path / "relay.db"
    orgs = _populate(db)
    with sqlite3.connect(db) as conn:  # as a store from before migration 5 is
        conn.execute("DROP TABLE audience_totals")
        conn.execute("DELETE FROM schema_migrations WHERE version = 5")
    conn.close()
    result = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("audience_totals"))
    assert line.split()[1:3] == ["4", "4"] and line.endswith("ok")  # all and sre, per org
    expected = {("all",): 10, ("sre",): 1}
    for org in orgs:
        assert stored_totals(pg_store, org) == recounted_totals(pg_store, org) == expected

    src = SQLiteStore(db)  # upgraded: counts its own
    acme = orgs[0]
    assert stored_totals(src, acme) == expected
    src.save_memory(
        acme,
        "m2",
        MemoryDraft(body="Now for devs", audiences=("dev", "sre")),
        "bob",
        _passages("Now for devs | too", 23),
        "upsert",
    )
    src.delete_memory(acme, "m0", "bob", None)
    src.close()
    again = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert again.exit_code == 0 and "verified: every table matches" in again.output, again.output
    assert stored_totals(pg_store, acme) == {("all",): 8, ("dev", "sre"): 2}


def test_a_source_time_stored_past_year_9999_is_copied_as_the_latest_time(
    tmp_path: Path, pg_url: str, pg_store: PostgresStore
):
    """QA: a SQLite time stored rounded up to year 10000 ("9999-12-31T23:59:59.9999999Z",
    once taken) stopped `relay migrate` with "year 10000 is out of range"."""
    from relay.hygiene import LATEST_TIME

    db = tmp_path / "relay.db"
    acme, _ = _populate(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE api_keys SET expires_at = 253402300800.0 WHERE id = 'k0b'")
        conn.execute("UPDATE memories SET valid_until = 253402300800.0 WHERE id = 'm0'")
        conn.execute("UPDATE memory_revisions SET valid_until = 253402300800.0 WHERE id = 'm0'")
    conn.close()
    result = CliRunner().invoke(migrate, ["--from", str(db), "--to", pg_url])
    assert result.exit_code == 0 and "verified: every table matches" in result.output, result.output
    assert pg_store.key_for_auth("k0b")[0].expires_at == LATEST_TIME
    assert pg_store.get_memory(acme, "m0", None).valid_until == LATEST_TIME
