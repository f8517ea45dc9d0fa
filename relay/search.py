"""The search pipeline: one bounded attempt from query to a few passages, or none.

    authorize (caller) -> cache -> lexical candidates (SQL, access-filtered)
                                || semantic candidates (embedding + vectors, in a worker)
    -> the <= 12 best of both stages' proposals by a preselection score (cosine,
       late interaction, stage ranks: nothing read but token matrices; `Preselect`),
       the few passages holding an identifier the query names always among them
    -> re-fetched through the access filter -> ranked, and the query judged, by a
       calibrated model -> relevance threshold on that judgement -> best passage per
       memory -> those within `relative` of the best -> one per text and title -> top k

How a candidate is judged, and the query with it, is `relay.ranking`.

The semantic stage runs in a worker thread while the lexical stage runs in the
request's thread; if the semantic stage cannot finish inside the deadline the
answer is lexical-only and says so (`degraded`). Nothing waits past the deadline.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Hashable, Iterable
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
from relay.ranking import (
    HYBRID,
    IDENTIFIER_DF,
    LEXICAL,
    POOLED,
    PRESELECT,
    Features,
    Model,
    PoolFeatures,
    Preselect,
    QueryReading,
    background_cosine,
    candidate_features,
    judge,
    pool_features,
    preselect,
    seen,
)
from relay.store import Store, connect_by
from relay.text import proper_names, query_terms, word_spans

Mode = Literal["hybrid", "lexical", "semantic"]
MODES: tuple[Mode, ...] = ("hybrid", "lexical", "semantic")
MAX_K = 12
MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class SearchSettings:
    """Retrieval settings; part of every cache key."""

    candidates: int = 12  # passages inspected after preselection
    first_stage: int = 40  # candidates each stage proposes
    preselect: Preselect = PRESELECT
    rrf_k: int = 5  # without token matrices: a stage's top few count for more than agreement
    hybrid: Model = HYBRID  # calibrated relevance when cosine and MaxSim are known
    pooled: Model = POOLED  # ... the cosine only (token matrices not backfilled yet)
    lexical: Model = LEXICAL  # ... and when only the lexical stage ran
    # The gate's threshold: the lowest that refuses >= 0.9 of dev questions about another
    # conversation, at the wrong-person weights chosen with it (scripts/tune.py rules;
    # BENCHMARKS.md "Recall"). A team that would rather miss than be told about the wrong
    # person serves 0.7 (`relay serve --threshold`): the lowest that refuses 0.8 of dev
    # near misses.
    threshold: float = 0.1
    # A hit must score at least this share of the best hit: in a small org every memory is
    # a candidate, and the unrelated ones should not ride along with the answer. The highest
    # share that costs at most 0.5 point of dev recall@5 on every folder (BENCHMARKS.md).
    relative: float = 0.02
    # ... and at least this score: a hit judged about 1 in 50 likely to be relevant is noise
    # to a reader, whatever the best scored (a 0.01 hit beside a 0.58 answer passed `relative`
    # in a three-memory org). The highest floor that, with `relative`, still costs at most
    # 0.5 point of dev recall@5 on every folder (scripts/tune.py rules).
    min_score: float = 0.02
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
    passages: int = 1  # how many its memory has: `passage` is one part of a longer memory

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
            "passages": self.passages,
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


Observer = Callable[[str, list[tuple[Passage, Features, float]], PoolFeatures], None]


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
        # Called for every search with (query, [(passage, features, score)] of the inspected,
        # `pool_features` of the pool): calibration.
        self.observe: Observer | None = None
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
        until: float | None = None,
    ) -> SearchResponse:
        """`until`: the monotonic time the caller's `deadline_ms` runs out, when its clock
        started before this call (the server's key check); else it starts here."""
        start = time.monotonic()
        deadline = start + deadline_ms / 1000.0 if until is None else until
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
        with connect_by(deadline):  # nor any wait for a database connection past it
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
                until = expiry.timestamp() if expiry else None
                self.cache.put(cache_key, generation, response, until)
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
        terms = query_terms(query)
        if not terms:
            # Not one word to look for ("+++++", a row of backslashes, "do it"): the query
            # asks nothing, yet its embedding lands near some memory (0.44 for "+++++" on
            # the coding rules). Nothing is the answer, and no stage needs to run for it.
            return SearchResponse([], [], False, False, _ms(start), timings)

        future = None
        if mode != "lexical":
            if _left_ms(deadline) > self._semantic_ms * 1.5:
                run = contextvars.copy_context().run  # the worker keeps the connection deadline
                future = self._pool.submit(run, self._semantic, org, audiences, now, query)
            else:
                degraded = True
        lexical: list[tuple[int, float]] = []
        if mode != "semantic":
            t = time.monotonic()
            lexical = self.store.lexical_search(org, audiences, now, terms, s.first_stage)
            timings["lexical_ms"] = _ms(t)
            stages.append("lexical")
        # While the semantic stage runs: what the query's words weigh in this org, and the
        # token matrices of the lexical stage's proposals (preselection reads the pool's).
        # Once it is done, one read for the whole pool costs less than two (PostgreSQL:
        # a transaction each).
        _, df = self.store.doc_freq(org, terms)
        total, df = seen(self.store, org, audiences, now, df)
        reading = QueryReading.read(terms, proper_names(query), total, df)
        named = self._identified(org, audiences, now, reading, mode)
        lexical += [(rowid, 0.0) for rowid in named if rowid not in dict(lexical)]
        matrices: dict[int, bytes] = {}
        if future is not None and lexical and not future.done():
            matrices = self.store.token_matrices(org, [r for r, _ in lexical])
        semantic: list[tuple[int, float]] = []
        qvec = None
        qstates: QueryStates | None = None
        if future is not None:
            try:
                # What follows the semantic stage (preselection, reading and judging the 12)
                # takes about 3 ms: keep 5 for it.
                qstates, semantic, took = future.result(
                    timeout=max(0.0, _left_ms(deadline) - 5) / 1000
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

        t = time.monotonic()
        background = background_cosine(semantic)
        proposed = list(dict.fromkeys([r for r, _ in lexical] + [r for r, _ in semantic]))
        maxsim = self._maxsims(org, qstates, query, reading, proposed, matrices)
        pool = pool_features(lexical, semantic, maxsim)
        chosen = preselect(lexical, semantic, pool, s)
        chosen = [*named, *(r for r in chosen if r not in named)][: s.candidates]
        timings["preselect_ms"] = _ms(t)
        t = time.monotonic()
        passages = self.store.passages(org, audiences, now, chosen)
        cosines = dict(semantic)
        if qvec is not None:
            missing = [p.rowid for p in passages if p.rowid not in cosines]
            cosines.update(self._cosines(qvec, passages, missing))
        features = candidate_features(
            reading,
            passages,
            [cosines.get(p.rowid) if qvec is not None else None for p in passages],
            background,
            [maxsim[p.rowid] for p in passages] if maxsim else None,
        )
        scored = list(zip(passages, features, judge(features, s), strict=True))
        if self.observe is not None:
            self.observe(query, scored, pool)
        results = answer([(p, score) for p, _, score in scored], s, k)
        timings["score_ms"] = _ms(t)
        return SearchResponse(results, stages, degraded, False, _ms(start), timings)

    def _identified(
        self,
        org: str,
        audiences: frozenset[str],
        now: datetime,
        reading: QueryReading,
        mode: Mode,
    ) -> list[int]:
        """The passages holding an identifier the query names (`QueryReading.identifiers`),
        always inspected: where the prompt's other words are what other memories say (a
        coding prompt ending "This looks like incident 4512 again." against 6,725 team
        rules, a question about the payments ledger naming incident `t77q`), the lexical
        stage proposed it (5th, 6th) and preselection, led by cosine and MaxSim, chose the
        others' 12. A few passages per identifier, one index lookup each, and only for a
        query that names one."""
        if mode == "semantic" or not reading.identifiers:
            return []
        named: dict[int, None] = {}
        for term in reading.identifiers:
            for rowid, _ in self.store.lexical_search(org, audiences, now, [term], IDENTIFIER_DF):
                named.setdefault(rowid, None)
        return list(named)[: self.settings.candidates]

    def _semantic(self, org: str, audiences: frozenset[str], now: datetime, query: str):  # noqa: ANN202
        t = time.monotonic()
        assert self.embedder is not None
        states = self.embedder.read_query(query)
        hits = self.store.semantic_search(
            org, audiences, now, states.vector, self.settings.first_stage
        )
        return states, hits, _ms(t)

    def _maxsims(
        self,
        org: str,
        states: QueryStates | None,
        query: str,
        reading: QueryReading,
        pool: list[int],
        matrices: dict[int, bytes],
    ) -> dict[int, float]:
        """Every pool member's MaxSim, or nothing unless all have a token matrix: one query
        is ranked and scored one way, never half by each. `matrices`: those already read."""
        if states is None or not pool:
            return {}
        words = [
            (start, end, reading.weights.get(term, 0.0) if term else 0.0)
            for start, end, term in word_spans(query)
        ]
        pieces = QueryPieces.read(states.states, states.spans, words)
        if pieces is None:
            return {}
        missing = [rowid for rowid in pool if rowid not in matrices]
        found = {**matrices, **self.store.token_matrices(org, missing)}
        if any(rowid not in found for rowid in pool):
            return {}
        return dict(zip(pool, pieces.maxsims([found[r] for r in pool]), strict=True))

    @staticmethod
    def _cosines(qvec: np.ndarray, passages: list[Passage], rowids: list[int]) -> dict[int, float]:
        """Cosines for lexical-only candidates, from their stored vectors."""
        wanted = set(rowids)
        return {
            p.rowid: float(np.frombuffer(p.embedding, dtype="<f4") @ qvec)
            for p in passages
            if p.rowid in wanted and p.embedding is not None
        }


def answer(scored: list[tuple[Passage, float]], s: SearchSettings, k: int) -> list[Hit]:
    """What a query's judged candidates give: nothing when the best is under the threshold;
    otherwise each memory's best passage within `relative` of the best and scoring at least
    `min_score`, one of each text under one title, the top k."""
    top = max((score for _, score in scored), default=0.0)
    if top < s.threshold:
        return []
    best: dict[str, Hit] = {}
    for p, score in scored:
        if score < s.relative * top or score < s.min_score:
            continue
        if p.memory_id not in best or best[p.memory_id].score < score:
            best[p.memory_id] = Hit(
                p.memory_id,
                p.revision,
                p.title,
                p.source,
                p.text,
                score,
                p.updated_at,
                p.seq,
                p.passage_count,
            )
    return distinct_texts(best.values(), k)


def distinct_texts(hits: Iterable[Hit], k: int) -> list[Hit]:
    """The best `k` hits, one per passage text under one title (whitespace aside), best first.

    Two memories can say the same words: one fact remembered by two teammates, a file
    imported from two places. Both were returned and the hook injected both, spending its
    few records and tokens on one fact twice. The hook sees only ids and revisions (its
    ledger), so the server, which holds the text, keeps one: the best scored, and among
    equals (the same text and title score alike) the one written first, so a copy written
    later never displaces the one a conversation has already been shown. The title is part
    of what a hit says ("Staging" or "Production" over "use the blue cluster"; a chat
    line's speaker and date), so the same words under two titles are two hits. Collapsing
    comes before the cut to k, so k distinct hits come back whenever the inspected
    candidates hold that many; it reads only the <= 12 candidates already judged."""
    out: dict[tuple[str, str], Hit] = {}
    for hit in sorted(hits, key=lambda h: (-h.score, h.updated_at, h.id)):
        said = (" ".join((hit.title or "").split()), " ".join(hit.text.split()))
        out.setdefault(said, hit)
        if len(out) == k:
            break
    return list(out.values())


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000.0


def _left_ms(deadline: float) -> float:
    return (deadline - time.monotonic()) * 1000.0
