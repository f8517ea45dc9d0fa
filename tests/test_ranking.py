"""How search reads a query and judges a candidate: the features behind the calibrated score."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relay.bench_recall import memory_drafts
from relay.models import Passage
from relay.ranking import (
    Features,
    Model,
    Preselect,
    QueryReading,
    Weights,
    candidate_features,
    judge,
    pool_features,
    preselect,
    sigmoid,
)
from relay.search import SearchSettings
from relay.text import proper_names, query_terms, subject_terms


def passage(text: str, title: str | None = None, rowid: int = 1) -> Passage:
    from relay.text import lexical_terms

    lexical = " ".join(lexical_terms(f"{title}\n{text}" if title else text))
    return Passage(rowid, f"m{rowid}", 1, 0, title, None, text, lexical, datetime.now(UTC))


def reading(query: str, df: dict[str, int], total: int = 100) -> QueryReading:
    return QueryReading.read(query_terms(query), proper_names(query), total, df)


def test_the_subject_is_the_head_of_a_title_or_a_transcript_line():
    assert {"caroline"} <= subject_terms(None, "Caroline: I went to a support group.")
    assert "melanie" in subject_terms("Melanie · 1:56 pm on 8 May, 2023", "Hey Caroline!")
    assert "migration" in subject_terms("Migrations", "Run them in a separate job.")
    assert "caroline" not in subject_terms(None, "Melanie ran a charity race with Caroline.")


def test_a_passage_about_someone_else_is_off_subject_and_a_rival():
    r = reading(
        "What did Caroline realize after her charity race?",
        {"caroline": 50, "realize": 3, "charity": 4, "race": 4},
    )
    about_her = passage("Caroline likes to paint landscapes.", rowid=1)
    about_him = passage("Melanie ran a charity race and realized self-care matters.", rowid=2)
    f_her, f_him = candidate_features(r, [about_her, about_him], [0.30, 0.60], 0.10)
    assert f_him.off_subject == 1.0 and f_her.off_subject == 0.0
    assert f_her.rival > 0.3  # someone else's passage matches the topic far better
    assert f_him.rival == 0.0


def test_a_topic_only_someone_else_talks_about_is_said_elsewhere():
    df = {"caroline": 50, "melanie": 50, "charity": 2, "race": 3, "paint": 9}
    her = passage("Caroline likes to paint landscapes.", rowid=1)
    him = passage("Melanie ran a charity race for mental health.", rowid=2)
    wrong = candidate_features(
        reading("What did Caroline do after her charity race?", df), [her, him], [0.5, 0.5], 0.1
    )
    right = candidate_features(
        reading("What did Melanie do after her charity race?", df), [her, him], [0.5, 0.5], 0.1
    )
    # Query-level: every candidate of the wrong-person question carries it, none of the other.
    assert all(f.topic_elsewhere > 0.5 and f.words_elsewhere > 0.5 for f in wrong)
    assert all(f.topic_elsewhere == 0.0 and f.words_elsewhere == 0.0 for f in right)
    settings = SearchSettings()
    assert max(judge(wrong, settings)) < max(judge(right, settings))


def test_the_wrong_person_gate_holds_when_only_the_lexical_stage_ran():
    df = {"caroline": 50, "melanie": 50, "charity": 2, "race": 3, "paint": 9}
    her = passage("Caroline likes to paint landscapes.", rowid=1)
    him = passage("Melanie ran a charity race for mental health.", rowid=2)
    settings = SearchSettings()

    def best(query: str) -> float:
        fs = candidate_features(reading(query, df), [her, him], [None, None], 0.0)
        return max(judge(fs, settings))

    assert best("What did Caroline do after her charity race?") < settings.threshold
    assert best("What did Melanie do after her charity race?") >= settings.threshold


def test_the_wrong_person_gate_needs_a_name_the_org_knows():
    """A name the org never mentions is a foreign question (`unknown_names`), not a near miss."""
    r = reading("What did Gina do after her charity race?", {"charity": 2, "race": 3})
    him = passage("Melanie ran a charity race for mental health.")
    (f,) = candidate_features(r, [him], [0.5], 0.1)
    assert f.topic_elsewhere == 0.0 and f.words_elsewhere == 0.0


def test_no_wrong_person_when_no_candidate_is_about_the_name_asked_about():
    """A nickname or a capitalised word ("Mel", "July") is not someone the org writes about."""
    r = reading("What did Mel paint in July?", {"mel": 2, "july": 30, "paint": 9})
    about_her = passage("Melanie painted a lake sunrise.", title="Melanie · 8 July, 2023")
    (f,) = candidate_features(r, [about_her], [0.5], 0.1)
    assert f.topic_elsewhere == 0.0 and f.words_elsewhere == 0.0


def test_names_the_org_never_mentions_are_unknown():
    r = reading("Who did Maria have dinner with?", {"dinner": 5})
    assert r.unknown_names == 1.0
    assert reading("Who did Maria have dinner with?", {"maria": 9}).unknown_names == 0.0


def test_task_words_the_org_never_wrote_are_not_held_against_a_matching_memory():
    """Developer prompts carry words no memory has ('orders', 'table'): a memory that says
    what the prompt is about must still clear the default threshold."""
    settings = SearchSettings()
    df = {"migration": 3, "schema": 1}
    r = reading("where should I put the schema migration for the orders table?", df, total=40)
    memory = passage(
        "Database migrations run in a separate backfill job, never inside the web deploy.",
        title="Migrations",
    )
    (f,) = candidate_features(r, [memory], [0.45], 0.05)
    assert judge([f], settings)[0] >= settings.threshold


def test_relevance_without_a_cosine_uses_the_lexical_model():
    settings = SearchSettings()
    f = Features(cosine=None, coverage=1.0, missing_names=0.0)
    g = Features(cosine=None, coverage=0.0, missing_names=1.0)
    assert judge([f], settings)[0] > judge([g], settings)[0]
    # Within one query the ranker orders them the same way, and the best carries the gate.
    better, worse = judge([g, f], settings)[::-1]
    assert better > worse


def test_the_gate_judges_a_query_once_from_its_best_candidate():
    """The best candidate's score is the gate; the others are discounted by their ranker
    probability against the best's, so a weak candidate neither lifts nor lowers the
    judgement of the query."""
    model = Model(
        ranker=Weights(bias=-2.0, coverage=4.0),
        gate=Weights(bias=-3.0, missing_names=-1.0),
        on_ranker=1.0,
    )
    settings = SearchSettings(lexical=model)
    strong = Features(cosine=None, coverage=1.0, missing_names=0.0)
    weak = Features(cosine=None, coverage=0.25, missing_names=1.0)
    scores = judge([weak, strong], settings)
    gate = sigmoid(-3.0 + 2.0)  # the gate's bias plus on_ranker times the best's ranker logit
    assert scores[1] == pytest.approx(gate)
    assert scores[0] == pytest.approx(gate * sigmoid(-1.0) / sigmoid(2.0))
    assert judge([strong], settings) == pytest.approx([gate])
    assert judge([], settings) == []


def test_a_transcript_line_carries_the_line_it_answers_in_its_title():
    rows = [
        {
            "store": "c",
            "id": "1",
            "text": "Ann: What did you research?",
            "meta": {"session": 1, "speaker": "Ann"},
        },
        {
            "store": "c",
            "id": "2",
            "text": "Bo: Adoption agencies!",
            "meta": {"session": 1, "speaker": "Bo"},
        },
        {"store": "c", "id": "3", "text": "Bo: Hi again.", "meta": {"session": 2, "speaker": "Bo"}},
        {
            "store": "c",
            "id": "4",
            "text": "Bo went hiking.",
            "meta": {"session": 2, "speaker": "Bo"},
        },
    ]
    drafts = [d for _, d in memory_drafts(rows)]
    assert drafts[1].body == "Bo: Adoption agencies!"
    assert drafts[1].title == "Bo · re Ann: What did you research?"
    assert drafts[2].title == "Bo"  # a new session starts without context
    assert drafts[3].title == "Bo"  # a note (not "Name: ...") gets no reply context


def test_the_pool_is_preselected_by_late_interaction_when_every_member_has_it():
    lexical = [(1, 9.0), (2, 8.0), (3, 7.0)]
    semantic = [(2, 0.62), (4, 0.60)]
    maxsim = {1: 0.30, 2: 0.40, 3: 0.90, 4: 0.35}
    pool = pool_features(lexical, semantic, maxsim)
    assert list(pool) == [1, 2, 3, 4]  # the stages' order
    # A member only the lexical stage proposed takes the weakest cosine the semantic one did.
    assert pool[1][0] == pool[3][0] == 0.60 and pool[2][0] == 0.62
    assert pool[3][2:] == (1 / 3, 0.0) and pool[2][2:] == (1 / 2, 1.0)
    settings = SearchSettings(
        candidates=2,
        preselect=Preselect(cosine=0.0, maxsim=1.0, lexical_rank=0.0, semantic_rank=0.0),
    )
    assert preselect(lexical, semantic, pool, settings) == [3, 2]


def test_without_late_interaction_the_pool_is_fused_by_rank():
    lexical = [(1, 9.0), (2, 8.0), (3, 7.0)]
    semantic = [(2, 0.62), (4, 0.60)]
    assert pool_features(lexical, semantic, {}) == {}
    settings = SearchSettings(candidates=3, rrf_k=5)
    # 2 is proposed by both stages (1/7 + 1/6); then 1, first of one stage (1/6); then 4 (1/7).
    assert preselect(lexical, semantic, {}, settings) == [2, 1, 4]
