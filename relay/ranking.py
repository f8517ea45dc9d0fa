"""How a query's candidates are judged: which of the first stages' proposals to read, how
likely each is to answer the query, and whether the query has an answer here at all.

Fused rank scores have no absolute meaning, so the threshold is applied to a
calibrated estimate instead (`Model`): a logistic ranker over a dozen cheap
features of each inspected candidate (see `Features`), and a logistic gate over
the top one that says whether the query has an answer here at all. The features
read the query the way a person would: how much closer this passage is than the org's background
(`lift`), whether it says the rare words the query says (`coverage`,
`absent_rarest`), whether the people or things the query names are in it and
are what it is about (`missing_names`, `off_subject`), whether a passage about
someone else matches the topic much better (`rival`), whether the query's topic is
said only, or said better, by passages about someone else than about the person it
asks about (`topic_elsewhere`, `words_elsewhere`: a question about the wrong person),
and whether the query names things this organisation has never written down at all
(`unknown_names`), and how well each query word finds its match among the passage's
words (`maxsim`, late interaction over stored token matrices: relay.late), and whether it
holds an identifier the query names that hardly any other passage does (`identifier`).
The weights are fixed settings (`SearchSettings.hybrid`, `.pooled`, `.lexical`) fitted by
scripts/calibrate.py on development splits only, never on the queries a
benchmark reports; `identifier`'s is a rule (`IDENTIFIER_WEIGHT`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from relay.models import Passage
from relay.store import Store
from relay.text import identifier_shaped, subject_terms

if TYPE_CHECKING:
    from relay.search import SearchSettings


@dataclass(frozen=True)
class Weights:
    """A logistic model over `Features`: sigmoid(bias + sum(weight * feature))."""

    bias: float
    cosine: float = 0.0
    lift: float = 0.0
    gap: float = 0.0
    coverage: float = 0.0
    missing_names: float = 0.0
    off_subject: float = 0.0
    rival: float = 0.0
    unknown_names: float = 0.0
    absent_rarest: float = 0.0
    absent_second: float = 0.0
    unknown_terms: float = 0.0
    unknown_share: float = 0.0
    topic_elsewhere: float = 0.0
    words_elsewhere: float = 0.0
    maxsim: float = 0.0
    identifier: float = 0.0


@dataclass(frozen=True)
class Model:
    """Two logistic models over `Features`, kept apart because they answer different questions.

    ranker     orders one query's candidates: P(this candidate is relevant)
    gate       judges the query once, from its top candidate (by the ranker): P(there is an
               answer among these candidates). It sees that candidate's features again and
               its ranker logit (weight `on_ranker`), so it can weigh what tells a near miss
               from an answer (names, the org's background) differently from what orders
               candidates. The relevance threshold applies to the gate alone: one decision
               per query, so a strong match never lifts the other candidates over it.

    A hit's score is the gate times its ranker probability relative to the top candidate's:
    the top hit carries the gate, the others are discounted by how much weaker they are.
    """

    ranker: Weights
    gate: Weights
    on_ranker: float


# Fitted by scripts/calibrate.py on the development splits (first 3 stores of each LoCoMo
# folder, odd-numbered conversations of coding_prompts); see BENCHMARKS.md "Recall".
# The gate's `topic_elsewhere` and `words_elsewhere` (the wrong-person gate) are not fitted
# (a likelihood fit weighs them far too little to abstain): calibrate.py fits the gate around
# a fixed reference (its FIT_AROUND), and scripts/tune.py rules chooses them with the threshold.
# A query word shaped like an identifier (`relay.text.identifier_shaped`: `t13q`, `v2`,
# `boto3`, an error code) that at most this many passages the reader may see hold names
# those passages: they are what the query asks for. The fitted ranker never met such a query
# (its questions are paraphrases, where a rare word is as often not in the answer: 291 of
# the 609 locomo_observations questions with a word one passage holds have it in a gold
# memory), and with the word's `coverage` and `absent_rarest` pulling against each other it
# ranked the one passage holding `t42q` fourth of 12 lookalikes (`t422q`, `t424q`, ...).
# Not fitted: a rule, with a weight larger than the spread of the ranker's other terms, so
# such a passage comes first; the gate, which judges whether there is an answer at all,
# weighs it not (it sees the ranker's logit, so through `on_ranker` a little).
IDENTIFIER_DF = 3
IDENTIFIER_WEIGHT = 10.0

HYBRID = Model(
    ranker=Weights(
        bias=-8.75,
        cosine=-4.583,
        lift=4.225,
        gap=4.707,
        coverage=2.196,
        missing_names=-0.755,
        off_subject=-4.241,
        rival=-1.536,
        unknown_names=0.914,
        absent_rarest=2.59,
        absent_second=0.662,
        unknown_terms=0.27,
        unknown_share=-1.049,
        maxsim=9.588,
        identifier=IDENTIFIER_WEIGHT,
    ),
    gate=Weights(
        bias=-2.942,
        cosine=4.496,
        lift=-0.14,
        gap=-2.566,
        coverage=-1.177,
        missing_names=0.08,
        off_subject=-1.054,
        rival=4.872,
        unknown_names=-1.174,
        absent_rarest=0.459,
        absent_second=0.07,
        unknown_terms=0.334,
        unknown_share=-2.763,
        topic_elsewhere=-9.0,
        maxsim=3.76,
    ),
    on_ranker=0.206,
)
# The same fit without MaxSim: for a query whose candidates' token matrices are not all
# backfilled yet (a store written before relay.late).
POOLED = Model(
    ranker=Weights(
        bias=-6.298,
        cosine=-1.386,
        lift=4.164,
        gap=5.364,
        coverage=6.178,
        missing_names=-0.674,
        off_subject=-3.896,
        rival=-0.264,
        unknown_names=0.651,
        absent_rarest=2.745,
        absent_second=0.332,
        unknown_terms=0.255,
        unknown_share=-1.006,
        identifier=IDENTIFIER_WEIGHT,
    ),
    gate=Weights(
        bias=-2.595,
        cosine=5.616,
        lift=0.594,
        gap=-1.948,
        coverage=0.769,
        missing_names=-0.053,
        off_subject=-1.858,
        rival=5.851,
        unknown_names=-0.928,
        absent_rarest=1.005,
        absent_second=-0.254,
        unknown_terms=0.335,
        unknown_share=-3.052,
        topic_elsewhere=-9.0,
    ),
    on_ranker=0.012,
)
LEXICAL = Model(
    ranker=Weights(
        bias=-10.047,
        coverage=9.417,
        missing_names=-1.054,
        off_subject=-4.09,
        rival=-5.582,
        unknown_names=1.228,
        absent_rarest=4.344,
        absent_second=0.83,
        unknown_terms=0.442,
        unknown_share=-2.04,
        identifier=IDENTIFIER_WEIGHT,
    ),
    gate=Weights(
        bias=0.249,
        coverage=1.461,
        missing_names=-0.881,
        off_subject=-1.305,
        rival=4.969,
        unknown_names=-2.04,
        absent_rarest=1.259,
        absent_second=-0.032,
        unknown_terms=-0.005,
        unknown_share=-2.437,
        topic_elsewhere=-9.0,
    ),
    on_ranker=0.199,
)


@dataclass(frozen=True)
class Preselect:
    """Which few of the first-stage pool (both stages' proposals, up to 80) the relevance
    model inspects: a logistic score over what is known of every member without reading
    its text, fitted on dev like `Model`. Reciprocal-rank fusion alone left the answer
    outside the 12 for 13% of held-out LoCoMo questions; late interaction (relay.late)
    over the whole pool finds many of them. Used only when every pool member has a token
    matrix; otherwise the pool is ordered by reciprocal-rank fusion.

    cosine         the semantic stage's cosine; a member only the lexical stage proposed
                   takes the weakest cosine the semantic stage proposed (it is below that)
    maxsim         late interaction with the query (relay.late)
    lexical_rank   1 / (1 + rank) in the lexical stage's list (rank from 0), 0 when it did
                   not propose it
    semantic_rank  the same for the semantic stage
    """

    cosine: float
    maxsim: float
    lexical_rank: float
    semantic_rank: float


PRESELECT = Preselect(cosine=0.983, maxsim=5.891, lexical_rank=1.596, semantic_rank=1.872)


@dataclass(frozen=True)
class Features:
    """What the relevance model sees of one candidate (all cheap, all from the <= 12 inspected).

    cosine         dense similarity to the query (None when the semantic stage did not run)
    lift           cosine minus the org's background for this query: the weakest cosine
                   the semantic stage proposed; some queries are close to everything
    gap            cosine minus the best inspected cosine: is this the closest one?
    coverage       IDF-weighted share of the query's content words the passage contains
    missing_names  share of the names the query asks about (and the org knows) not in it
    off_subject    the query names someone, but the passage's head (title, "Name:" prefix,
                   first words) is about someone or something else
    rival          how much better the best off-subject candidate matches the topic
    unknown_names  share of the query's names this org never mentions (query-level)
    absent_rarest  the rarest query word the passage lacks (IDF / max IDF), and the second
    unknown_terms  how many query words the org has never seen (at most 5; query-level)
    unknown_share  IDF-weighted share of the query the org has never seen (query-level)
    topic_elsewhere  how much more of the query's topic (its words other than names, IDF-
                   weighted) the best inspected passage about someone else says than the
                   best one about the person asked about (query-level: the wrong person)
    words_elsewhere  IDF-weighted share of the topic words that only passages about someone
                   else say (query-level)
    maxsim         late interaction (relay.late): each query word's best match among the
                   passage's words, IDF-weighted (None without the query's token states, or
                   when some inspected passage has no token matrix yet)
    identifier     1 when it holds an identifier the query names that at most IDENTIFIER_DF
                   passages the reader may see hold (`QueryReading.identifiers`), else 0
    """

    cosine: float | None
    coverage: float
    missing_names: float
    lift: float = 0.0
    gap: float = 0.0
    off_subject: float = 0.0
    rival: float = 0.0
    unknown_names: float = 0.0
    absent_rarest: float = 0.0
    absent_second: float = 0.0
    unknown_terms: float = 0.0
    unknown_share: float = 0.0
    topic_elsewhere: float = 0.0
    words_elsewhere: float = 0.0
    maxsim: float | None = None
    identifier: float = 0.0


def idf(total: int, df: int) -> float:
    return math.log(1 + (total + 1) / (df + 1))


def logit(w: Weights, f: Features) -> float:
    z = (
        w.bias
        + w.coverage * f.coverage
        + w.missing_names * f.missing_names
        + w.off_subject * f.off_subject
        + w.rival * f.rival
        + w.unknown_names * f.unknown_names
        + w.absent_rarest * f.absent_rarest
        + w.absent_second * f.absent_second
        + w.unknown_terms * f.unknown_terms
        + w.unknown_share * f.unknown_share
        + w.topic_elsewhere * f.topic_elsewhere
        + w.words_elsewhere * f.words_elsewhere
        + w.identifier * f.identifier
    )
    if f.cosine is not None:
        z += w.cosine * f.cosine + w.lift * f.lift + w.gap * f.gap
    if f.maxsim is not None:
        z += w.maxsim * f.maxsim
    return z


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def judge(features: list[Features], s: SearchSettings) -> list[float]:
    """Each candidate's score under one query's `Model` (see there): the best is the gate."""
    if not features:
        return []
    if any(f.cosine is None for f in features):
        model = s.lexical
    elif any(f.maxsim is None for f in features):
        model = s.pooled
    else:
        model = s.hybrid
    ranks = [logit(model.ranker, f) for f in features]
    top = max(range(len(ranks)), key=ranks.__getitem__)
    gate = sigmoid(logit(model.gate, features[top]) + model.on_ranker * ranks[top])
    best = sigmoid(ranks[top])
    return [gate * sigmoid(z) / best for z in ranks]


@dataclass(frozen=True)
class QueryReading:
    """What is known about the query before looking at any candidate."""

    terms: list[str]
    names: list[str]
    weights: dict[str, float]  # IDF per term
    max_idf: float
    known_names: list[str]
    unknown_names: float
    unknown_terms: float
    unknown_share: float
    identifiers: list[str]  # identifier-shaped terms at most IDENTIFIER_DF passages hold

    @classmethod
    def read(
        cls, terms: list[str], names: list[str], total: int, df: dict[str, int]
    ) -> QueryReading:
        weights = {t: idf(total, df.get(t, 0)) for t in terms}
        known = [t for t in terms if df.get(t, 0) > 0]
        all_weight = sum(weights.values())
        known_names = [n for n in names if df.get(n, 0) > 0]
        return cls(
            terms=terms,
            names=names,
            weights=weights,
            max_idf=math.log(total + 2),
            known_names=known_names,
            unknown_names=1 - len(known_names) / len(names) if names else 0.0,
            unknown_terms=float(min(len(terms) - len(known), 5)),
            unknown_share=1 - sum(weights[t] for t in known) / all_weight if all_weight else 0.0,
            identifiers=[
                t for t in terms if 0 < df.get(t, 0) <= IDENTIFIER_DF and identifier_shaped(t)
            ],
        )


# From this many passages the reader may see, a term is common knowledge in the org.
SEEN_CAP = 50


def seen(
    store: Store, org: str, audiences: frozenset[str], now: datetime, df: dict[str, int]
) -> tuple[int, dict[str, int]]:
    """The org's passage total and document frequencies as one reader may know them.

    The org's counts include memories this reader may not read. A word only those hold would
    make a question the reader's memories cannot answer look answerable (the gate reads which query
    words the org knows), and its weight would hint at what they say; the total, which every
    weight is taken against, would move with each write the reader may not see, so it could
    watch them happen and gauge their size. So the total is the reader's (the passages of
    the memories whose audiences meet its own, kept per audience set as they are written),
    and each term the org holds is counted again over the passages the reader may see, up
    to `SEEN_CAP`; at the cap the org's count stands (a common word tells nothing).
    """
    held = [t for t, n in df.items() if n > 0]
    total, counts = store.seen_doc_freq(org, audiences, now, held, SEEN_CAP)
    known = {}
    for t in held:
        # Never more than the reader's total: at the cap the org's count includes passages
        # the reader may not read, and may exceed it. Clamped, such a word weighs what a word
        # in every passage the reader has weighs (idf(n, n) = log 2, the least any word may;
        # max_idf stays the largest), so the pair stays one reader's. Scaling the org's count
        # by the reader's share of the org instead would tie the weight of every common word
        # to the org's total again, the figure this keeps from the reader.
        n = min(df[t] if counts[t] >= SEEN_CAP else counts[t], total)
        if n:
            known[t] = n
    return total, known


def candidate_features(
    reading: QueryReading,
    passages: list[Passage],
    cosines: list[float | None],
    background: float,
    maxsims: list[float] | None = None,
) -> list[Features]:
    """Features of every inspected candidate of one query (see `Features`)."""
    r = reading
    topic_terms = [t for t in r.terms if t not in r.names]
    topic_weight = sum(r.weights[t] for t in topic_terms)
    known = [c for c in cosines if c is not None]
    best_cosine = max(known) if known else 0.0
    heads: list[tuple[set[str], bool, float, float]] = []
    # Who says the query's topic: the best topic share, and its words, of passages about a
    # name the query asks about (and the org knows) and of passages about someone else.
    said = {True: 0.0, False: 0.0}
    said_words: dict[bool, set[str]] = {True: set(), False: set()}
    seen_about = False
    for p, cosine in zip(passages, cosines, strict=True):
        have = set(p.lexical.split())
        subject = subject_terms(p.title, p.text)
        off_subject = bool(r.names) and not any(n in subject for n in r.names)
        topic = (
            sum(r.weights[t] for t in topic_terms if t in have) / topic_weight
            if topic_weight
            else 0.0
        )
        if r.known_names:
            about = any(n in subject for n in r.known_names)
            seen_about |= about
            said[about] = max(said[about], topic)
            said_words[about].update(t for t in topic_terms if t in have)
        lift = cosine - background if cosine is not None else 0.0
        heads.append((have, off_subject, lift, lift + 0.25 * topic))
    # Only a question whose person some candidate is about can be about the wrong person
    # (a nickname or a capitalised word is not a person this org writes about).
    topic_elsewhere = max(0.0, said[False] - said[True]) if seen_about else 0.0
    only_elsewhere = said_words[False] - said_words[True] if seen_about else set()
    words_elsewhere = (
        sum(r.weights[t] for t in only_elsewhere) / topic_weight if topic_weight else 0.0
    )
    # A passage about the person asked about is a weak answer when a passage about someone
    # else matches the topic much better: the question is likely about the wrong person.
    off_topics = [topic for _, off, _, topic in heads if off]
    best_off = max(off_topics) if off_topics else None
    out = []
    for i, ((have, off_subject, lift, topic), cosine) in enumerate(
        zip(heads, cosines, strict=True)
    ):
        absent = sorted((r.weights[t] / r.max_idf for t in r.terms if t not in have), reverse=True)
        out.append(
            Features(
                cosine=cosine,
                coverage=_share(r.terms, have, r.weights),
                missing_names=(
                    sum(n not in have for n in r.known_names) / len(r.known_names)
                    if r.known_names
                    else 0.0
                ),
                lift=lift,
                gap=cosine - best_cosine if cosine is not None else 0.0,
                off_subject=float(off_subject),
                rival=max(0.0, best_off - topic)
                if best_off is not None and not off_subject
                else 0.0,
                unknown_names=r.unknown_names,
                absent_rarest=absent[0] if absent else 0.0,
                absent_second=absent[1] if len(absent) > 1 else 0.0,
                unknown_terms=r.unknown_terms,
                unknown_share=r.unknown_share,
                topic_elsewhere=topic_elsewhere,
                words_elsewhere=words_elsewhere,
                maxsim=maxsims[i] if maxsims is not None else None,
                identifier=float(any(t in have for t in r.identifiers)),
            )
        )
    return out


def _share(terms: list[str], have: set[str], weights: dict[str, float]) -> float:
    total = sum(weights[t] for t in terms)
    return sum(weights[t] for t in terms if t in have) / total if total else 0.0


# Every pool member's (cosine, maxsim, lexical_rank, semantic_rank): see `Preselect`.
PoolFeatures = dict[int, tuple[float, float, float, float]]


def pool_features(
    lexical: list[tuple[int, float]],
    semantic: list[tuple[int, float]],
    maxsim: dict[int, float],
) -> PoolFeatures:
    """(cosine, maxsim, lexical_rank, semantic_rank) of every pool member, in the stages'
    order (see `Preselect`); nothing without every member's MaxSim."""
    if not maxsim:
        return {}
    lexical_rank, semantic_rank = _ranks(lexical), _ranks(semantic)
    cosine, background = dict(semantic), background_cosine(semantic)
    return {
        rowid: (
            cosine.get(rowid, background),
            maxsim[rowid],
            _reciprocal(lexical_rank, rowid, 0),
            _reciprocal(semantic_rank, rowid, 0),
        )
        for rowid in dict.fromkeys([*lexical_rank, *semantic_rank])
    }


def preselect(
    lexical: list[tuple[int, float]],
    semantic: list[tuple[int, float]],
    pool: PoolFeatures,
    s: SearchSettings,
) -> list[int]:
    """The pool members the relevance model inspects, best first: by `s.preselect` over
    `pool_features`, or by reciprocal-rank fusion of the two stages without them."""
    if pool:
        w = s.preselect
        weights = (w.cosine, w.maxsim, w.lexical_rank, w.semantic_rank)
        score = {
            rowid: sum(a * b for a, b in zip(weights, x, strict=True)) for rowid, x in pool.items()
        }
    else:
        lexical_rank, semantic_rank = _ranks(lexical), _ranks(semantic)
        score = {
            rowid: _reciprocal(lexical_rank, rowid, s.rrf_k)
            + _reciprocal(semantic_rank, rowid, s.rrf_k)
            for rowid in dict.fromkeys([*lexical_rank, *semantic_rank])
        }
    return sorted(score, key=score.__getitem__, reverse=True)[: s.candidates]


def background_cosine(semantic: list[tuple[int, float]]) -> float:
    """The weakest cosine the semantic stage proposed: this query's background in this org."""
    return min((c for _, c in semantic), default=0.0)


def _ranks(stage: list[tuple[int, float]]) -> dict[int, int]:
    """Each proposal's rank (from 0) in one stage's list."""
    return {rowid: rank for rank, (rowid, _) in enumerate(stage)}


def _reciprocal(ranks: dict[int, int], rowid: int, k: int) -> float:
    rank = ranks.get(rowid)
    return 0.0 if rank is None else 1.0 / (k + rank + 1)
