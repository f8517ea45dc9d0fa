"""Exact in-memory vector search for one organisation of the embedded store.

SQLite has no vector index, and at the sizes one machine serves (around 10^5
passages an org) an exact matrix-vector product is both fast (a few ms) and
free of recall loss. The access filter is applied as a mask before ranking, so
a reader's top results are its true top results, never the leftovers of a
larger, unfiltered top-N.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

DIM = 384


@dataclass
class OrgVectors:
    generation: int
    rowids: np.ndarray  # int64 (n,)
    matrix: np.ndarray  # float32 (n, DIM), rows L2-normalised
    audience_set: np.ndarray  # int32 (n,): index into `audience_sets`
    valid_until: np.ndarray  # float64 (n,): epoch seconds, +inf when it never expires
    audience_sets: list[frozenset[str]]

    @classmethod
    def build(
        cls, generation: int, rows: Iterable[tuple[int, bytes, float | None, str]]
    ) -> OrgVectors:
        """Rows are (rowid, embedding bytes, valid_until epoch or None, audiences joined by ',')."""
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
        return cls(
            generation=generation,
            rowids=np.asarray(rowids, dtype=np.int64),
            matrix=matrix,
            audience_set=np.asarray(set_ids, dtype=np.int32),
            valid_until=np.asarray(valid, dtype=np.float64),
            audience_sets=list(sets),
        )

    def search(
        self, vector: np.ndarray, audiences: frozenset[str], now: float, limit: int
    ) -> list[tuple[int, float]]:
        if not len(self.rowids):
            return []
        allowed = [i for i, s in enumerate(self.audience_sets) if s & audiences]
        if not allowed:
            return []
        scores = self.matrix @ vector
        visible = self.valid_until > now
        if len(allowed) < len(self.audience_sets):
            visible &= np.isin(self.audience_set, allowed)
        scores = np.where(visible, scores, -np.inf)
        n = min(limit, int(visible.sum()))
        if n == 0:
            return []
        top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self.rowids[i]), float(scores[i])) for i in top if np.isfinite(scores[i])]


class VectorIndex:
    """Per-organisation vectors, rebuilt when the org's generation moves on."""

    def __init__(self) -> None:
        self._orgs: dict[str, OrgVectors] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, org_id: str, generation: int, load) -> OrgVectors:  # noqa: ANN001
        current = self._orgs.get(org_id)
        if current is not None and current.generation == generation:
            return current
        with self._guard:
            lock = self._locks.setdefault(org_id, threading.Lock())
        with lock:  # one rebuild per org at a time; others wait and reuse it
            current = self._orgs.get(org_id)
            if current is None or current.generation != generation:
                current = OrgVectors.build(generation, load())
                self._orgs[org_id] = current
            return current

    def drop(self, org_id: str) -> None:
        self._orgs.pop(org_id, None)
