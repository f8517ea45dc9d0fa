"""Late interaction: token matrices written, stored, backfilled and scored (relay.late)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from relay import late, server
from relay.auth import mint_key
from relay.models import MemoryDraft, PassageInput, Principal
from relay.search import Searcher
from relay.text import query_terms, word_spans
from relay.writes import backfill_tokens, embedding_text, prepare, save_many


def _pieces(embedder, query: str, weights: dict[str, float] | None = None) -> late.QueryPieces:
    states = embedder.read_query(query)
    words = [
        (a, b, (weights or {}).get(term, 1.0) if term else 0.0) for a, b, term in word_spans(query)
    ]
    pieces = late.QueryPieces.read(states.states, states.spans, words)
    assert pieces is not None
    return pieces


def test_a_packed_matrix_keeps_every_piece_direction(embedder):
    _, (states,) = embedder.embed_tokens(["Staging is the blue cluster; deploy with make."])
    blob = late.pack(states)
    assert len(blob) == len(states) * late.DIMS  # one int8 row per word piece
    cosines = (_unpacked(blob) * late.project(states)).sum(axis=1)
    assert cosines.min() > 0.99


def _unpacked(blob: bytes) -> np.ndarray:
    return _unit(late.rows_of(blob))


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_projection_keeps_maxsim_close_to_full_width(embedder):
    query = "What did Caroline research?"
    _, states = embedder.embed_tokens(
        ["Caroline researched adoption agencies.", "Melanie painted a lake sunrise."]
    )
    q = _unit(embedder.read_query(query).states)
    full = [float((q @ _unit(s).T).max(axis=1).mean()) for s in states]
    pieces = _pieces(embedder, query)
    uniform = late.QueryPieces(pieces.rows, np.full(len(pieces.rows), 1 / len(pieces.rows)))
    stored = uniform.maxsims([late.pack(s) for s in states])
    assert stored[0] > stored[1] and full[0] > full[1]
    assert max(abs(a - b) for a, b in zip(full, stored, strict=True)) < 0.1


def test_maxsim_prefers_the_passage_that_says_the_query_s_rare_word(embedder):
    query = "which package manager does the web app use?"
    pieces = _pieces(embedder, query)
    _, states = embedder.embed_tokens(
        [
            "Use pnpm, not npm or yarn, as the package manager of the web app.",
            "The web app is deployed from the main branch every Tuesday.",
            "Staging is the blue cluster.",
        ]
    )
    scores = pieces.maxsims([late.pack(s) for s in states])
    assert scores[0] > scores[1] > scores[2]


def test_a_batch_of_matrices_scores_each_as_alone_and_an_empty_one_as_zero(embedder):
    pieces = _pieces(embedder, "which package manager does the web app use?")
    _, states = embedder.embed_tokens(["Use pnpm for the web app.", "Staging is the blue cluster."])
    blobs = [late.pack(states[0]), b"", late.pack(states[1])]
    alone = [float((pieces.rows @ _unpacked(b).T).max(axis=1) @ pieces.weights) for b in blobs[::2]]
    assert pieces.maxsims(blobs) == pytest.approx([alone[0], 0.0, alone[1]], abs=1e-6)
    assert pieces.maxsims([b""]) == [0.0]


def test_query_weights_follow_the_words_and_skip_stopwords(embedder):
    query = "what is the onboarding checklist?"
    pieces = _pieces(embedder, query, {"onboard": 3.0, "checklist": 1.0})
    states = embedder.read_query(query)
    by_piece = {query[a:b]: w for (a, b), w in zip(states.spans, pieces.weights, strict=True)}
    assert by_piece["what"] == 0 and by_piece["the"] == 0 and by_piece["?"] == 0
    onboarding = sum(w for (a, _), w in zip(states.spans, pieces.weights, strict=True) if a < 23)
    assert onboarding == pytest.approx(0.75, abs=1e-6)  # its IDF's share, over its pieces
    assert pieces.weights.sum() == pytest.approx(1.0)


def test_a_query_of_stopwords_weighs_its_pieces_alike(embedder):
    pieces = _pieces(embedder, "what is it?")
    assert np.allclose(pieces.weights, 1 / len(pieces.weights))


def test_both_embedding_providers_give_the_same_token_states(embedder):
    pytest.importorskip("torch")
    from relay.embedding import SentenceTransformerEmbedder

    other = SentenceTransformerEmbedder(1)
    text = "Migrations go in a separate backfill job."
    (_, (mine,)), (_, (theirs,)) = embedder.embed_tokens([text]), other.embed_tokens([text])
    assert mine.shape == theirs.shape
    assert (_unpacked(late.pack(mine)) * _unpacked(late.pack(theirs))).sum(1).min() > 0.98
    assert embedder.read_query(text).spans == other.read_query(text).spans


def _org(store) -> tuple[str, Principal]:
    org = store.create_org("acme")
    key = mint_key(store, org.id, "r", frozenset({"memory:read"}), frozenset()).key
    return org.id, Principal(org.id, key.id, key.scopes, key.roles)


BODIES = [
    "Database migrations run in a separate backfill job, never inside the web deploy.",
    "Staging is the blue cluster; production is the green cluster.",
    "Use pnpm, not npm or yarn, for the web app.",
]


def test_a_write_stores_each_passage_with_its_token_matrix(store, embedder):
    org, who = _org(store)
    save_many(
        store, embedder, org, [(f"m{i}", MemoryDraft(body=b)) for i, b in enumerate(BODIES)], "t"
    )
    assert store.missing_tokens(10) == []
    (hit,) = store.lexical_search(org, who.audiences, _now(), query_terms("staging"), 5)
    _, (states,) = embedder.embed_tokens([embedding_text(None, BODIES[1])])
    assert store.token_matrices(org, [hit[0]]) == {hit[0]: late.pack(states)}
    assert store.token_matrices("another-org", [hit[0]]) == {}


def test_passages_stored_without_token_matrices_are_backfilled(store, embedder):
    org, who = _org(store)
    drafts = [(f"m{i}", MemoryDraft(body=b, title="Ops")) for i, b in enumerate(BODIES)]
    # As a store written before relay.late: the same passages, no token matrices.
    for write in prepare(store, embedder, drafts, org, None)[0]:
        bare = [
            PassageInput(p.seq, p.text, p.lexical, p.content_hash, p.embedding)
            for p in write.passages
        ]
        store.save_memory(org, write.memory_id, write.draft, "t", bare, "create")
    missing = store.missing_tokens(10)
    assert [text for _, _, text in missing] == BODIES and {t for _, t, _ in missing} == {"Ops"}
    assert store.missing_tokens(10, after=missing[0][0]) == missing[1:]  # where a batch resumes
    searcher = Searcher(store, embedder)
    seen: list = []
    searcher.observe = lambda q, scored, pool: seen.extend(f for _, f, _ in scored)
    searcher.search(who, "which cluster is staging?", 3, 10_000, use_cache=False)
    assert seen and all(f.maxsim is None for f in seen)  # the cosine-only model answers

    assert list(backfill_tokens(store, embedder, batch=2)) == [2, 1]
    assert store.missing_tokens(10) == []
    seen.clear()
    res = searcher.search(who, "which cluster is staging?", 3, 10_000, use_cache=False)
    assert seen and all(f.maxsim is not None for f in seen)
    assert res.results[0].id == "m1"
    rowids = [rowid for rowid, _, _ in missing]
    fresh, _ = prepare(store, embedder, drafts, org, None)
    matrices = store.token_matrices(org, rowids)
    stored = {p.text: matrices[p.rowid] for p in store.passages(org, who.audiences, _now(), rowids)}
    assert stored == {w.passages[0].text: w.passages[0].tokens for w in fresh}
    searcher.close()


def test_a_backfill_embeds_each_distinct_text_once(store, embedder):
    org, who = _org(store)
    other = store.create_org("globex").id

    vectors = dict(zip(BODIES[:2], embedder.embed(BODIES[:2]).astype("<f4"), strict=True))

    def save_bare(org_id: str, memory_id: str, body: str) -> None:
        # As a store written before relay.late: a vector, no token matrix, none cached.
        passage = PassageInput(0, body, body.lower(), "h", vectors[body].tobytes())
        store.save_memory(org_id, memory_id, MemoryDraft(body=body), "t", [passage], "create")

    save_bare(org, "m0", BODIES[0])
    save_bare(org, "m1", BODIES[0])  # the same text twice in one org
    save_bare(other, "m0", BODIES[0])  # ... and once in another
    save_bare(org, "m2", BODIES[1])
    embedded: list[str] = []
    real = embedder.embed_tokens

    def counting(texts, **options):  # the real model; what it is asked is recorded
        embedded.extend(texts)
        return real(texts, **options)

    embedder.embed_tokens = counting
    try:
        assert sum(backfill_tokens(store, embedder, batch=3)) == 4
        assert sorted(embedded) == sorted(BODIES[:2])
        save_bare(org, "m3", BODIES[1])  # later, a text the cache already holds
        embedded.clear()
        assert sum(backfill_tokens(store, embedder)) == 1
        assert embedded == []
    finally:
        embedder.embed_tokens = real
    expected = {b: late.pack(embedder.embed_tokens([b])[1][0]) for b in BODIES[:2]}
    for org_id in (org, other):
        rows = store.passages(org_id, who.audiences, _now(), list(range(1, 10)))
        matrices = store.token_matrices(org_id, [p.rowid for p in rows])
        assert rows and all(matrices[p.rowid] == expected[p.text] for p in rows)


def test_the_server_backfills_at_start_up(store, embedder, caplog):
    org, _ = _org(store)
    for write in prepare(store, embedder, [("m0", MemoryDraft(body=BODIES[0]))], org, None)[0]:
        bare = [
            PassageInput(p.seq, p.text, p.lexical, p.content_hash, p.embedding)
            for p in write.passages
        ]
        store.save_memory(org, write.memory_id, write.draft, "t", bare, "create")
    caplog.set_level("INFO", logger="relay")
    server._warm(store, embedder)  # what build_services runs on its start-up thread
    assert store.missing_tokens(10) == []
    assert "backfill complete, 1 passages" in caplog.text


def test_token_matrices_go_with_their_passage(store, embedder):
    org, who = _org(store)

    def only_passage(word: str) -> int:
        (hit,) = store.lexical_search(org, who.audiences, _now(), query_terms(word), 5)
        return hit[0]

    def tokens(word: str) -> bytes:
        rowid = only_passage(word)
        return store.token_matrices(org, [rowid])[rowid]

    def fresh(body: str) -> bytes:
        return late.pack(embedder.embed_tokens([body])[1][0])

    save_many(store, embedder, org, [("m0", MemoryDraft(body=BODIES[0]))], "t")
    old = only_passage("backfill")
    save_many(store, embedder, org, [("m0", MemoryDraft(body=BODIES[1]))], "t", mode="edit")
    assert tokens("staging") == fresh(BODIES[1])
    store.delete_memory(org, "m0", "t", None)
    junk = b"\x01" * late.DIMS
    store.store_tokens([(old, junk)])  # a backfill that read a passage since replaced or deleted
    save_many(store, embedder, org, [("m1", MemoryDraft(body=BODIES[2]))], "t")
    assert tokens("pnpm") == fresh(BODIES[2])
    assert store.missing_tokens(10) == []


def _now() -> datetime:
    return datetime.now(UTC)
