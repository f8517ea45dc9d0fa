"""In-memory vector search for one organisation of the embedded store.

SQLite has no vector index. At the sizes one machine serves (around 10^5
passages an org) a scan is still the right shape: it has no recall loss to
tune and no graph to maintain. But a float32 scan of 10^5 x 384 is bound by
memory bandwidth (about 15 ms here), so large orgs scan an 8-bit copy of the
vectors (a quarter of the bytes, faiss's SIMD scalar quantizer: about 4 ms)
for a shortlist and re-rank that shortlist with the exact float32 vectors.
The shortlist is several times the requested size, which measured no loss of
the true top results (BENCHMARKS.md, "Search at scale").

The access filter is applied as a mask before ranking, so a reader's top
results are its true top results, never the leftovers of a larger, unfiltered
top-N.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

# faiss logs each CPU-specific build it tries and fails to load, at INFO, on import: noise
# at every server start-up, not a problem (it falls back to the generic build).
logging.getLogger("faiss.loader").setLevel(logging.WARNING)
import faiss  # noqa: E402

DIM = 384
# Below this many rows the exact float32 scan costs under 1.5 ms; no second copy needed.
QUANTIZE_FROM = 8_000
# Candidates the 8-bit scan proposes per wanted result (at least SHORTLIST_MIN) before the
# exact re-rank; 8-bit scores of unit vectors err by ~1e-3, far inside this margin.
SHORTLIST_FACTOR = 3
SHORTLIST_MIN = 100
# From this many rows an out-of-date index answers while it is rebuilt in the background.
STALE_FROM = QUANTIZE_FROM

log = logging.getLogger("relay.vectors")
# (rowid, embedding bytes, valid_until epoch or None, audiences joined by ',')
Rows = Iterable[tuple[int, bytes, float | None, str]]

faiss.omp_set_num_threads(1)  # one query, one core: the lexical stage runs on the other


@dataclass
class OrgVectors:
    generation: int
    rowids: np.ndarray  # int64 (n,)
    matrix: np.ndarray  # float32 (n, DIM), rows L2-normalised
    audience_set: np.ndarray  # int32 (n,): index into `audience_sets`
    valid_until: np.ndarray  # float64 (n,): epoch seconds, +inf when it never expires
    audience_sets: list[frozenset[str]]
    quantized: faiss.Index | None = None  # 8-bit copy of `matrix` for large orgs

    @classmethod
    def build(cls, generation: int, rows: Rows) -> OrgVectors:
        rowids: list[int] = []
        blobs: list[bytes] = []
        valid: list[float] = []
        set_ids: list[int] = []
        sets: dict[frozenset[str], int] = {}
        for rowid, blob, until, audiences in rows:
            key = frozenset(audiences.split(","))
            rowids.append(rowid)
            blobs.append(blob)
            valid.append(np.inf if until is None else until)
            set_ids.append(sets.setdefault(key, len(sets)))
        matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(rowids), DIM)
        quantized = None
        if len(rowids) >= QUANTIZE_FROM:
            quantized = faiss.IndexScalarQuantizer(
                DIM, faiss.ScalarQuantizer.QT_8bit_uniform, faiss.METRIC_INNER_PRODUCT
            )
            quantized.train(matrix)
            quantized.add(matrix)
        return cls(
            generation=generation,
            rowids=np.asarray(rowids, dtype=np.int64),
            matrix=matrix,
            audience_set=np.asarray(set_ids, dtype=np.int32),
            valid_until=np.asarray(valid, dtype=np.float64),
            audience_sets=list(sets),
            quantized=quantized,
        )

    def search(
        self, vector: np.ndarray, audiences: frozenset[str], now: float, limit: int
    ) -> list[tuple[int, float]]:
        if not len(self.rowids):
            return []
        allowed = [i for i, s in enumerate(self.audience_sets) if s & audiences]
        if not allowed:
            return []
        visible = self.valid_until > now
        if len(allowed) < len(self.audience_sets):
            visible &= np.isin(self.audience_set, allowed)
        if self.quantized is not None:
            rows = self._shortlist(vector, visible, max(limit * SHORTLIST_FACTOR, SHORTLIST_MIN))
            scores = self.matrix[rows] @ vector
        else:
            rows = np.flatnonzero(visible)
            scores = (self.matrix @ vector)[rows]
        n = min(limit, len(rows))
        if n == 0:
            return []
        top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self.rowids[rows[i]]), float(scores[i])) for i in top]

    def nbytes(self) -> int:
        quantized = len(self.rowids) * DIM if self.quantized is not None else 0
        arrays = (self.matrix, self.rowids, self.valid_until, self.audience_set)
        return sum(a.nbytes for a in arrays) + quantized

    def _shortlist(self, vector: np.ndarray, visible: np.ndarray, size: int) -> np.ndarray:
        """Row positions of the best `size` visible rows by the 8-bit scan."""
        assert self.quantized is not None
        params = None
        if not visible.all():
            bits = np.packbits(visible, bitorder="little")
            params = faiss.SearchParameters()
            # faiss keeps only a raw pointer: `bits` must outlive the search call below.
            params.sel = faiss.IDSelectorBitmap(len(visible), faiss.swig_ptr(bits))
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, DIM)
        _, found = self.quantized.search(query, size, params=params)
        rows = found[0]
        return rows[rows >= 0]


class VectorIndex:
    """Per-organisation vectors, rebuilt when the org's generation moves on.

    A large org's rebuild takes about a second at 10^5 passages (reading every vector
    back from SQLite). Rather than stall every search after each write for that long,
    a large index that is out of date keeps answering while its successor is built on
    a background thread (the store sees the returned index's generation is behind and
    re-scores what it proposes against the rows as they are now). Small orgs rebuild in
    place: it costs less than a search.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        # Least recently used first; over `max_bytes` the oldest orgs are dropped (they
        # reload on their next search). None: keep every org (the embedded store's default).
        self._orgs: OrderedDict[str, OrgVectors] = OrderedDict()
        self._used: dict[str, float] = {}  # last search, time.monotonic()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.max_bytes = max_bytes

    def search(
        self,
        org_id: str,
        generation: int,
        load: Callable[[], Rows],
        stored: Callable[[list[int]], Iterable[tuple[int, bytes]]],
        vector: np.ndarray,
        audiences: frozenset[str],
        now: float,
        limit: int,
    ) -> list[tuple[int, float]]:
        """The org's best `limit` visible (rowid, cosine). When the vectors held are older
        than `generation` (a large org reloading), what they propose is re-scored against
        `stored(rowids)`, the (rowid, float32 embedding) rows as they are now: a deleted
        passage drops out and a rowid handed out again is scored by its new text. Memories
        written since are not proposed until the reload lands; the lexical stage finds them."""
        index = self.get(org_id, generation, load)
        hits = index.search(vector, audiences, now, limit)
        if index.generation == generation or not hits:
            return hits
        rows = stored([rowid for rowid, _ in hits])
        scored = [(r, float(np.frombuffer(blob, dtype="<f4") @ vector)) for r, blob in rows]
        return sorted(scored, key=lambda hit: hit[1], reverse=True)

    def admit(self, org_id: str, nbytes: int, idle_s: float) -> bool:
        """Whether `org_id`'s vectors (about `nbytes`) may be held: they are already, or they
        fit once orgs nobody searched for `idle_s` seconds are dropped. A store answers an
        org that may not from its database instead, so a budget smaller than the orgs in
        use never turns into a reload on every search."""
        if self.max_bytes is None or org_id in self._orgs:
            return True
        now = time.monotonic()
        with self._guard:
            while self._orgs and self.nbytes() + nbytes > self.max_bytes:
                oldest = next(iter(self._orgs))
                if now - self._used.get(oldest, 0.0) < idle_s:
                    return False
                self._orgs.popitem(last=False)
            return nbytes <= self.max_bytes

    def get(
        self, org_id: str, generation: int, load: Callable[[], Rows], wait: bool = False
    ) -> OrgVectors:
        """The org's vectors at `generation`, or (a large org, unless `wait`) the previous
        ones while those load in the background."""
        current = self._orgs.get(org_id)
        self._used[org_id] = time.monotonic()
        if current is not None:
            with self._guard:
                if org_id in self._orgs:
                    self._orgs.move_to_end(org_id)
        if current is not None and current.generation == generation:
            return current
        with self._guard:
            lock = self._locks.setdefault(org_id, threading.Lock())
        if current is not None and len(current.rowids) >= STALE_FROM and not wait:
            if lock.acquire(blocking=False):  # else a rebuild is already under way
                threading.Thread(
                    target=self._rebuild_then_release,
                    args=(org_id, generation, load, lock),
                    name=f"relay-vectors-{org_id}",
                    daemon=True,
                ).start()
            return current
        with lock:  # one rebuild per org at a time; others wait and reuse it
            current = self._orgs.get(org_id)
            if current is None or current.generation < generation:
                current = self._rebuild(org_id, generation, load)
            return current

    def _rebuild(self, org_id: str, generation: int, load: Callable[[], Rows]) -> OrgVectors:
        # `generation` was read before `load` runs, so the rows are at least that new.
        fresh = OrgVectors.build(generation, load())
        with self._guard:
            self._orgs[org_id] = fresh
            self._orgs.move_to_end(org_id)
            if self.max_bytes is not None:
                while len(self._orgs) > 1 and self.nbytes() > self.max_bytes:
                    self._orgs.popitem(last=False)
        return fresh

    def nbytes(self) -> int:
        """Memory the held vectors take (float32 rows and their 8-bit copies)."""
        return sum(o.nbytes() for o in list(self._orgs.values()))

    def __contains__(self, org_id: str) -> bool:
        return org_id in self._orgs

    def held(self) -> list[str]:
        """The orgs whose vectors are in memory now."""
        return list(self._orgs)

    def _rebuild_then_release(
        self, org_id: str, generation: int, load: Callable[[], Rows], lock: threading.Lock
    ) -> None:
        try:
            self._rebuild(org_id, generation, load)
        except Exception:  # the store is closing or failing: searches retry on their own
            log.warning("rebuilding the vector index of org %s failed", org_id, exc_info=True)
        finally:
            lock.release()
