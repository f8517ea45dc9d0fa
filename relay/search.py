"""The search pipeline: one bounded attempt from query to a few passages, or none.

    authorize (caller) -> cache -> lexical candidates (SQL, access-filtered)
                                || semantic candidates (embedding + vectors, in a worker)
    -> the <= 12 best candidates by reciprocal-rank fusion
    -> re-fetched through the access filter -> scored with a calibrated model
    -> relevance threshold -> best passage per memory -> top k

Fused rank scores have no absolute meaning, so the threshold is applied to a
calibrated relevance estimate instead: a logistic model over the dense cosine,
the IDF-weighted share of the query's content words the passage contains, and
whether it mentions the names the query asks about. Its weights are fixed
settings (see `SearchSettings`), chosen on a development split and never on
the queries a benchmark reports.

The semantic stage runs in a worker thread while the lexical stage runs in the
request's thread; if the semantic stage cannot finish inside the deadline the
answer is lexical-only and says so (`degraded`). Nothing waits past the deadline.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Literal

import numpy as np

from relay.cache import ResultCache
from relay.embedding import Embedder
from relay.errors import InvalidRequestError
from relay.models import Passage, Principal, iso
from relay.store import Store
from relay.text import proper_names, query_terms

Mode = Literal["hybrid", "lexical", "semantic"]
MODES: tuple[Mode, ...] = ("hybrid", "lexical", "semantic")
MAX_K = 12
MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class SearchSettings:
    """Retrieval settings; part of every cache key."""

    candidates: int = 12  # passages inspected after fusion
    first_stage: int = 40  # candidates each stage proposes
    rrf_k: int = 60
    # Calibrated relevance: sigmoid(bias + w_dense*cos + w_cover*coverage - w_name*missing_names)
    bias: float = -6.0
    w_dense: float = 7.0
    w_cover: float = 4.0
    w_name: float = 2.5
    # Lexical-only relevance (no cosine available)
    lex_bias: float = -4.0
    lex_w_cover: float = 6.0
    threshold: float = 0.5
    min_budget_ms: float = 5.0  # below this the request is answered with nothing

    def fingerprint(self) -> tuple[object, ...]:
        return tuple(asdict(self).values())


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
    cosine: float | None
    coverage: float
    missing_names: float


def coverage(query: list[str], passage_terms: set[str], total: int, df: dict[str, int]) -> float:
    """IDF-weighted share of the query's content words found in the passage.

    Words the org has never seen weigh the most: a question about something the
    team never wrote down should not look answered.
    """
    if not query:
        return 0.0
    weights = [math.log(1 + (total + 1) / (df.get(t, 0) + 1)) for t in query]
    found = sum(w for t, w in zip(query, weights, strict=True) if t in passage_terms)
    return found / sum(weights)


def relevance(f: Features, s: SearchSettings) -> float:
    if f.cosine is None:
        z = s.lex_bias + s.lex_w_cover * f.coverage - s.w_name * f.missing_names
    else:
        z = s.bias + s.w_dense * f.cosine + s.w_cover * f.coverage - s.w_name * f.missing_names
    return 1.0 / (1.0 + math.exp(-z))


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
        if future is not None:
            try:
                qvec, semantic, took = future.result(
                    timeout=max(0.0, _left_ms(deadline) - 3) / 1000
                )
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
        names = proper_names(query)
        best: dict[str, Hit] = {}
        for p in passages:
            f = self._features(
                p, terms, names, total, df, cosines.get(p.rowid) if qvec is not None else None
            )
            score = relevance(f, s)
            if score < s.threshold:
                continue
            if p.memory_id not in best or best[p.memory_id].score < score:
                best[p.memory_id] = Hit(
                    p.memory_id, p.revision, p.title, p.source, p.text, score, p.updated_at, p.seq
                )
        timings["score_ms"] = _ms(t)
        results = sorted(best.values(), key=lambda h: h.score, reverse=True)[:k]
        return SearchResponse(results, stages, degraded, False, _ms(start), timings)

    def _semantic(self, org: str, audiences: frozenset[str], now: datetime, query: str):  # noqa: ANN202
        t = time.monotonic()
        assert self.embedder is not None
        qvec = self.embedder.embed_query(query)
        hits = self.store.semantic_search(org, audiences, now, qvec, self.settings.first_stage)
        return qvec, hits, _ms(t)

    @staticmethod
    def _cosines(qvec: np.ndarray, passages: list[Passage], rowids: list[int]) -> dict[int, float]:
        """Cosines for lexical-only candidates, from their stored vectors."""
        wanted = set(rowids)
        return {
            p.rowid: float(np.frombuffer(p.embedding, dtype="<f4") @ qvec)
            for p in passages
            if p.rowid in wanted and p.embedding is not None
        }

    @staticmethod
    def _features(
        p: Passage,
        terms: list[str],
        names: list[str],
        total: int,
        df: dict[str, int],
        cosine: float | None,
    ) -> Features:
        have = set(p.lexical.split())
        missing = sum(1 for n in names if n not in have) / len(names) if names else 0.0
        return Features(cosine, coverage(terms, have, total, df), missing)


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000.0


def _left_ms(deadline: float) -> float:
    return (deadline - time.monotonic()) * 1000.0
