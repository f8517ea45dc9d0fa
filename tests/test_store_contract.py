"""The Store contract, on both stores: revisions, tombstones, supersession, errors, generation.

Vectors are synthetic (seeded), so these tests need no model and pin the
store's behaviour alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from postgres_support import execute_beneath, raw_rows, recounted_totals, stored_totals

from relay.errors import ConflictError, InvalidRequestError, NotFoundError
from relay.models import MemoryDraft, PassageInput, iso
from relay.store.listing import ListFilter, ListPosition
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


def test_passages_say_how_many_their_memory_has(store):
    """A search hit carries its memory's passage count (`Hit.passages`), of the revision read."""
    org = store.create_org("acme").id
    texts = ["Deploys go through the release train.", "Hotfixes skip it.", "Tag every release."]

    def parts(texts: list[str], seed: int) -> list[PassageInput]:
        return [
            PassageInput(i, t, " ".join(lexical_terms(t)), f"h{seed}-{i}", vec(seed + i).tobytes())
            for i, t in enumerate(texts)
        ]

    store.save_memory(
        org, "long", MemoryDraft(body=" ".join(texts)), "t", parts(texts, 0), "create"
    )
    save(store, org, "short", "Staging is the blue cluster", "create", seed=9)
    now = datetime.now(UTC)
    words = lexical_terms("train hotfixes tag staging")
    hits = store.lexical_search(org, EVERY, now, words, 10)
    got = store.passages(org, EVERY, now, [r for r, _ in hits])
    assert sorted((p.memory_id, p.seq, p.passage_count) for p in got) == [
        ("long", 0, 3),
        ("long", 1, 3),
        ("long", 2, 3),
        ("short", 0, 1),
    ]
    edited = texts[:2]
    store.save_memory(
        org, "long", MemoryDraft(body=" ".join(edited)), "t", parts(edited, 5), "edit"
    )
    hits = store.lexical_search(org, EVERY, now, words, 10)
    got = store.passages(org, EVERY, now, [r for r, _ in hits])
    assert {(p.memory_id, p.revision, p.passage_count) for p in got if p.memory_id == "long"} == {
        ("long", 2, 2)
    }


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


def test_deleted_memories_are_counted_by_source_within_the_org_and_audiences(store):
    """`relay import docs` of a folder gone, whose memories an earlier import retired, asks
    how many deleted memories came from it: only tombstones, of this org, by the audiences
    of their last revision, and a prefix is not a file's source (docs/ is not docs.md)."""
    org, other = store.create_org("acme").id, store.create_org("globex").id
    for mid, source, audiences in (
        ("a", "r/docs/a.md", ("all",)),
        ("b", "r/docs/b.md", ("sre",)),
        ("c", "r/docs.md", ("all",)),
        ("live", "r/docs/live.md", ("all",)),
    ):
        save(store, org, mid, f"fact {mid}", source=source, audiences=audiences)
        if mid != "live":
            store.delete_memory(org, mid, "tester", None)
    save(store, other, "a", "fact a", source="r/docs/a.md")
    store.delete_memory(other, "a", "tester", None)
    assert store.deleted_count(org, None, source_prefix="r/docs/") == 2
    assert store.deleted_count(org, EVERY, source_prefix="r/docs/") == 1
    assert store.deleted_count(org, frozenset({"sre"}), source_prefix="r/docs/") == 2
    assert store.deleted_count(org, None, source="r/docs.md") == 1
    assert store.deleted_count(org, None, source="r/dcos") == 0


def test_a_delete_at_a_revision_leaves_a_memory_edited_since(store):
    """`expected_revision` on a delete is judged inside its transaction, as on a write:
    a memory at another revision keeps its text, passages and history."""
    org = store.create_org("acme").id
    save(store, org, "m1", "Staging is the blue cluster", "create")
    save(store, org, "m1", "Staging is the green cluster", "edit")
    with pytest.raises(ConflictError) as stale:
        store.delete_memory(org, "m1", "tester", None, expected_revision=1)
    assert stale.value.message == "memory 'm1' is at revision 2, not 1"
    assert stale.value.details == {"memory_id": "m1", "revision": 2}
    assert store.get_memory(org, "m1", None).body == "Staging is the green cluster"
    assert [r.action for r in store.history(org, "m1", None)] == ["create", "edit"]
    assert store.doc_freq(org, ["green"]) == (1, {"green": 1})
    store.delete_memory(org, "m1", "tester", None, expected_revision=2)
    assert [r.action for r in store.history(org, "m1", None)] == ["create", "edit", "delete"]
    with pytest.raises(NotFoundError):
        store.delete_memory(org, "m1", "tester", None, expected_revision=3)


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


def test_superseding_a_deleted_memory_says_it_was_deleted(store):
    """QA: naming a memory deleted since (`relay forget X`, then `relay remember ...
    --supersedes X`) said X 'is not a memory of this organisation', though the key reads
    X's history. A deleted memory the writer may read is named as deleted, when and at
    which revision; one it may not read is still answered like an id never used."""
    org = store.create_org("acme").id
    save(store, org, "old", "Deploys go out on Tuesdays", "create", seed=1)
    save(store, org, "old", "Deploys go out on Wednesdays", "edit", seed=2)
    save(store, org, "ops", "Pages go to the ops rota", "create", seed=3, audiences=("ops",))
    store.delete_memory(org, "old", "tester", None)
    store.delete_memory(org, "ops", "tester", None)
    tombstone = store.history(org, "old", None)[-1]
    assert (tombstone.revision, tombstone.action) == (3, "delete")
    for writer in (None, frozenset({"dev"})):
        with pytest.raises(InvalidRequestError) as refused:
            store.save_memory(
                org,
                "new",
                MemoryDraft(body="Deploys go out on Thursdays", supersedes=("old",)),
                "t",
                passages("new", 4),
                "create",
                audiences=writer,
            )
        assert refused.value.message == (
            f"supersedes names 'old', which was deleted at {iso(tombstone.recorded_at)}"
            " (revision 3): recall no longer returns it, so there is nothing to supersede;"
            " leave it out"
        )
    for target in ("never", "ops"):  # for a dev key, a deleted ops memory is never named
        with pytest.raises(InvalidRequestError) as refused:
            store.save_memory(
                org,
                "new",
                MemoryDraft(body="Deploys go out on Thursdays", supersedes=(target,)),
                "t",
                passages("new", 4),
                "create",
                audiences=frozenset({"dev"}),
            )
        assert refused.value.message == (
            f"supersedes names {target!r}, which is not a memory of this organisation"
        )
    with pytest.raises(NotFoundError):
        store.get_memory(org, "new", None)


def test_a_memory_two_others_supersede_stays_hidden_until_neither_does(store):
    org = store.create_org("acme").id
    now = datetime.now(UTC)
    save(store, org, "old", "Deploys go out on Tuesdays", seed=1)
    save(store, org, "first", "Deploys go out on Thursdays", seed=2, supersedes=("old",))
    save(store, org, "second", "Deploys go out on Fridays", seed=3, supersedes=("old",))
    assert store.current_memory(org, "old").superseded_by == "second"

    def recalled() -> list[str]:
        hits = store.lexical_search(org, EVERY, now, ["deploy"], 10)
        return sorted(p.memory_id for p in store.passages(org, EVERY, now, [r for r, _ in hits]))

    store.delete_memory(org, "second", "tester", None)
    assert store.current_memory(org, "old").superseded_by == "first"
    assert recalled() == ["first"]
    save(store, org, "third", "Deploys go out on Mondays", seed=4, supersedes=("old",))
    save(store, org, "third", "Deploys go out on Mondays at nine", "edit", seed=5)
    assert store.current_memory(org, "old").superseded_by == "first"
    assert recalled() == ["first", "third"]
    save(store, org, "first", "Deploys go out on Thursdays", "edit", seed=2)
    assert store.current_memory(org, "old").superseded_by is None
    assert recalled() == ["first", "old", "third"]


def test_a_superseded_memory_gains_no_audience_any_of_its_replacements_lacks(store):
    """QA: 'old' (dev) was superseded by 'narrow' (dev), then by 'wide' (dev, sre), and
    only the latest, 'wide', was judged when 'old' was opened to sre. Once 'wide' went, sre
    readers held 'old' as current (its superseded_by null to them) while recall never
    showed it, nor 'narrow', which they cannot read. Every live replacement is judged."""
    org = store.create_org("acme").id
    save(store, org, "old", "Builds cache for five minutes", seed=1, audiences=("dev",))
    for mid, body, seed, audiences in (
        ("narrow", "Builds cache for ten minutes", 2, ("dev",)),
        ("wide", "Builds cache for an hour", 3, ("dev", "sre")),
    ):
        save(store, org, mid, body, seed=seed, audiences=audiences, supersedes=("old",))
    assert store.current_memory(org, "old").superseded_by == "wide"
    widen = {"audiences": ("dev", "sre")}
    with pytest.raises(InvalidRequestError, match="'narrow' supersedes this memory and does not"):
        save(store, org, "old", "Builds cache for five minutes", "edit", seed=1, **widen)
    store.delete_memory(org, "wide", "tester", None)
    assert store.current_memory(org, "old").audiences == ("dev",)


def _recalled(store, org, words, audiences=EVERY) -> list[str]:  # noqa: ANN001
    now = datetime.now(UTC)
    hits = store.lexical_search(org, audiences, now, words, 10)
    return sorted(p.memory_id for p in store.passages(org, audiences, now, [r for r, _ in hits]))


def test_a_supersedes_link_that_would_close_a_cycle_is_refused(store):
    """QA: X; Y supersedes X; X edited to supersede Y was taken, and then each was
    superseded by the other and recall showed neither; a 3-cycle the same."""
    org = store.create_org("acme").id
    save(store, org, "x", "Deploys go out on Tuesdays", seed=1)
    save(store, org, "y", "Deploys go out on Thursdays", seed=2, supersedes=("x",))
    with pytest.raises(InvalidRequestError) as refused:
        save(store, org, "x", "Deploys go out on Tuesdays", "edit", seed=1, supersedes=("y",))
    assert refused.value.message == (
        "supersedes names 'y', which would close a cycle of supersedes links ('x' -> 'y' ->"
        " 'x'), and recall shows no memory in a cycle: drop one of its links"
    )
    assert store.current_memory(org, "x").supersedes == ()
    assert _recalled(store, org, ["deploy"]) == ["y"]

    save(store, org, "z", "Deploys go out on Fridays", seed=3, supersedes=("y",))
    with pytest.raises(InvalidRequestError, match=r"\('x' -> 'z' -> 'y' -> 'x'\)"):
        save(store, org, "x", "Deploys go out on Tuesdays", "edit", seed=1, supersedes=("z",))
    # A batch is judged whole: item 1 closes the cycle its item 0 opened.
    items = [
        ("w", MemoryDraft(body="Deploys go out on Mondays", supersedes=("z",)), passages("w", 4)),
        ("x", MemoryDraft(body="Deploys go out on Tuesdays", supersedes=("w",)), passages("x")),
    ]
    with pytest.raises(InvalidRequestError, match="'x' -> 'w' -> 'z' -> 'y' -> 'x'") as refused:
        store.save_memories(org, items, "t", "upsert")
    assert refused.value.item == 1
    assert store.current_memory(org, "w") is None
    assert _recalled(store, org, ["deploy"]) == ["z"]
    # Deleted memories link nothing: with y gone, x may supersede z.
    store.delete_memory(org, "y", "t", None)
    save(store, org, "x", "Deploys go out on Tuesdays", "edit", seed=1, supersedes=("z",))
    assert _recalled(store, org, ["deploy"]) == ["x"]


def test_a_cycle_through_memories_the_writer_cannot_read_is_refused_unnamed(store, monkeypatch):
    """The check follows every link, those the writer may not read too, and does not name
    them: neither the memory in between nor its links show in the answer."""
    import relay.store.rules

    org = store.create_org("acme").id
    both = ("dev", "ops")
    save(store, org, "a", "Builds run on the old runners", seed=1, audiences=both)
    with monkeypatch.context() as older:  # a pair written before audiences were judged
        older.setattr(relay.store.rules, "judge_supersedes", lambda *args: None)
        save(
            store,
            org,
            "h",
            "Builds run on ops runners",
            seed=2,
            audiences=("ops",),
            supersedes=("a",),
        )
    save(store, org, "b", "Builds run on new runners", seed=3, audiences=both, supersedes=("h",))
    draft = MemoryDraft(body="Builds run on the old runners", audiences=both, supersedes=("b",))
    with pytest.raises(InvalidRequestError) as refused:
        store.save_memory(
            org, "a", draft, "t", passages("a", 1), "edit", audiences=frozenset({"dev"})
        )
    assert refused.value.message == (
        "supersedes names 'b', which would close a cycle of supersedes links through memories"
        " this key cannot read, and recall shows no memory in a cycle"
    )
    with pytest.raises(InvalidRequestError, match=r"\('a' -> 'b' -> 'h' -> 'a'\)"):
        store.save_memory(org, "a", draft, "t", passages("a", 1), "edit")  # an admin reads all
    assert store.current_memory(org, "a").supersedes == ()


def test_a_cycle_written_before_cycles_were_refused_is_broken_by_the_next_edit(store, monkeypatch):
    """Memories already in a cycle stay hidden, but every edit of them still lands, and one
    that drops a link of the cycle brings recall back."""
    import relay.store.postgres.writes
    import relay.store.sqlite.writes

    org = store.create_org("acme").id
    save(store, org, "x", "Deploys go out on Tuesdays", seed=1)
    save(store, org, "y", "Deploys go out on Thursdays", seed=2, supersedes=("x",))
    with monkeypatch.context() as older:  # the code that took such links
        for module in (relay.store.sqlite.writes, relay.store.postgres.writes):
            older.setattr(module, "judge_cycle", lambda *args: None)
        save(store, org, "x", "Deploys go out on Tuesdays", "edit", seed=1, supersedes=("y",))
    assert _recalled(store, org, ["deploy"]) == []
    y, changed = save(
        store, org, "y", "Deploys go out on Thursdays at nine", "edit", seed=2, supersedes=("x",)
    )
    assert changed and y.supersedes == ("x",)
    assert _recalled(store, org, ["deploy"]) == []
    save(store, org, "x", "Deploys go out on Tuesdays", "edit", seed=1)
    assert store.current_memory(org, "y").superseded_by is None
    assert _recalled(store, org, ["deploy"]) == ["y"]


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
    assert store.list_keys(b, 10, "ka") == []  # another org's key is no place to start from
    assert store.key_for_auth("ka")[0].org_id == a


def test_keys_are_paged_in_creation_order(store):
    org = store.create_org("acme").id
    for key_id in ("k3", "k1", "k2", "k0"):
        store.create_key(org, key_id, "h", key_id, frozenset({"admin"}), frozenset(), None)
    everything = [k.id for k in store.list_keys(org)]
    assert sorted(everything) == ["k0", "k1", "k2", "k3"]
    pages, after = [], None
    while page := [k.id for k in store.list_keys(org, 3, after)]:
        pages.append(page)
        after = page[-1]
    assert pages == [everything[:3], everything[3:]]


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


def test_a_first_org_is_made_only_where_there_is_none(store):
    """What `relay serve` makes on its first start: a replica started at the same moment
    finds the one its twin made (tests/test_replicas.py races two)."""
    first = store.create_first_org("acme")
    assert first is not None and store.list_orgs() == [first]
    assert store.create_first_org("globex") is None
    assert store.create_first_org("acme") is None  # found, not a conflict
    assert store.list_orgs() == [first]


def test_an_org_name_cannot_read_as_an_org_id(store):
    """QA: `relay org create <another org's id>` was accepted, and `--org <that id>` then
    resolved to either org (`WHERE id = ? OR name = ?`, unordered)."""
    older = store.create_org("globex")
    org = store.create_org("acme")
    for name in (org.id, " ORG_0123456789AB ", "org_beef"):
        with pytest.raises(InvalidRequestError, match="reads as an organisation id"):
            store.create_org(name)
    assert {o.id for o in store.list_orgs()} == {older.id, org.id}
    assert store.create_org("org-platform").name == "org-platform"  # not an id's shape
    # A name given before the rule, equal to another org's id: the id is the one meant.
    raw_rows(store, "UPDATE orgs SET name = ? WHERE id = ? RETURNING id", (org.id, older.id))
    # and the org with that id stored after it (PostgreSQL's scan then meets the impostor first)
    for name in ("moving", "acme"):
        raw_rows(store, "UPDATE orgs SET name = ? WHERE id = ? RETURNING id", (name, org.id))
    assert store.find_org(org.id) == org
    assert store.find_org(older.id).name == org.id


def test_an_expired_key_s_roles_are_no_audience(store):
    """QA: an expired key's roles still counted as known audiences, so a memory could be
    written for readers no live key has; a revoked key's were refused."""
    org = store.create_org("acme").id
    now = datetime.now(UTC)
    for key_id, role, expires in (
        ("kold", "contractors", now - timedelta(seconds=1)),
        ("knew", "dev", now + timedelta(hours=1)),
        ("kever", "sre", None),
    ):
        scopes = frozenset({"memory:read"})
        store.create_key(org, key_id, "h", "n", scopes, frozenset({role}), expires)
    assert store.known_audiences(org) == {"dev", "sre"}


def listed(store, org, limit=10, after=None, **where) -> tuple[list[str], ListPosition | None]:  # noqa: ANN001
    page, last = store.list_memories(org, None, limit, after, ListFilter(**where))
    return [m.id for m in page], last


def test_listing_pages_newest_change_first_and_filters(store):
    org = store.create_org("acme").id
    for i in range(5):
        save(store, org, f"m{i}", f"fact {i}", source=f"s{i % 2}", tags=(f"t{i % 3}",))
    ids, last = listed(store, org, 2)
    assert ids == ["m4", "m3"] and last is not None and last.id == "m3"
    assert listed(store, org, 10, last) == (["m2", "m1", "m0"], None)
    save(store, org, "m1", "fact 1, edited", "edit", source="s1", tags=("t1",))
    assert listed(store, org)[0] == ["m1", "m4", "m3", "m2", "m0"]
    assert listed(store, org, source="s1")[0] == ["m1", "m3"]
    assert listed(store, org, tag="t0")[0] == ["m3", "m0"]
    save(store, org, "pin", "pinned fact", pinned=True)
    assert [m.id for m in store.pinned(org, EVERY, datetime.now(UTC))] == ["pin"]


def test_a_page_continues_where_it_ended_while_others_write(store):
    """Keyset paging: what is written between two pages moves to the front, so no memory
    is listed twice and none left unchanged is skipped."""
    org = store.create_org("acme").id
    for i in range(5):
        save(store, org, f"m{i}", f"fact {i}")
    first, last = listed(store, org, 2)
    save(store, org, "m3", "fact 3, edited after it was listed", "edit")
    save(store, org, "m9", "a fact written meanwhile", "create")
    store.delete_memory(org, "m2", "tester", None)
    rest, end = listed(store, org, 10, last)
    assert (first, rest, end) == (["m4", "m3"], ["m1", "m0"], None)
    assert listed(store, org)[0] == ["m9", "m3", "m4", "m1", "m0"]


def test_memories_changed_at_one_moment_page_by_id(store):
    """Ties in `updated_at` (a restore, a batch) fall back to id, descending, so a page that
    ends inside a tie continues inside it. SQLite keeps times finer than a microsecond, and
    a cursor must hold them exactly: rounded to one, `a` would be listed twice or never."""
    org = store.create_org("acme").id
    for mid in ("a", "b", "c", "d", "e"):
        save(store, org, mid, f"fact {mid}")
    # One and two steps of a float above d and e's time; all within its first microsecond.
    at = {"a": "1700000000.0000002", "b": "1700000000.0000005", "c": "1700000000.0000005"}
    at |= {"d": "1700000000", "e": "1700000000"}
    pg = getattr(store, "conninfo", None) is not None
    for mid, seconds in at.items():
        value = f"to_timestamp({seconds})" if pg else seconds
        execute_beneath(store, f"UPDATE memories SET updated_at = {value} WHERE id = '{mid}'")
    seen, last = [], None
    for _ in range(6):
        ids, last = listed(store, org, 1, last)
        seen += ids
        if last is None:
            break
    # PostgreSQL keeps microseconds: there all five are one tie.
    assert seen == (["e", "d", "c", "b", "a"] if pg else ["c", "b", "a", "e", "d"])


def test_listing_filters_by_words_prefix_and_status(store):
    org = store.create_org("acme").id
    now = datetime.now(UTC)
    body, title = "Run the DB migrations before deploys.", "Migration order"
    save(store, org, "mig", body, title=title, source="docs/CLAUDE.md#Testing")
    save(store, org, "wiki", "The wiki lives on Confluence.", source="docs/wiki.md")
    old = now + timedelta(hours=1)  # expired at the `now` listed at, below
    save(store, org, "old", "Deploys used the blue cluster.", source="docs%/x", valid_until=old)
    soon = now + timedelta(days=5)
    save(store, org, "soon", "Staging moves to teal.", source="do_s/y", valid_until=soon)
    save(store, org, "new", "Staging is teal.", source="do_s", supersedes=("old",))
    now += timedelta(hours=2)

    def ids(**where) -> set[str]:
        return set(listed(store, org, now=now, **where)[0])

    assert ids(text="migration") == {"mig"}  # in the title, whatever its case
    assert ids(text="deploys db") == {"mig"}  # every word, in any order, title or body
    assert ids(text="DEPLOYS") == {"mig", "old"}
    assert ids(text="deploys wiki") == set()
    assert ids(text="ration befo") == {"mig"}  # inside words too
    assert ids(source_prefix="docs/") == {"mig", "wiki"}
    assert ids(source_prefix="docs/CLAUDE.md#") == {"mig"}
    assert ids(source_prefix="do_s/") == {"soon"}  # literally: no wildcard in _ or %
    assert ids(source_prefix="docs%") == {"old"}
    assert ids(status="expired") == {"old"}
    assert ids(status="superseded") == {"old"}
    assert ids(status="expiring") == {"soon"}
    assert ids(status="expiring", expiring_days=4) == set()
    assert ids(status="active") == {"mig", "wiki", "soon", "new"}
    assert ids(status="active", text="deploys") == {"mig"}
    assert ids(status="pinned") == set()
    assert ids(audience="all", author="tester", source_prefix="docs") == {"mig", "wiki", "old"}
    assert ids(author="someone else") == ids(audience="sre") == set()


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


def test_an_expected_revision_of_a_memory_that_is_not_there_says_so(store):
    """QA: a batch item with `expected_revision` for an id no memory has was refused as
    "memory 'imp_…' is at revision None, not 1"; a deleted one says it was deleted."""
    org = store.create_org("acme").id
    save(store, org, "gone", "A fact deleted since it was read", seed=1)
    store.delete_memory(org, "gone", "t", None)
    for mid, said in (
        ("imp_absent", "memory 'imp_absent' does not exist (expected at revision 1)"),
        ("gone", "memory 'gone' was deleted; its id cannot be reused"),
    ):
        items = [(mid, MemoryDraft(body="a fact"), passages("a fact"))]
        with pytest.raises(ConflictError) as refused:
            store.save_memories(org, items, "t", "upsert", expected={mid: 1})
        assert refused.value.message == said
    save(store, org, "here", "A fact edited since it was read", seed=2)
    save(store, org, "here", "A fact edited since it was read, twice", seed=2)
    items = [("here", MemoryDraft(body="a fact"), passages("a fact"))]
    with pytest.raises(ConflictError) as refused:
        store.save_memories(org, items, "t", "upsert", expected={"here": 1})
    assert refused.value.message == "memory 'here' is at revision 2, not 1"
    assert refused.value.details == {"memory_id": "here", "revision": 2}


@pytest.mark.parametrize("linked", [False, True], ids=["batch-path", "one-by-one"])
def test_a_batch_keeps_a_memory_s_own_audience_once_no_live_key_has_it(store, linked):
    """QA: once the last key with `platform` was revoked, every import or restore touching
    a `platform` memory was refused ('unknown audience: platform'), unchanged items too,
    where `relay edit` of the same memory went through. A batch item may carry the
    audiences its memory already has, and only those (PostgreSQL: on its batch path, and
    on the one-by-one path that supersession takes)."""
    org = store.create_org("acme").id
    roles = frozenset({"platform"})
    store.create_key(org, "kp", "h", "n", frozenset({"memory:read"}), roles, None)
    save(store, org, "z", "zeta fact", seed=9, audiences=("platform",))
    extra = {"supersedes": ("z",)} if linked else {}

    def item(mid: str, body: str, seed: int, *audiences: str) -> tuple:
        draft = MemoryDraft(body=body, audiences=audiences or ("all",), **extra)
        return (mid, draft, passages(body, seed))

    def batch(*items: tuple) -> list[tuple[str, int, bool]]:
        saved = store.save_memories(
            org, list(items), "t", "upsert", known=store.known_audiences(org)
        )
        return [(m.id, m.revision, changed) for m, changed in saved]

    first = item("a", "alpha fact", 1, "platform", "sre")
    with pytest.raises(InvalidRequestError, match="^unknown audience: sre") as refused:
        batch(item("b", "beta fact", 2), first)
    assert refused.value.item == 1
    first = item("a", "alpha fact", 1, "platform")
    assert batch(first, item("b", "beta fact", 2)) == [("a", 1, True), ("b", 1, True)]
    store.revoke_key(org, "kp")
    assert store.known_audiences(org) == set()

    assert batch(first) == [("a", 1, False)]  # unchanged: written back as it is
    edited = item("a", "alpha fact, reworded", 3, "platform")
    assert batch(edited, item("b", "beta fact", 2)) == [("a", 2, True), ("b", 1, False)]
    for refused_item in (
        item("b", "beta fact", 2, "platform"),  # not its audience: nobody could read it
        item("c", "gamma fact", 4, "platform"),  # a new memory has none of its own
        item("a", "alpha fact, reworded", 3, "platform", "ops"),  # nor a new one
    ):
        with pytest.raises(InvalidRequestError, match="^unknown audience") as refused:
            batch(edited, refused_item)
        assert refused.value.item == 1
    assert store.get_memory(org, "b", None).audiences == ("all",)
    assert store.current_memory(org, "c") is None
    assert batch(edited) == [("a", 2, False)]


@pytest.mark.parametrize("linked", [False, True], ids=["batch-path", "one-by-one"])
def test_a_batch_writes_a_memory_only_at_the_revision_its_writer_read(store, linked):
    """An import reads a memory, judges it (its text, its audiences), then writes its
    batch: an edit landing between the two was written over unseen. A batch item's
    expected revision refuses the whole batch when its memory moved on, naming the item
    and the revision it is at (PostgreSQL: on its batch path, and on the one-by-one path
    that supersession takes)."""
    org = store.create_org("acme").id
    save(store, org, "a", "alpha fact", seed=1)
    save(store, org, "b", "beta fact", seed=2)
    save(store, org, "b", "beta fact, edited by hand", seed=3, audiences=("sre",))
    extra = {"supersedes": ("a",)} if linked else {}
    items = [
        ("c", MemoryDraft(body="gamma fact", **extra), passages("gamma fact", 4)),
        ("b", MemoryDraft(body="beta fact, from the file"), passages("beta fact, file", 5)),
    ]
    with pytest.raises(ConflictError) as refused:
        store.save_memories(org, items, "t", "upsert", expected={"b": 1})
    assert (refused.value.item, refused.value.details) == (1, {"memory_id": "b", "revision": 2})
    b = store.get_memory(org, "b", None)
    assert (b.revision, b.body, b.audiences) == (2, "beta fact, edited by hand", ("sre",))
    assert store.current_memory(org, "c") is None  # all or nothing
    saved = store.save_memories(org, items, "t", "upsert", expected={"b": 2})
    assert [(m.id, m.revision, changed) for m, changed in saved] == [("c", 1, True), ("b", 3, True)]


def parts(text: str, n: int, seed: int = 0) -> list[PassageInput]:
    """`n` passages of one memory."""
    return [
        PassageInput(
            i,
            f"{text} {i}",
            " ".join(lexical_terms(f"{text} {i}")),
            f"h{seed}.{i}",
            vec(seed + i).tobytes(),
        )
        for i in range(n)
    ]


def test_a_removed_texts_embedding_leaves_the_cache_with_it(store):
    """QA: a deleted memory's vector and token matrix stayed in the embedding cache (and
    `relay migrate` copied them on), against "deletion removes it from every index and cache
    at once". A text another memory, of any org, still holds keeps its entry."""
    org, other = store.create_org("acme").id, store.create_org("globex").id
    for model in ("model", "model:tokens"):
        store.cache_embeddings(model, {h: b"v" for h in ("h1", "h2", "h3")})

    def cached() -> set[tuple[str, str]]:
        return set(raw_rows(store, "SELECT model, content_hash FROM embedding_cache"))

    save(store, org, "a", "alpha", "create", seed=1)
    save(store, other, "b", "alpha", "create", seed=1)  # the same text in another org
    save(store, org, "c", "gamma", "create", seed=2)
    save(store, org, "d", "delta", "create", seed=3)
    store.delete_memory(org, "a", "t", None)
    assert {h for _, h in cached()} == {"h1", "h2", "h3"}  # globex's "b" still holds h1
    store.delete_memory(other, "b", "t", None)
    assert {h for _, h in cached()} == {"h2", "h3"}
    save(store, org, "c", "gamma, edited", "upsert", seed=5)  # an edit replaces its passage
    assert {h for _, h in cached()} == {"h3"}
    store.save_memories(
        org, [("d", MemoryDraft(body="delta 2"), passages("delta 2", 6))], "t", "upsert"
    )
    assert cached() == set()


def test_a_write_is_served_only_cached_embeddings_of_texts_its_key_may_read(store):
    """QA: a cached embedding made a write of the same text about 50 ms quicker, so any
    writer could tell whether another org, or an audience it lacks, holds an exact text
    ("Globex acquires Initech in Q3"). A write now finds only what its org holds, in
    memories its key may read; the backfill (no org) still finds every entry."""
    org, other = store.create_org("acme").id, store.create_org("globex").id
    save(store, other, "g", "globex text", seed=1)
    save(store, org, "s", "sre text", seed=2, audiences=("sre",))
    save(store, org, "a", "everyone's text", seed=3)
    save(store, org, "gone", "deleted text", seed=4)
    store.delete_memory(org, "gone", "t", None)  # its entry goes only if no passage holds it
    save(store, other, "g4", "deleted text", seed=4)
    store.cache_embeddings("model", {h: h.encode() for h in ("h1", "h2", "h3", "h4")})
    every = ["h1", "h2", "h3", "h4"]

    def cached(org_id, audiences):  # noqa: ANN001, ANN202
        return set(store.cached_embeddings("model", every, org_id, audiences))

    assert cached(org, frozenset({"dev"})) == {"h3"}
    assert cached(org, frozenset({"sre"})) == {"h2", "h3"}
    assert cached(org, None) == {"h2", "h3"}  # an admin: the whole org, no other
    assert cached(other, frozenset()) == {"h1", "h4"}
    assert cached(None, None) == {"h1", "h2", "h3", "h4"}


def test_embeddings_no_passage_holds_are_dropped_at_start_up(store):
    """A write caches its new embeddings once stored; a delete of the same text landing in
    between leaves one behind, which the server's start-up drops (relay.server._warm)."""
    org = store.create_org("acme").id
    save(store, org, "a", "alpha", "create", seed=1)
    store.cache_embeddings("model", {"h1": b"v", "raced": b"v"})
    store.cache_embeddings("model:tokens", {"raced": b"t"})
    assert store.forget_unheld_embeddings() == 2
    assert raw_rows(store, "SELECT content_hash FROM embedding_cache") == [("h1",)]
    assert store.forget_unheld_embeddings() == 0


def test_an_older_store_drops_the_embeddings_its_deletes_left_when_it_is_opened(store):
    """Migration 6 drops what deletes left in the cache before it, and only that."""
    org = store.create_org("acme").id
    save(store, org, "a", "alpha", "create", seed=1)
    store.cache_embeddings("model", {"h1": b"v", "gone": b"v"})  # "gone": a deleted text's
    undo = ["DROP INDEX passages_content_hash", "DELETE FROM schema_migrations WHERE version = 6"]
    if getattr(store, "conninfo", None) is not None:
        undo += [
            "DROP FUNCTION relay_forget_embeddings(text[])",
            "DROP FUNCTION relay_forget_unheld_embeddings()",
        ]
    _run_as_owner(store, undo)
    upgraded = _reopen(store)
    try:
        assert raw_rows(upgraded, "SELECT content_hash FROM embedding_cache") == [("h1",)]
    finally:
        upgraded.close()


@pytest.mark.postgres
def test_a_database_the_first_migration_6_made_gets_the_start_up_drop_of_unheld_embeddings(
    pg_store,
):
    """QA: migration 6 first shipped without relay_forget_unheld_embeddings(), added to its
    text later (e9cdae7); on a database that release migrated every start of this code logged
    'dropping unheld cached embeddings failed' (UndefinedFunction) and kept the vectors of
    deleted texts. Such a database: this schema without the function, migration 9 not run."""
    store = pg_store
    org = store.create_org("acme").id
    save(store, org, "a", "alpha", "create", seed=1)
    store.cache_embeddings("model", {"h1": b"v", "raced": b"v"})
    _run_as_owner(
        store,
        [
            "DROP FUNCTION relay_forget_unheld_embeddings()",
            "DELETE FROM schema_migrations WHERE version = 9",
        ],
    )
    upgraded = _reopen(store)
    try:
        assert upgraded.forget_unheld_embeddings() == 1
        assert raw_rows(upgraded, "SELECT content_hash FROM embedding_cache") == [("h1",)]
    finally:
        upgraded.close()


def test_each_revision_records_whether_it_pinned_its_memory(store):
    """QA: a pin or unpin is a new revision, and revisions kept no pin, so it read as one
    that changed nothing. A tombstone has none to keep."""
    org = store.create_org("acme").id
    save(store, org, "a", "alpha", pinned=True)
    save(store, org, "a", "alpha")
    store.save_memories(
        org, [("a", MemoryDraft(body="alpha", pinned=True), passages("alpha"))], "t", "upsert"
    )
    store.delete_memory(org, "a", "t", None)
    assert [r.pinned for r in store.history(org, "a", None)] == [True, False, True, None]


def test_an_older_store_s_revisions_are_given_the_pins_that_can_be_known(store):
    """Migration 8: the current revision's pin is its memory's, and going back from it, a
    revision alike in every field recorded to the one before changed only the pin; before a
    revision that changed more, and in a deleted memory's revisions (their text removed),
    it cannot be known."""
    org = store.create_org("acme").id
    save(store, org, "a", "alpha")
    save(store, org, "a", "alpha, edited")  # the pin before this edit cannot be known
    for pinned in (True, False, True):
        save(store, org, "a", "alpha, edited", pinned=pinned)
    save(store, org, "b", "beta", pinned=True)
    save(store, org, "c", "gamma", pinned=True)
    save(store, org, "c", "gamma")
    store.delete_memory(org, "c", "t", None)
    _run_as_owner(
        store,
        [
            "ALTER TABLE memory_revisions DROP COLUMN pinned",
            "DELETE FROM schema_migrations WHERE version = 8",
        ],
    )
    upgraded = _reopen(store)
    try:
        pins = {m: [r.pinned for r in upgraded.history(org, m, None)] for m in "abc"}
    finally:
        upgraded.close()
    assert pins == {
        "a": [None, False, True, False, True],
        "b": [True],
        "c": [None, None, None],
    }


def test_each_audience_sets_passage_total_follows_every_write(store):
    """A reader's share of the org is summed from these (relay.ranking.seen): they must equal
    a recount after creates, edits that move a memory to other audiences, batch upserts
    (PostgreSQL's pipelined path and its one-by-one path) and deletes."""
    org, other = store.create_org("acme").id, store.create_org("globex").id

    def put(mid: str, n: int, seed: int, *audiences: str, **fields) -> None:  # noqa: ANN003
        draft = MemoryDraft(body=f"{mid} fact {seed}", audiences=audiences or ("all",), **fields)
        store.save_memory(org, mid, draft, "t", parts(f"{mid} fact", n, seed), "upsert")

    def check() -> None:
        stored = stored_totals(store, org)
        assert stored == recounted_totals(store, org)
        assert sum(stored.values()) == store.doc_freq(org, [])[0]
        for roles in ((), ("sre",), ("dev",), ("fraud", "legal")):  # and what readers sum
            reader = frozenset({*roles, "all"})
            total, _ = store.seen_doc_freq(org, reader, datetime.now(UTC), [], 50)
            assert total == sum(n for audiences, n in stored.items() if reader & set(audiences))

    put("a", 2, 1)
    put("b", 3, 2, "sre")
    put("c", 1, 3, "sre", "dev")
    store.save_memory(other, "x", MemoryDraft(body="x"), "t", parts("x", 4, 9), "create")
    check()
    assert stored_totals(store, org) == {("all",): 2, ("sre",): 3, ("dev", "sre"): 1}
    put("a", 1, 4, "dev", "sre")  # another audience, fewer passages
    put("b", 4, 5, "sre")  # same audience, more passages
    check()
    assert stored_totals(store, org) == {("sre",): 4, ("dev", "sre"): 2}
    batch = [
        ("a", MemoryDraft(body="a fact 4", audiences=("dev", "sre")), parts("a fact", 1, 4)),
        ("b", MemoryDraft(body="b moved"), parts("b moved", 2, 6)),
        ("d", MemoryDraft(body="d new", audiences=("fraud",)), parts("d new", 2, 7)),
        ("e", MemoryDraft(body="e new", audiences=("sre", "dev")), parts("e new", 3, 8)),
    ]
    store.save_memories(org, batch, "t", "upsert")
    check()
    one_by_one = [  # supersession: not PostgreSQL's pipelined path
        ("f", MemoryDraft(body="f new", supersedes=("e",)), parts("f new", 1, 10)),
        ("d", MemoryDraft(body="d again", audiences=("legal",)), parts("d again", 1, 11)),
    ]
    store.save_memories(org, one_by_one, "t", "upsert")
    check()
    store.delete_memory(org, "c", "t", None)
    store.delete_memory(org, "d", "t", None)
    check()
    assert stored_totals(store, org) == {("all",): 3, ("dev", "sre"): 4}
    store.delete_memory(org, "e", "t", None)
    store.delete_memory(org, "f", "t", None)
    store.delete_memory(org, "b", "t", None)
    check()
    assert stored_totals(store, org) == {("dev", "sre"): 1}  # emptied sets are gone
    assert stored_totals(store, other) == {("all",): 4}


def test_an_older_store_has_its_audience_totals_counted_when_it_is_opened(store):
    """Migration 5 counts the passages of a store written before it, keyed as the writes that
    follow key them."""
    org = store.create_org("acme").id
    draft = MemoryDraft(body="b", audiences=("sre", "dev"))  # in no particular order
    store.save_memory(org, "a", MemoryDraft(body="a"), "t", parts("a", 2, 1), "create")
    store.save_memory(org, "b", draft, "t", parts("b", 3, 2), "create")
    store.save_memory(org, "c", MemoryDraft(body="c"), "t", parts("c", 1, 3), "create")
    store.delete_memory(org, "c", "t", None)
    _forget_audience_totals(store)
    upgraded = _reopen(store)
    try:
        assert stored_totals(upgraded, org) == {("all",): 2, ("dev", "sre"): 3}
        b = MemoryDraft(body="b, edited", audiences=("dev", "sre"))
        upgraded.save_memory(org, "b", b, "t", parts("b, edited", 1, 4), "edit")
        upgraded.delete_memory(org, "a", "t", None)
        assert stored_totals(upgraded, org) == {("dev", "sre"): 1}
        assert stored_totals(upgraded, org) == recounted_totals(upgraded, org)
    finally:
        upgraded.close()


def test_audience_totals_left_behind_by_older_code_are_counted_again_at_start(store, caplog):
    """During a rolling upgrade a replica on code from before migration 5 writes passages
    and the org's count but not the per-set totals searches weigh words by, and so does a
    server of such a release started on a SQLite file after an upgrade (a rollback: QA, the
    SQLite store kept what it left for good); the next start counts again the orgs whose
    sets no longer add up, and leaves the others alone."""
    org = store.create_org("acme").id
    other = store.create_org("globex").id
    store.save_memory(org, "a", MemoryDraft(body="a"), "t", parts("a", 2, 1), "create")
    draft = MemoryDraft(body="b", audiences=("sre",))
    store.save_memory(org, "b", draft, "t", parts("b", 3, 2), "create")
    store.save_memory(other, "c", MemoryDraft(body="c"), "t", parts("c", 1, 3), "create")
    # What an older replica's write of "a" and delete of "b" would have left behind.
    key = "'{%s}'" if getattr(store, "conninfo", None) else """'["%s"]'"""
    _run_as_owner(
        store,
        [
            "UPDATE audience_totals SET passage_count = passage_count - 2"
            f" WHERE org_id = '{org}' AND audiences = {key % 'all'}",
            "UPDATE audience_totals SET passage_count = 9"
            f" WHERE org_id = '{org}' AND audiences = {key % 'sre'}",
        ],
    )
    assert stored_totals(store, org) == {("all",): 0, ("sre",): 9}
    with caplog.at_level("WARNING"):
        restarted = _reopen(store)
    try:
        assert stored_totals(restarted, org) == {("all",): 2, ("sre",): 3}
        assert stored_totals(restarted, other) == {("all",): 1}
        assert restarted.doc_freq(org, [])[0] == 5
        drift = [r.getMessage() for r in caplog.records if "counted again" in r.getMessage()]
        assert len(drift) == 1, drift
        assert drift[0].startswith(
            f"org {org}: its passage totals disagreed (audience sets 9, org 5: left by "
        )
        assert drift[0].endswith("; counted again from its passages: 5")
        caplog.clear()
        with caplog.at_level("WARNING"):
            _reopen(restarted).close()  # nothing drifted: nothing counted, nothing said
        assert not [r for r in caplog.records if "counted again" in r.getMessage()]
    finally:
        restarted.close()


def _forget_audience_totals(store) -> None:  # noqa: ANN001
    """Take the store back to before migration 5: its table and its record gone."""
    _run_as_owner(
        store,
        [
            "DROP TABLE audience_totals",
            "DELETE FROM schema_migrations WHERE version = 5",
        ],
    )


def _run_as_owner(store, statements: list[str]) -> None:  # noqa: ANN001
    """Statements beneath the store's API: SQLite's writer, or PostgreSQL as the owner."""
    conninfo = getattr(store, "conninfo", None)
    if conninfo is None:
        with store._write() as conn:
            for statement in statements:
                conn.execute(statement)
        return
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _reopen(store):  # noqa: ANN001, ANN202
    """The same database opened anew, as a server upgraded to this code opens it."""
    if getattr(store, "conninfo", None) is None:
        from relay.store.sqlite import SQLiteStore

        return SQLiteStore(store.path)
    from relay.store.postgres import PostgresStore

    return PostgresStore(store.url, pool_size=2)


def test_an_org_name_is_held_to_a_key_names_rule(store):
    """QA: `relay org create "$(printf 'a\\x01b')"` was taken (shown as "ab"), and so was a
    name of 5,000 characters; an org's name is listed like a key's, so the same rule holds."""
    from relay.errors import SecretDetectedError, TooLargeError

    with pytest.raises(InvalidRequestError, match="one line without control characters"):
        store.create_org("a\x01b")
    with pytest.raises(InvalidRequestError, match="like 'acme platform'"):  # not a key's example
        store.create_org("a\x01b")
    with pytest.raises(TooLargeError, match="the limit is 200"):
        store.create_org("x" * 5000)
    with pytest.raises(SecretDetectedError):
        store.create_org("ops password=Hunter2xQ9!")
    assert store.create_org("  Acme Platform  ").name == "Acme Platform"


def test_a_sqlite_time_stored_past_year_9999_reads_as_the_latest_time(tmp_path):
    """QA: SQLite stored "9999-12-31T23:59:59.9999999Z" as 253402300800.0 (year 10000): every
    read of the row raised, so the key could not be listed, revoked or used, nor the memory
    read or edited. Such a row reads as 9999-12-31T23:59:59Z, and the database recovers."""
    from relay.hygiene import LATEST_TIME
    from relay.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "relay.db")
    try:
        org = store.create_org("acme").id
        store.create_key(org, "k1", "hash", "ci", frozenset({"memory:read"}), frozenset(), None)
        save(store, org, "m", "Deploys freeze at noon", valid_until=LATEST_TIME)
        with store._write() as conn:  # as the rounding left them
            conn.execute("UPDATE api_keys SET expires_at = 253402300800.0")
            conn.execute("UPDATE memories SET valid_until = 253402300800.0")
            conn.execute("UPDATE memory_revisions SET valid_until = 253402300800.0")
        assert store.key_for_auth("k1")[0].expires_at == LATEST_TIME
        assert [k.expires_at for k in store.list_keys(org)] == [LATEST_TIME]
        assert store.revoke_key(org, "k1").expires_at == LATEST_TIME
        assert store.get_memory(org, "m", None).valid_until == LATEST_TIME
        assert [r.valid_until for r in store.history(org, "m", None)] == [LATEST_TIME]
        edited, changed = save(
            store, org, "m", "Deploys freeze at one", "edit", valid_until=LATEST_TIME
        )
        assert changed and edited.valid_until == LATEST_TIME
        assert store.next_expiry(org, datetime.now(UTC)) == LATEST_TIME
    finally:
        store.close()


def test_the_last_live_admin_key_of_an_org_is_never_revoked(store):
    """QA: an admin key revoked itself (DELETE /v1/keys/<own id>: 200, then 401), and the
    org had no key left to make or revoke keys. An expired or revoked admin key, or another
    org's, does not count as one left."""
    a, b = store.create_org("acme").id, store.create_org("globex").id
    admin, every = frozenset({"admin"}), frozenset({"memory:read", "memory:write"})
    past = datetime.now(UTC) - timedelta(days=1)
    store.create_key(a, "k_admin", "h1", "admin", admin, frozenset(), None)
    store.create_key(a, "k_old", "h2", "old admin", admin, frozenset(), past)
    store.create_key(a, "k_gone", "h3", "gone admin", admin, frozenset(), None)
    store.create_key(a, "k_dev", "h4", "dev", every, frozenset(), None)
    store.create_key(b, "k_other", "h5", "globex admin", admin, frozenset(), None)
    store.revoke_key(a, "k_gone")
    with pytest.raises(ConflictError) as refused:
        store.revoke_key(a, "k_admin")
    assert refused.value.message == (
        "key k_admin is this organisation's last live admin key: without it no key could"
        " create or revoke keys; create another admin key first, then revoke this one"
    )
    assert store.key_for_auth("k_admin")[0].revoked_at is None
    store.revoke_key(a, "k_dev")  # any other key goes, as does an expired admin key
    assert store.revoke_key(a, "k_old").revoked_at is not None
    store.create_key(a, "k_new", "h6", "new admin", admin, frozenset(), None)
    assert store.revoke_key(a, "k_admin").revoked_at is not None
    assert store.revoke_key(a, "k_admin").revoked_at is not None  # again: already done
    with pytest.raises(ConflictError):
        store.revoke_key(a, "k_new")


def test_two_admin_keys_revoked_at_once_leave_one(store):
    """The rule is judged in the revoking write transaction: two admins revoking each
    other at the same moment must not both pass and leave none."""
    import threading

    admin = frozenset({"admin"})
    for round_ in range(5):
        org = store.create_org(f"acme{round_}").id
        ids = [f"k{round_}a", f"k{round_}b"]
        for n, key_id in enumerate(ids):
            store.create_key(org, key_id, f"h{round_}{n}", key_id, admin, frozenset(), None)
        start, outcomes = threading.Barrier(2), []
        threads = [
            threading.Thread(target=_revoke_when, args=(store, org, k, start, outcomes))
            for k in ids
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == ["refused", "revoked"]
        assert sum(k.revoked_at is None for k in store.list_keys(org)) == 1


def _revoke_when(store, org: str, key_id: str, start, outcomes: list[str]) -> None:  # noqa: ANN001
    """Revoke `key_id` once every thread is at `start`; note whether it was refused."""
    start.wait()
    try:
        store.revoke_key(org, key_id)
        outcomes.append("revoked")
    except ConflictError:
        outcomes.append("refused")


def test_the_schema_version_is_the_last_migration_applied(store):
    """PostgreSQL's rows are dicts: `schema_version` read its row by position, KeyError: 0."""
    from relay.store import migrations_postgres, migrations_sqlite
    from relay.store.sqlite import SQLiteStore

    module = migrations_sqlite if isinstance(store, SQLiteStore) else migrations_postgres
    assert store.schema_version() == len(module.MIGRATIONS)
