"""The Store contract, on both stores: revisions, tombstones, supersession, errors, generation.

Vectors are synthetic (seeded), so these tests need no model and pin the
store's behaviour alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from relay.errors import ConflictError, InvalidRequestError, NotFoundError
from relay.models import MemoryDraft, PassageInput
from relay.text import lexical_terms

EVERY = frozenset({"all"})


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=384).astype("<f4")
    return v / np.linalg.norm(v)


def passages(text: str, seed: int = 0) -> list[PassageInput]:
    lexical = " ".join(lexical_terms(text))
    return [PassageInput(0, text, lexical, f"h{seed}", vec(seed).tobytes())]


def save(store, org, mid, body, mode="upsert", seed=0, **fields):  # noqa: ANN001, ANN201
    draft = MemoryDraft(body=body, **fields)
    return store.save_memory(org, mid, draft, "tester", passages(body, seed), mode)


def test_revisions_and_tombstones(store):
    org = store.create_org("acme").id
    m, changed = save(store, org, "m1", "Staging is the blue cluster", "create")
    assert (m.revision, changed) == (1, True)
    same, changed = save(store, org, "m1", "Staging is the blue cluster")
    assert (same.revision, changed) == (1, False)
    m, _ = save(store, org, "m1", "Staging is the green cluster", "edit")
    assert m.revision == 2 and m.created_at < m.updated_at
    with pytest.raises(ConflictError):
        save(store, org, "m1", "again", "create")
    with pytest.raises(NotFoundError):
        save(store, org, "nope", "x", "edit")
    with pytest.raises(ConflictError):
        store.save_memory(
            org, "m1", MemoryDraft(body="x"), "t", passages("x"), "edit", expected_revision=1
        )
    store.delete_memory(org, "m1", "tester", None)
    history = store.history(org, "m1", None)
    assert [(r.revision, r.action) for r in history] == [(1, "create"), (2, "edit"), (3, "delete")]
    assert all(r.body is None and r.title is None for r in history)
    with pytest.raises(NotFoundError):
        store.get_memory(org, "m1", None)
    with pytest.raises(ConflictError):
        save(store, org, "m1", "reuse", "create")
    assert store.doc_freq(org, ["stag", "cluster"]) == (0, {})


def test_supersession_hides_the_old_memory_until_the_new_one_goes(store):
    org = store.create_org("acme").id
    now = datetime.now(UTC)
    save(store, org, "old", "Deploys go out on Tuesdays", seed=1)
    with pytest.raises(InvalidRequestError):
        save(store, org, "new", "x", supersedes=("missing",))
    with pytest.raises(InvalidRequestError):
        save(store, org, "self", "x", supersedes=("self",))
    save(store, org, "new", "Deploys go out on Thursdays", seed=2, supersedes=("old",))
    assert store.current_memory(org, "old").superseded_by == "new"
    hits = store.lexical_search(org, EVERY, now, ["deploy"], 10)
    assert [p.memory_id for p in store.passages(org, EVERY, now, [r for r, _ in hits])] == ["new"]
    store.delete_memory(org, "new", "tester", None)
    assert store.current_memory(org, "old").superseded_by is None
    hits = store.semantic_search(org, EVERY, now, vec(1), 5)
    assert [p.memory_id for p in store.passages(org, EVERY, now, [r for r, _ in hits])] == ["old"]


def test_recall_filters_audience_and_expiry(store):
    org = store.create_org("acme").id
    now = datetime.now(UTC)
    save(store, org, "sre", "The pager rotation lives in the ops wiki", seed=3, audiences=("sre",))
    save(
        store,
        org,
        "soon",
        "The pager freeze ends Friday",
        seed=4,
        valid_until=now + timedelta(seconds=30),
    )
    dev = frozenset({"dev", "all"})
    ops = frozenset({"sre", "all"})
    assert {r for r, _ in store.lexical_search(org, dev, now, ["pager"], 10)} == {2}
    assert len(store.lexical_search(org, ops, now, ["pager"], 10)) == 2
    later = now + timedelta(minutes=1)
    assert store.lexical_search(org, dev, later, ["pager"], 10) == []
    assert [r for r, _ in store.semantic_search(org, ops, later, vec(3), 5)] == [1]
    assert store.next_expiry(org, now) == store.current_memory(org, "soon").valid_until
    with pytest.raises(NotFoundError):  # invisible to this reader: as if absent
        store.get_memory(org, "sre", dev)
    assert store.get_memory(org, "sre", ops).id == "sre"


def test_every_change_bumps_the_generation_and_only_the_orgs_own(store):
    a, b = store.create_org("acme").id, store.create_org("globex").id
    seen = [store.generation(a)]

    def moved() -> bool:
        seen.append(store.generation(a))
        return seen[-1] > seen[-2]

    store.create_key(a, "k1", "h", "n", frozenset({"memory:read"}), frozenset({"dev"}), None)
    assert moved()
    save(store, a, "m1", "one")
    assert moved()
    save(store, a, "m1", "one")  # unchanged: nothing to invalidate
    assert not moved()
    store.delete_memory(a, "m1", "t", None)
    assert moved()
    store.revoke_key(a, "k1")
    assert moved()
    assert store.generation(b) == 0
    assert store.generation("org_missing") == -1


def test_tenants_never_see_each_other(store):
    a, b = store.create_org("acme").id, store.create_org("globex").id
    now = datetime.now(UTC)
    save(store, a, "m1", "Acme deploys with Argo", seed=5)
    assert store.lexical_search(b, EVERY, now, ["argo"], 10) == []
    assert store.semantic_search(b, EVERY, now, vec(5), 5) == []
    assert store.passages(b, EVERY, now, [1]) == []
    assert store.list_memories(b, None, 10) == ([], None)
    with pytest.raises(NotFoundError):
        store.get_memory(b, "m1", None)
    with pytest.raises(NotFoundError):
        store.delete_memory(b, "m1", "t", None)
    store.create_key(a, "ka", "h", "n", frozenset({"admin"}), frozenset(), None)
    with pytest.raises(NotFoundError):
        store.revoke_key(b, "ka")
    assert store.list_keys(b) == []
    assert store.key_for_auth("ka")[0].org_id == a


def test_orgs_keys_and_cache(store):
    org = store.create_org("acme")
    with pytest.raises(ConflictError):
        store.create_org("acme")
    with pytest.raises(InvalidRequestError):
        store.create_org("  ")
    assert store.find_org("acme") == org and store.find_org(org.id) == org
    assert store.find_org("nobody") is None
    assert [o.id for o in store.list_orgs()] == [org.id]
    with pytest.raises(NotFoundError):
        store.create_key("org_missing", "k", "h", "n", frozenset({"admin"}), frozenset(), None)
    store.create_key(org.id, "k1", "h", "n", frozenset({"memory:read"}), frozenset({"dev"}), None)
    key, secret_hash = store.key_for_auth("k1")
    assert (key.roles, secret_hash) == (frozenset({"dev"}), "h")
    assert store.known_audiences(org.id) == {"dev"}
    assert store.revoke_key(org.id, "k1").revoked_at is not None
    assert store.known_audiences(org.id) == set()
    assert store.key_for_auth("missing") is None
    store.cache_embeddings("model", {"a": b"\x01\x02"})
    store.cache_embeddings("model", {"a": b"\x09"})  # first write wins
    assert store.cached_embeddings("model", ["a", "b"]) == {"a": b"\x01\x02"}


def test_listing_pages_and_filters(store):
    org = store.create_org("acme").id
    for i in range(5):
        save(store, org, f"m{i}", f"fact {i}", source=f"s{i % 2}", tags=(f"t{i % 3}",))
    page, cursor = store.list_memories(org, None, 2)
    assert [m.id for m in page] == ["m0", "m1"] and cursor == "m1"
    page, cursor = store.list_memories(org, None, 10, cursor=cursor)
    assert [m.id for m in page] == ["m2", "m3", "m4"] and cursor is None
    assert [m.id for m in store.list_memories(org, None, 10, source="s1")[0]] == ["m1", "m3"]
    assert [m.id for m in store.list_memories(org, None, 10, tag="t0")[0]] == ["m0", "m3"]
    save(store, org, "pin", "pinned fact", pinned=True)
    assert [m.id for m in store.pinned(org, EVERY, datetime.now(UTC))] == ["pin"]


def test_batch_writes_are_all_or_nothing(store):
    org = store.create_org("acme").id
    items = [
        ("a", MemoryDraft(body="first"), passages("first")),
        ("b", MemoryDraft(body="second", supersedes=("nope",)), passages("second")),
    ]
    with pytest.raises(InvalidRequestError):
        store.save_memories(org, items, "t", "upsert")
    assert store.list_memories(org, None, 10) == ([], None)
    saved = store.save_memories(org, items[:1], "t", "upsert")
    assert [(m.id, changed) for m, changed in saved] == [("a", True)]
    assert store.doc_freq(org, ["first"]) == (1, {"first": 1})


def test_a_batch_creates_edits_and_skips_like_single_writes(store):
    org = store.create_org("acme").id
    save(store, org, "a", "alpha fact", seed=1)
    save(store, org, "b", "beta fact", seed=2, supersedes=("a",))
    items = [
        ("a", MemoryDraft(body="alpha fact"), passages("alpha fact", 1)),  # unchanged
        ("b", MemoryDraft(body="beta fact, edited"), passages("beta fact, edited", 3)),
        ("c", MemoryDraft(body="gamma fact", audiences=("sre",)), passages("gamma fact", 4)),
    ]
    before = store.generation(org)
    saved = store.save_memories(org, items, "t", "upsert")
    assert [(m.id, m.revision, changed) for m, changed in saved] == [
        ("a", 1, False),
        ("b", 2, True),
        ("c", 1, True),
    ]
    assert store.generation(org) > before
    # b no longer supersedes a: a is back in recall.
    assert store.current_memory(org, "a").superseded_by is None
    assert store.doc_freq(org, ["fact", "gamma", "beta"]) == (3, {"fact": 3, "gamma": 1, "beta": 1})
    assert [r.action for r in store.history(org, "b", None)] == ["create", "edit"]
    assert store.get_memory(org, "c", frozenset({"sre", "all"})).audiences == ("sre",)
    with pytest.raises(ConflictError):
        store.save_memories(org, items[1:], "t", "create")
    with pytest.raises(NotFoundError):
        store.save_memories(
            org, [items[0], ("zz", MemoryDraft(body="z"), passages("z"))], "t", "edit"
        )
