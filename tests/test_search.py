"""The search pipeline on a real store: deadline, degradation, threshold, passages."""

from __future__ import annotations

import dataclasses
import math
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from relay.auth import mint_key
from relay.models import MemoryDraft, PassageInput, Principal
from relay.passages import split_passages
from relay.ranking import SEEN_CAP, QueryReading, seen
from relay.search import Searcher, SearchSettings
from relay.writes import save, save_many


class SlowEmbedder:
    """The real model behind a deliberate delay on the query path."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.name, self.dim = inner.name, inner.dim

    def embed(self, texts):
        return self.inner.embed(texts)

    def embed_tokens(self, texts):
        return self.inner.embed_tokens(texts)

    def embed_query(self, text):
        time.sleep(self.delay_s)
        return self.inner.embed_query(text)

    def read_query(self, text):
        time.sleep(self.delay_s)
        return self.inner.read_query(text)


def _org(store, embedder, bodies: list[str]) -> Principal:
    org = store.create_org("acme")
    key = mint_key(store, org.id, "r", frozenset({"memory:read"}), frozenset()).key
    save_many(
        store, embedder, org.id, [(f"m{i}", MemoryDraft(body=b)) for i, b in enumerate(bodies)], "t"
    )
    return Principal(org.id, key.id, key.scopes, key.roles)


BODIES = [
    "Database migrations run in a separate backfill job, never inside the web deploy.",
    "Staging is the blue cluster; production is the green cluster.",
    "Use pnpm, not npm or yarn, for the web app.",
]


def test_slow_semantic_stage_falls_back_to_lexical_within_the_deadline(store, embedder):
    p = _org(store, embedder, BODIES)
    searcher = Searcher(store, SlowEmbedder(embedder, 1.0))
    t = time.monotonic()
    res = searcher.search(p, "which cluster is staging on?", k=3, deadline_ms=150, use_cache=False)
    took = (time.monotonic() - t) * 1000
    # The deadline is the feature: waiting for the 1 s embedder would take 1,000 ms. The
    # slack is generous for a loaded CI runner (PostgreSQL took 215 ms at load 5).
    assert took < 150 + 200
    assert res.degraded and res.stages == ["lexical"]
    assert [h.id for h in res.results] == ["m1"]
    searcher.close()


def test_slow_semantic_only_answers_nothing_on_time(store, embedder):
    p = _org(store, embedder, BODIES)
    searcher = Searcher(store, SlowEmbedder(embedder, 1.0))
    t = time.monotonic()
    res = searcher.search(
        p, "which cluster is staging on?", deadline_ms=120, mode="semantic", use_cache=False
    )
    assert (time.monotonic() - t) * 1000 < 120 + 50
    assert res.results == [] and res.degraded
    searcher.close()


def test_a_tiny_budget_answers_nothing_at_once(store, embedder):
    p = _org(store, embedder, BODIES)
    searcher = Searcher(store, embedder)
    res = searcher.search(p, "which cluster is staging on?", deadline_ms=1, use_cache=False)
    assert res.results == [] and res.degraded
    searcher.close()


def test_degraded_answers_are_not_cached(store, embedder):
    from relay.cache import ResultCache

    p = _org(store, embedder, BODIES)
    slow = Searcher(store, SlowEmbedder(embedder, 1.0), cache=ResultCache())
    assert slow.search(p, "which cluster is staging on?", deadline_ms=100).degraded
    assert len(slow.cache) == 0
    slow.close()


def test_expired_answers_leave_the_cache_before_it_fills():
    """QA: an expired answer left the cache only when looked up again or when the cache was
    full, and the hook's prompts are rarely asked twice: a server filled to its 10,000
    entries (140 MB of RSS at the hook's 2,000-character queries) and kept them for good."""
    import time

    from relay.cache import ResultCache

    cache = ResultCache(max_entries=1000)
    gone = time.time() - 1  # answers whose time is up (their ttl, or a memory's expiry)
    for i in range(50):
        cache.put(("acme", f"prompt {i}"), 1, f"answer {i}", not_after=gone)
    cache.put(("acme", "prompt now"), 1, "answer now", not_after=None)
    assert len(cache) == 1
    assert cache.get(("acme", "prompt now"), 1) == "answer now"


def test_passages_keep_the_text_as_written():
    """A paragraph cut at sentences stays one paragraph in each passage (its sentences were
    joined by blank lines, as if each were a paragraph of its own), and paragraphs stay apart."""
    steps = " ".join(f"Step {i}: run check {i} against the canary." for i in range(40))
    body = f"{steps}\n\nRoll back with the previous tag. Tell the channel."
    parts = split_passages(body)
    assert len(parts) > 2 and all(len(p) <= 700 for p in parts)
    assert "\n" not in "".join(parts[:-1])
    assert parts[-1].endswith("canary.\n\nRoll back with the previous tag. Tell the channel.")
    assert " ".join(" ".join(parts).split()) == " ".join(body.split())


def test_long_memory_returns_its_matching_passage(store, embedder):
    org = store.create_org("acme")
    key = mint_key(store, org.id, "r", frozenset({"memory:read"}), frozenset()).key
    filler = " ".join(f"The release checklist item {i} concerns documentation." for i in range(30))
    body = (
        filler + "\n\nThe on-call engineer must page the database team before any failover drill."
    )
    save(
        store,
        embedder,
        org.id,
        "long",
        MemoryDraft(body=body, title="Operations handbook"),
        "t",
        "create",
    )
    p = Principal(org.id, key.id, key.scopes, key.roles)
    query = "who do we page before a database failover drill?"
    res = Searcher(store, embedder).search(p, query, deadline_ms=10_000)
    assert [h.id for h in res.results] == ["long"]
    assert "failover drill" in res.results[0].text and len(res.results[0].text) < len(body)
    assert res.results[0].passage > 0
    # ... and says it is one part of several, so a reader can tell it from the whole memory
    assert res.results[0].passages == len(split_passages(body)) > res.results[0].passage
    assert res.results[0].to_dict()["passages"] == res.results[0].passages


def test_a_question_about_the_wrong_person_finds_nothing(store, embedder):
    """The near miss: the topic is in the org, but someone else did it."""
    org = store.create_org("friends")
    key = mint_key(store, org.id, "r", frozenset({"memory:read"}), frozenset()).key
    notes = [
        ("Melanie", "Melanie ran a charity race for mental health last Saturday."),
        ("Melanie", "Melanie painted a lake sunrise last year."),
        ("Caroline", "Caroline attended an LGBTQ support group and found it inspiring."),
        ("Caroline", "Caroline is researching adoption agencies."),
    ]
    save_many(
        store,
        embedder,
        org.id,
        [(f"m{i}", MemoryDraft(body=b, title=t)) for i, (t, b) in enumerate(notes)],
        "t",
    )
    p = Principal(org.id, key.id, key.scopes, key.roles)
    searcher = Searcher(store, embedder)
    ask = {"k": 3, "deadline_ms": 10_000, "use_cache": False}  # not cut short by a loaded machine
    right = searcher.search(p, "Where did Melanie run a charity race?", **ask)
    wrong = searcher.search(p, "Where did Caroline run a charity race?", **ask)
    assert [h.id for h in right.results][:1] == ["m0"]
    assert wrong.results == []
    searcher.close()


def test_a_small_org_answers_a_strong_match_without_its_unrelated_memories(store, embedder):
    """In an org of three memories every memory is a candidate: the unrelated ones must not
    ride along with a strong match (session 3's collapsed model lifted them over the
    threshold; now they fall under `relative` of the best and `min_score`)."""
    p = _org(store, embedder, BODIES)
    searcher = Searcher(store, embedder)
    res = searcher.search(p, "which cluster is staging on?", k=3, deadline_ms=10_000)
    assert [h.id for h in res.results] == ["m1"]
    floors_off = dataclasses.replace(searcher.settings, relative=0.0, min_score=0.0)
    lenient = Searcher(store, embedder, floors_off)
    assert (
        len(lenient.search(p, "which cluster is staging on?", k=3, deadline_ms=10_000).results) > 1
    )
    searcher.close()
    lenient.close()


def test_the_passage_holding_an_identifier_the_query_names_comes_first(store, embedder):
    """QA, in a 20,000-memory org: `t13q` found `big-1349`, `big-1300` first. Among memories
    that differ by an incident number alone, the ranker put the one holding it under its
    lookalikes (t42q fourth, t77q behind t73q, t7q, t76q); the lexical stage alone found every
    one. And where the prompt's other words are what other memories say (a developer's
    sentence naming the incident), preselection left it out of the 12 inspected: for none of
    these 43 prompts was it found."""
    topics = ["deploys go through the ship script", "migrations run in the backfill job"]
    bodies = [f"Incident t{i}q: {topics[i % 2]}." for i in range(300)]
    bodies += [
        f"The payments ledger reconciliation batch compares Stripe payouts nightly, step {j}."
        for j in range(30)
    ]
    p = _org(store, embedder, bodies)
    searcher = Searcher(store, embedder)
    asked = {f"t{i}q": f"m{i}" for i in range(0, 300, 7)}
    asked |= {
        f"the payments ledger reconciliation batch missed Stripe payouts, like incident t{i}q": (
            f"m{i}"
        )
        for i in range(0, 300, 7)
    }
    for mode in ("hybrid", "lexical"):
        first = {q: searcher.search(p, q, 3, 10_000, mode).results[0].id for q in asked}
        assert first == asked, mode
    # A number is a quantity, not an identifier: "20 at a time" names no passage.
    assert QueryReading.read(["20", "t7q"], [], 300, {"20": 1, "t7q": 1}).identifiers == ["t7q"]
    searcher.close()


def test_a_hit_under_min_score_is_left_out_however_close_to_the_best(store, embedder):
    """The new-user pass: "what package manager for the web app?" in the three-memory org
    also listed the migrations note at 0.01, within `relative` of a 0.58 answer."""
    p = _org(
        store,
        embedder,
        [
            "Staging is the blue cluster",
            "Schema migrations go in a separate backfill job, never in the web deploy",
            "Use pnpm, not npm or yarn, for the web app",
        ],
    )
    searcher = Searcher(store, embedder)
    query = "what package manager for the web app?"
    res = searcher.search(p, query, k=3, deadline_ms=10_000, use_cache=False)
    assert [h.id for h in res.results] == ["m2"]
    lenient = Searcher(store, embedder, dataclasses.replace(searcher.settings, min_score=0.0))
    extra = lenient.search(p, query, k=3, deadline_ms=10_000, use_cache=False).results[1:]
    assert extra and all(h.score < searcher.settings.min_score for h in extra)
    searcher.close()
    lenient.close()


def test_a_memory_a_key_cannot_read_changes_nothing_it_gets(store, embedder):
    """What a key may not read must not change what it gets, nor what its answers score: the
    org's statistics counted a restricted memory's words as known to every reader, so
    questions about them stopped being refused and unrelated memories came back (QA, session
    6); and every query word was weighed against the org's passage total, so a key's scores
    moved with each write it could not see: it could watch them happen and gauge their size."""
    reader = _org(store, embedder, [*BODIES, "Access keys start with AKIA; rotate them yearly."])
    fraud = mint_key(store, reader.org_id, "f", frozenset({"memory:read"}), frozenset({"fraud"}))
    searcher = Searcher(store, embedder)
    questions = [
        "which cluster is staging on?",
        "where is the kafka schema registry for the fraud team",
        "what port does the fraud schema registry use",
        "fraud team kafka registry hostname",
        "do we use npm for the web app",
    ]

    def answers(who: Principal) -> list[list[tuple[str, float]]]:
        """Each question's hits and their scores as the key is answered them, to four places:
        the exact vector scan's float32 cosines can move in the ninth with the number of rows
        it multiplies, the key's or not (BLAS blocking, not a statistic). Never cut short:
        at the default 1 s, a loaded machine answered one of them from the lexical stage
        alone, unlike the same question before the write (QA: m3, m1, m0, m2 for m2)."""
        found = [searcher.search(who, q, deadline_ms=10_000, use_cache=False) for q in questions]
        assert not any(res.degraded for res in found)
        return [[(h.id, round(h.score, 4)) for h in res.results] for res in found]

    def hidden(memory_id: str, body: str, *audiences: str) -> tuple[str, MemoryDraft]:
        return memory_id, MemoryDraft(body=body, audiences=audiences)

    before = answers(reader)
    assert before[0][0][0] == "m1" and before[4][0][0] == "m2"
    registry = "The fraud team's Kafka schema registry is at schemas.fraud.internal:8081."
    save(store, embedder, reader.org_id, *hidden("registry", registry, "fraud"), "t", "create")
    assert answers(reader) == before
    k = fraud.key
    found = [[i for i, _ in a] for a in answers(Principal(k.org_id, k.id, k.scopes, k.roles))]
    assert found[0] == ["m1"]
    assert all(a and a[0] == "registry" for a in found[1:4])

    moved = "Fraud's schema registry moved to registry.fraud.internal, port 8081 still. " * 3
    save(store, embedder, reader.org_id, *hidden("registry", moved, "fraud", "legal"), "t", "edit")
    assert answers(reader) == before
    batch = [
        hidden("legal1", "Legal keeps the web app's npm licence audit in the vault.", "legal"),
        hidden("legal2", "The staging cluster holds a legal hold snapshot.", "legal", "fraud"),
    ]
    save_many(store, embedder, reader.org_id, batch, "t")
    assert answers(reader) == before
    for memory_id in ("registry", "legal1", "legal2"):
        store.delete_memory(reader.org_id, memory_id, "t", None)
    assert answers(reader) == before
    searcher.close()


def test_the_threshold_the_docs_and_help_name_is_the_default():
    from relay.settings import SERVER_SETTINGS

    default = SearchSettings().threshold
    (setting,) = [s for s in SERVER_SETTINGS if s.name == "threshold"]
    assert f"default {default}," in setting.help
    docs = (Path(__file__).parent.parent / "docs/http-api.md").read_text()
    assert f"the default,\n{default}, is calibrated" in docs
    # The hook cannot import relay.search: its min_score help and docs name the number.
    from relay.hook.config import SETTINGS

    (min_score,) = [help_text for name, _, _, help_text in SETTINGS if name == "min_score"]
    assert f"server's threshold ({default})" in min_score
    hook_docs = (Path(__file__).parent.parent / "docs/hook.md").read_text()
    assert f"the server's threshold ({default}," in hook_docs


def test_a_common_word_never_counts_more_passages_than_the_reader_has(store):
    """At `SEEN_CAP` the org's count of a word stands, and it may count passages the reader
    may not read: it is clamped to the reader's total, so the pair stays one reader's and no
    weight falls below log 2 (that of a word in every passage the reader has)."""
    org = store.create_org("acme").id
    vector = np.full(384, 1 / np.sqrt(384), dtype="<f4")

    def memories(prefix: str, n: int, *audiences: str) -> None:
        items = [
            (
                f"{prefix}{i}",
                MemoryDraft(body=f"deploy {prefix} {i}", audiences=audiences),
                [
                    PassageInput(
                        0,
                        f"deploy {prefix} {i}",
                        f"deploy {prefix} {i}",
                        f"{prefix}{i}",
                        vector.tobytes(),
                    )
                ],
            )
            for i in range(n)
        ]
        store.save_memories(org, items, "t", "upsert")

    memories("open", SEEN_CAP + 5, "all")
    memories("hidden", 200, "fraud")
    reader = frozenset({"all"})
    _, df = store.doc_freq(org, ["deploy", "open", "hidden"])
    assert df == {"deploy": SEEN_CAP + 205, "open": SEEN_CAP + 5, "hidden": 200}
    total, known = seen(store, org, reader, datetime.now(UTC), df)
    assert total == SEEN_CAP + 5
    assert known == {"deploy": total, "open": total}
    weights = QueryReading.read(["deploy", "open"], [], total, known).weights
    assert weights["deploy"] == pytest.approx(math.log(2))


def test_a_memory_written_twice_comes_back_once_and_k_stays_distinct(store, embedder):
    """Two memories with one text (a fact remembered by two teammates, a file imported from
    two places) both came back, and the hook injected both. One is kept: the first written
    of equals; a copy differing only in whitespace is the same text. Collapsing before the
    cut to k still returns k distinct texts when the candidates hold that many."""
    p = _org(store, embedder, BODIES)
    staging = BODIES[1]
    save(store, embedder, p.org_id, "copy", MemoryDraft(body=staging, source="b"), "t", "create")
    spaced = MemoryDraft(body=staging.replace(" ", "  ").replace("; ", ";\n"), source="c")
    save(store, embedder, p.org_id, "spaced", spaced, "t", "create")
    searcher = Searcher(store, embedder)
    query = "which cluster is staging on?"
    res = searcher.search(p, query, k=3, deadline_ms=10_000, use_cache=False)
    assert [h.id for h in res.results] == ["m1"]
    lenient = Searcher(
        store, embedder, dataclasses.replace(searcher.settings, relative=0.0, min_score=0.0)
    )
    hits = lenient.search(p, query, k=3, deadline_ms=10_000, use_cache=False).results
    texts = [" ".join(h.text.split()) for h in hits]
    assert len(hits) == 3 and len(set(texts)) == 3, [(h.id, h.score) for h in hits]
    assert hits[0].id == "m1" and {h.id for h in hits[1:]} == {"m0", "m2"}
    searcher.close()
    lenient.close()


def test_the_same_words_under_two_titles_are_two_hits(store, embedder):
    """A title is part of what a hit says: "use the blue cluster" under Staging and under
    Production are two facts, and collapsing them by text alone dropped one."""
    body = "Deploys go to the blue cluster; the green one is being retired."
    drafts = [MemoryDraft(body=body, title=t, source="ops") for t in ("Staging", "Production")]
    p = _org(store, embedder, [])
    for i, draft in enumerate(drafts):
        save(store, embedder, p.org_id, f"t{i}", draft, "t", "create")
    searcher = Searcher(store, embedder)
    hits = searcher.search(p, "which cluster do deploys go to?", k=3, deadline_ms=10_000).results
    assert sorted(h.title for h in hits) == ["Production", "Staging"]
    searcher.close()


@pytest.mark.parametrize("query", ["+++++++++++++++++++++", "\\\\\\\\\\\\\\\\", "?!", "do it"])
def test_a_query_without_a_word_to_look_for_gets_nothing(store, embedder, query):
    """ "+++++" has no word to look for, yet its embedding landed near a rule (0.44 on the
    coding rules): `relay search` and MCP recall returned it. However lenient the cut."""
    p = _org(store, embedder, BODIES)
    any_score = dataclasses.replace(SearchSettings(), threshold=0.0, relative=0.0, min_score=0.0)
    searcher = Searcher(store, embedder, any_score)
    res = searcher.search(p, query, k=3, deadline_ms=10_000, use_cache=False)
    assert res.results == [] and not res.degraded
    assert searcher.search(p, "staging cluster", k=3, deadline_ms=10_000).results  # the cut
    searcher.close()
