"""The search pipeline: one bounded attempt from query to a few passages, or none.

    authorize (caller) -> cache -> lexical candidates (SQL, access-filtered)
                                || semantic candidates (embedding + vectors, in a worker)
    -> the <= 12 best candidates by reciprocal-rank fusion
    -> re-fetched through the access filter -> scored with a calibrated model
    -> relevance threshold -> best passage per memory -> top k
    -> those within `relative` of the best

Fused rank scores have no absolute meaning, so the threshold is applied to a
calibrated relevance estimate instead: a logistic model over a dozen cheap
features of each inspected candidate (see `Features`). They read the query the
way a person would: how much closer this passage is than the org's background
(`lift`), whether it says the rare words the query says (`coverage`,
`absent_rarest`), whether the people or things the query names are in it and
are what it is about (`missing_names`, `off_subject`), whether a passage about
someone else matches the topic much better (`rival`), whether the query's topic is
said only, or said better, by passages about someone else than about the person it
asks about (`topic_elsewhere`, `words_elsewhere`: a question about the wrong person),
and whether the query names things this organisation has never written down at all
(`unknown_names`), and how well each query word finds its match among the passage's
words (`maxsim`, late interaction over stored token matrices: relay.late).
The weights are fixed settings (`SearchSettings.hybrid`, `.pooled`, `.lexical`) fitted by
scripts/calibrate.py on development splits only, never on the queries a
benchmark reports.

The semantic stage runs in a worker thread while the lexical stage runs in the
request's thread; if the semantic stage cannot finish inside the deadline the
answer is lexical-only and says so (`degraded`). Nothing waits past the deadline.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import astuple, dataclass, field
from datetime import UTC, datetime
from typing import Literal

import numpy as np

from relay.cache import ResultCache
from relay.embedding import Embedder, QueryStates
from relay.errors import InvalidRequestError
from relay.late import QueryPieces
from relay.models import Passage, Principal, iso
from relay.store import Store
from relay.text import proper_names, query_terms, subject_terms, word_spans

Mode = Literal["hybrid", "lexical", "semantic"]
MODES: tuple[Mode, ...] = ("hybrid", "lexical", "semantic")
MAX_K = 12
MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class Weights:
    """A logistic model over `Features`: relevance = sigmoid(bias + sum(weight * feature))."""

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


# Fitted by scripts/calibrate.py on the development splits (first 3 stores of each LoCoMo
# folder, odd-numbered conversations of coding_prompts); see BENCHMARKS.md "Recall".
HYBRID_WEIGHTS = Weights(
    bias=-6.443,
    cosine=0.849,
    lift=2.981,
    gap=-3.069,
    coverage=0.133,
    missing_names=-0.205,
    off_subject=-2.295,
    rival=-2.367,
    unknown_names=-0.486,
    absent_rarest=1.347,
    absent_second=-0.003,
    unknown_terms=0.508,
    unknown_share=-2.22,
    # Not fitted (a likelihood fit weighs it far too little to abstain): the wrong-person
    # gate, the most dev adversarial abstention that costs at most 2 points of dev recall@3
    # on either LoCoMo folder at the default threshold (BENCHMARKS.md "Recall").
    topic_elsewhere=-7.0,
    words_elsewhere=-4.0,
    maxsim=7.952,
)
# The same fit without MaxSim: for a query whose candidates' token matrices are not all
# backfilled yet (a store written before relay.late).
POOLED_WEIGHTS = Weights(
    bias=-4.816,
    cosine=3.231,
    lift=3.107,
    gap=-1.936,
    coverage=3.954,
    missing_names=0.41,
    off_subject=-2.022,
    rival=-2.357,
    unknown_names=-0.803,
    absent_rarest=1.836,
    absent_second=-0.249,
    unknown_terms=0.535,
    unknown_share=-2.146,
    topic_elsewhere=-7.0,
    words_elsewhere=-4.0,
)
LEXICAL_WEIGHTS = Weights(
    bias=-3.561,
    coverage=5.126,
    missing_names=-0.746,
    off_subject=-2.228,
    rival=-12.305,
    unknown_names=-1.599,
    absent_rarest=2.448,
    absent_second=0.199,
    unknown_terms=0.268,
    unknown_share=-2.205,
    topic_elsewhere=-7.0,  # the same rule on lexical-only runs picks the same gate
    words_elsewhere=-4.0,
)


@dataclass(frozen=True)
class SearchSettings:
    """Retrieval settings; part of every cache key."""

    candidates: int = 12  # passages inspected after fusion
    first_stage: int = 40  # candidates each stage proposes
    rrf_k: int = 5  # small: a stage's top few count for more than agreement far down
    hybrid: Weights = HYBRID_WEIGHTS  # calibrated relevance when cosine and MaxSim are known
    pooled: Weights = POOLED_WEIGHTS  # ... the cosine only (token matrices not backfilled yet)
    lexical: Weights = LEXICAL_WEIGHTS  # ... and when only the lexical stage ran
    threshold: float = 0.1  # the highest that costs <= 1 point of dev recall@3 (BENCHMARKS.md)
    # ... and at least this share of the best result's score: where the best is a strong
    # match, the model lifts every candidate of the query (a query-level signal), and in a
    # small org that let unrelated memories through. The highest share that costs at most
    # 0.5 point of dev recall@5 on every folder (BENCHMARKS.md).
    relative: float = 0.3
    min_budget_ms: float = 5.0  # below this the request is answered with nothing

    def fingerprint(self) -> tuple[object, ...]:
        return astuple(self)


@dataclass(frozen=True)
class Hit:
    id: str
    revision: int
    title: str | None
    source: str | None
    text: str
    score: float
    updated_at: datetime
    passage: int

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "revision": self.revision,
            "title": self.title,
            "source": self.source,
            "text": self.text,
            "score": round(self.score, 4),
            "updated_at": iso(self.updated_at),
            "passage": self.passage,
        }


@dataclass
class SearchResponse:
    results: list[Hit]
    stages: list[str]
    degraded: bool = False
    cached: bool = False
    took_ms: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "results": [h.to_dict() for h in self.results],
            "stages": self.stages,
            "degraded": self.degraded,
            "cached": self.cached,
            "took_ms": round(self.took_ms, 2),
        }


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


def idf(total: int, df: int) -> float:
    return math.log(1 + (total + 1) / (df + 1))


def relevance(f: Features, s: SearchSettings) -> float:
    w = s.lexical if f.cosine is None else s.pooled if f.maxsim is None else s.hybrid
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
    )
    if f.cosine is not None:
        z += w.cosine * f.cosine + w.lift * f.lift + w.gap * f.gap
    if f.maxsim is not None:
        z += w.maxsim * f.maxsim
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


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
        )


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
            )
        )
    return out


def _share(terms: list[str], have: set[str], weights: dict[str, float]) -> float:
    total = sum(weights[t] for t in terms)
    return sum(weights[t] for t in terms if t in have) / total if total else 0.0


class Searcher:
    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        settings: SearchSettings | None = None,
        cache: ResultCache | None = None,
        workers: int = 2,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings or SearchSettings()
        self.cache = cache
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relay-semantic")
        self._semantic_ms = 10.0  # running estimate of the semantic stage's cost
        # Called with (query, [(passage, features, relevance)]) for every search: calibration.
        self.observe: Callable[[str, list[tuple[Passage, Features, float]]], None] | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def search(
        self,
        principal: Principal,
        query: str,
        k: int = 5,
        deadline_ms: float = 1000.0,
        mode: Mode = "hybrid",
        use_cache: bool = True,
    ) -> SearchResponse:
        start = time.monotonic()
        deadline = start + deadline_ms / 1000.0
        query = (query or "").strip()[:MAX_QUERY_CHARS]
        if mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {', '.join(MODES)}")
        if not 1 <= k <= MAX_K:
            raise InvalidRequestError(f"k must be between 1 and {MAX_K}")
        if not query:
            raise InvalidRequestError("query is empty")
        if mode != "lexical" and self.embedder is None:
            mode = "lexical"
        org = principal.org_id
        cache_key: Hashable = (
            org,
            principal.key_id,
            principal.roles,
            principal.scopes,
            self.settings.fingerprint(),
            mode,
            k,
            query,
        )
        generation = self.store.generation(org)
        if use_cache and self.cache is not None:
            hit = self.cache.get(cache_key, generation)
            if hit is not None:
                return SearchResponse(
                    list(hit.results), list(hit.stages), False, True, _ms(start), {}
                )
        response = self._run(principal, query, k, deadline, mode, start)
        if use_cache and self.cache is not None and not response.degraded:
            expiry = self.store.next_expiry(org, datetime.now(UTC))
            self.cache.put(cache_key, generation, response, expiry.timestamp() if expiry else None)
        return response

    def _run(
        self, principal: Principal, query: str, k: int, deadline: float, mode: Mode, start: float
    ) -> SearchResponse:
        s = self.settings
        now = datetime.now(UTC)
        audiences = principal.audiences
        org = principal.org_id
        timings: dict[str, float] = {}
        stages: list[str] = []
        degraded = False
        if _left_ms(deadline) < s.min_budget_ms:
            return SearchResponse([], [], True, False, _ms(start), timings)

        future = None
        if mode != "lexical":
            if _left_ms(deadline) > self._semantic_ms * 1.5:
                future = self._pool.submit(self._semantic, org, audiences, now, query)
            else:
                degraded = True
        terms = query_terms(query)
        lexical: list[tuple[int, float]] = []
        if mode != "semantic":
            t = time.monotonic()
            lexical = self.store.lexical_search(org, audiences, now, terms, s.first_stage)
            timings["lexical_ms"] = _ms(t)
            stages.append("lexical")
        semantic: list[tuple[int, float]] = []
        qvec = None
        qstates: QueryStates | None = None
        if future is not None:
            try:
                qstates, semantic, took = future.result(
                    timeout=max(0.0, _left_ms(deadline) - 3) / 1000
                )
                qvec = qstates.vector
                timings["semantic_ms"] = took
                stages.append("semantic")
                with self._lock:
                    self._semantic_ms = 0.8 * self._semantic_ms + 0.2 * took
            except FutureTimeout:
                future.cancel()
                degraded = True
        if mode == "semantic" and qvec is None:
            return SearchResponse([], stages, True, False, _ms(start), timings)

        # Reciprocal-rank fusion only chooses which few candidates to inspect.
        fused: dict[int, float] = {}
        for ranking in (lexical, semantic):
            for rank, (rowid, _) in enumerate(ranking):
                fused[rowid] = fused.get(rowid, 0.0) + 1.0 / (s.rrf_k + rank + 1)
        chosen = sorted(fused, key=fused.__getitem__, reverse=True)[: s.candidates]
        t = time.monotonic()
        passages = self.store.passages(org, audiences, now, chosen)
        total, df = self.store.doc_freq(org, terms)
        cosines = dict(semantic)
        if qvec is not None:
            missing = [p.rowid for p in passages if p.rowid not in cosines]
            cosines.update(self._cosines(qvec, passages, missing))
        reading = QueryReading.read(terms, proper_names(query), total, df)
        # The weakest cosine the semantic stage proposed: this query's background in this org.
        background = min((c for _, c in semantic), default=0.0)
        features = candidate_features(
            reading,
            passages,
            [cosines.get(p.rowid) if qvec is not None else None for p in passages],
            background,
            _maxsims(qstates, query, reading, passages),
        )
        scored = [(p, f, relevance(f, s)) for p, f in zip(passages, features, strict=True)]
        if self.observe is not None:
            self.observe(query, scored)
        best: dict[str, Hit] = {}
        for p, _, score in scored:
            if score < s.threshold:
                continue
            if p.memory_id not in best or best[p.memory_id].score < score:
                best[p.memory_id] = Hit(
                    p.memory_id, p.revision, p.title, p.source, p.text, score, p.updated_at, p.seq
                )
        timings["score_ms"] = _ms(t)
        results = sorted(best.values(), key=lambda h: h.score, reverse=True)[:k]
        if results:
            floor = s.relative * results[0].score
            results = [h for h in results if h.score >= floor]
        return SearchResponse(results, stages, degraded, False, _ms(start), timings)

    def _semantic(self, org: str, audiences: frozenset[str], now: datetime, query: str):  # noqa: ANN202
        t = time.monotonic()
        assert self.embedder is not None
        states = self.embedder.read_query(query)
        hits = self.store.semantic_search(
            org, audiences, now, states.vector, self.settings.first_stage
        )
        return states, hits, _ms(t)

    @staticmethod
    def _cosines(qvec: np.ndarray, passages: list[Passage], rowids: list[int]) -> dict[int, float]:
        """Cosines for lexical-only candidates, from their stored vectors."""
        wanted = set(rowids)
        return {
            p.rowid: float(np.frombuffer(p.embedding, dtype="<f4") @ qvec)
            for p in passages
            if p.rowid in wanted and p.embedding is not None
        }


def _maxsims(
    states: QueryStates | None, query: str, reading: QueryReading, passages: list[Passage]
) -> list[float] | None:
    """Every inspected passage's MaxSim, or None unless all have a token matrix: one query
    is scored by one model, never half by each."""
    blobs = [p.tokens for p in passages if p.tokens is not None]
    if states is None or not blobs or len(blobs) < len(passages):
        return None
    words = [
        (start, end, reading.weights.get(term, 0.0) if term else 0.0)
        for start, end, term in word_spans(query)
    ]
    pieces = QueryPieces.read(states.states, states.spans, words)
    if pieces is None:
        return None
    return [pieces.maxsim(blob) for blob in blobs]


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000.0


def _left_ms(deadline: float) -> float:
    return (deadline - time.monotonic()) * 1000.0
