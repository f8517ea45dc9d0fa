"""The embedded store's vector index: the 8-bit shortlist must not change the answer."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import numpy as np
import pytest

from relay.models import MemoryDraft
from relay.store import vector_index
from relay.store.sqlite import SQLiteStore
from relay.store.vector_index import DIM, QUANTIZE_FROM, STALE_FROM, OrgVectors, VectorIndex
from relay.writes import save, save_many

NOW = 1_800_000_000.0
Row = tuple[int, bytes, float | None, str]


def clustered_rows(
    n: int, seed: int = 7
) -> tuple[np.ndarray, list[tuple[int, bytes, float | None, str]]]:
    """Unit vectors around a few hundred topics, like a team's memories; mixed audiences
    and expiry so the access mask matters."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((300, DIM)).astype(np.float32)
    matrix = topics[rng.integers(0, 300, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(
        np.float32
    )
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    rows = []
    for i, vec in enumerate(matrix):
        audiences = "everyone" if i % 3 else "backend"
        until = NOW - 60 if i % 11 == 0 else (NOW + 3600 if i % 2 else None)
        rows.append((1000 + i, vec.tobytes(), until, audiences))
    return matrix, rows


def exact_top(matrix, rows, query, audiences, limit):  # noqa: ANN001, ANN201
    visible = [
        i
        for i, (_, _, until, aud) in enumerate(rows)
        if (until is None or until > NOW) and set(aud.split(",")) & audiences
    ]
    scores = matrix[visible] @ query
    order = np.argsort(-scores, kind="stable")[:limit]
    return [(rows[visible[i]][0], float(scores[i])) for i in order]


@pytest.mark.parametrize("audiences", [frozenset({"everyone"}), frozenset({"everyone", "backend"})])
def test_quantized_shortlist_returns_the_exact_top_results(audiences: frozenset[str]) -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM * 2)
    index = OrgVectors.build(1, rows)
    assert index.quantized is not None
    rng = np.random.default_rng(11)
    for probe in rng.integers(0, len(rows), 50):
        query = matrix[probe] + 0.3 * rng.standard_normal(DIM).astype(np.float32)
        query /= np.linalg.norm(query)
        got = index.search(query, audiences, NOW, 40)
        want = exact_top(matrix, rows, query, audiences, 40)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
        assert {r for r, _ in got} == {r for r, _ in want}


def test_masked_rows_never_come_back_from_either_path() -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM + 10)
    small = OrgVectors.build(1, rows[:500])
    large = OrgVectors.build(1, rows)
    assert small.quantized is None and large.quantized is not None
    hidden = {
        r for r, _, until, aud in rows if aud == "backend" or (until is not None and until <= NOW)
    }
    for index in (small, large):
        for probe in range(0, 400, 7):
            hits = index.search(matrix[probe], frozenset({"everyone"}), NOW, 40)
            assert hits and not hidden & {r for r, _ in hits}
            assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_fewer_visible_rows_than_asked_for() -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM)
    rows = [(r, b, u, "everyone" if i < 5 else "backend") for i, (r, b, u, _) in enumerate(rows)]
    index = OrgVectors.build(1, rows)
    hits = index.search(matrix[0], frozenset({"everyone"}), NOW, 40)
    assert {r for r, _ in hits} == {r for r, _, u, a in rows[:5] if u is None or u > NOW}


def test_a_large_out_of_date_index_answers_while_it_is_rebuilt() -> None:
    matrix, rows = clustered_rows(STALE_FROM)
    index = VectorIndex()
    first = index.get("acme", 1, lambda: rows)
    release = threading.Event()
    loads: list[int] = []

    def slow_load() -> list[Row]:
        loads.append(1)
        release.wait(10)
        return rows[:-1]

    # The write that moved the generation on does not stall searches behind the rebuild.
    assert index.get("acme", 2, slow_load) is first
    assert index.get("acme", 2, slow_load) is first
    release.set()
    deadline = time.monotonic() + 10
    while index.get("acme", 2, slow_load).generation != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    fresh = index.get("acme", 2, slow_load)
    assert fresh.generation == 2 and len(fresh.rowids) == len(rows) - 1
    assert loads == [1]  # one rebuild, however many searches asked meanwhile


def test_a_small_out_of_date_index_is_rebuilt_before_it_answers() -> None:
    _, rows = clustered_rows(50)
    index = VectorIndex()
    index.get("acme", 1, lambda: rows)
    assert len(index.get("acme", 2, lambda: rows[:10]).rowids) == 10


def test_the_store_rescores_what_an_out_of_date_index_proposes(tmp_path, embedder, monkeypatch):  # noqa: ANN001
    """Served stale, the vector stage never proposes a deleted passage, and a passage
    rewritten under a reused rowid is scored by its new text."""
    monkeypatch.setattr(vector_index, "STALE_FROM", 1)  # treat this small org as a large one
    store = SQLiteStore(tmp_path / "relay.db")
    org = store.create_org("acme")
    bodies = {
        "m0": "Staging is the blue cluster; production is the green cluster.",
        "m1": "Database migrations run in a separate backfill job.",
        "m2": "Use pnpm, not npm or yarn, for the web app.",
    }
    save_many(store, embedder, org.id, [(k, MemoryDraft(body=b)) for k, b in bodies.items()], "t")
    now = datetime.now(UTC)
    query = embedder.embed_query("where do the database migrations run?")
    before = dict(store.semantic_search(org.id, frozenset(), now, query, 10))

    store.delete_memory(org.id, "m1", "t", None)
    lunch = MemoryDraft(body="Lunch is at noon on Fridays.")
    save(store, embedder, org.id, "m2", lunch, "t", "upsert")
    stale = dict(store.semantic_search(org.id, frozenset(), now, query, 10))

    passages = {p.rowid: p for p in store.passages(org.id, frozenset(), now, list(stale))}
    assert sorted(p.memory_id for p in passages.values()) == ["m0", "m2"]
    assert len(stale) == 2  # m1's passage is gone, not proposed
    (reused,) = [r for r, p in passages.items() if p.memory_id == "m2"]
    assert reused in before  # SQLite handed a rowid of the old index out again
    now_vector = np.frombuffer(passages[reused].embedding, dtype="<f4")
    assert stale[reused] == pytest.approx(float(now_vector @ query), abs=1e-6)
    assert abs(stale[reused] - before[reused]) > 0.2  # not the old passage's score
    store.close()


def test_over_its_memory_budget_the_least_recently_searched_org_goes_first() -> None:
    _, rows = clustered_rows(200)
    one_org = OrgVectors.build(1, rows).nbytes()
    index = VectorIndex(max_bytes=int(2.5 * one_org))
    for org in ("a", "b"):
        index.get(org, 1, lambda: rows)
    index.get("a", 1, lambda: rows)  # "a" searched again: "b" is now the oldest
    index.get("c", 1, lambda: rows)
    assert "a" in index and "c" in index and "b" not in index
    assert index.nbytes() <= 2.5 * one_org
    reloads: list[int] = []
    index.get("b", 1, lambda: reloads.append(1) or rows)  # dropped orgs reload on demand
    assert reloads == [1] and "b" in index


def test_an_org_that_does_not_fit_is_refused_until_another_goes_idle() -> None:
    _, rows = clustered_rows(200)
    one_org = OrgVectors.build(1, rows).nbytes()
    index = VectorIndex(max_bytes=int(1.5 * one_org))
    assert index.admit("a", one_org, idle_s=60)
    index.get("a", 1, lambda: rows)
    # "a" was searched just now: "b" is refused rather than evicting it (the store searches
    # "b" in its database), so two orgs taking turns never reload on every search.
    assert not index.admit("b", one_org, idle_s=60)
    assert "a" in index and index.admit("a", one_org, idle_s=60)
    assert index.admit("b", one_org, idle_s=0.0)  # "a" counts as idle now: it makes room
    assert "a" not in index


def test_warming_waits_for_current_vectors_instead_of_answering_from_old_ones(
    tmp_path, embedder, monkeypatch
):  # noqa: ANN001
    """A benchmark that grows its database, or a server warming up, must see the new rows."""
    monkeypatch.setattr(vector_index, "STALE_FROM", 1)  # every org counts as large
    store = SQLiteStore(tmp_path / "relay.db")
    org = store.create_org("acme")
    save_many(store, embedder, org.id, [("m0", MemoryDraft(body="Staging is blue."))], "t")
    now = datetime.now(UTC)
    query = embedder.embed_query("which package manager?")
    assert len(store.semantic_search(org.id, frozenset(), now, query, 10)) == 1
    save_many(store, embedder, org.id, [("m1", MemoryDraft(body="Use pnpm, not npm."))], "t")
    store.warm()
    hits = store.semantic_search(org.id, frozenset(), now, query, 10)
    assert len(hits) == 2  # the memory written after the first search is there at once
    store.close()
