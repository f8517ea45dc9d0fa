"""Late interaction: each word of the query finds its best match among a passage's words.

The pooled vector averages a passage into one point, so "adoption agencies" and "looked
into adopting" meet only as far as their averages do. MaxSim (ColBERT's score, here over
the same MiniLM's token states, no extra model) keeps one vector per word piece: for every
query piece the closest passage piece, averaged with the query words' IDF as weights, so
the rare words of a question count most. Search uses it twice: to choose which of the
first stage's proposals to inspect (`relay.ranking.Preselect`), and as a feature of the
relevance model (`relay.ranking.Features.maxsim`); BENCHMARKS.md "Recall" has what it bought.

Storage: a passage's token states are projected from 384 to `DIMS` dimensions with a fixed
projection (`data/token_projection.npy`, the top principal directions of MiniLM token states
over a public corpus of coding rules, written by scripts/fit_token_projection.py) and kept as
int8, one row per word piece: about 128 bytes a piece, a few KiB a passage. Token states
cannot be recomputed at query time: running the model over 12 candidates costs 130 ms or
more, against about 10 ms for the whole search.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relay.embedding import normalise

DIMS = 128
PROJECTION_FILE = Path(__file__).with_name("data") / "token_projection.npy"
# Part of the embedding-cache key of token matrices: a new projection must not meet old rows.
PROJECTION_ID = "pca128-v1"


def cache_model(embedder_name: str) -> str:
    """The embedding-cache key under which an embedder's token matrices are kept."""
    return f"{embedder_name}/tokens-{PROJECTION_ID}"


@functools.cache
def projection() -> np.ndarray:
    matrix = np.load(PROJECTION_FILE)
    if matrix.shape[1] != DIMS:
        raise ValueError(f"{PROJECTION_FILE} projects to {matrix.shape[1]} dims, not {DIMS}")
    return np.ascontiguousarray(matrix, dtype=np.float32)


def project(states: np.ndarray) -> np.ndarray:
    """Token states (n, 384) -> unit rows (n, DIMS)."""
    states = np.asarray(states, dtype=np.float32).reshape(-1, projection().shape[0])
    return normalise(normalise(states) @ projection())


def pack(states: np.ndarray) -> bytes:
    """A passage's token states (word pieces, no [CLS]/[SEP]) as stored: int8 rows, each
    scaled to its own largest component (only a row's direction matters)."""
    rows = project(states)
    scale = np.maximum(np.abs(rows).max(axis=1, keepdims=True), 1e-12) / 127.0
    return np.round(rows / scale).astype(np.int8).tobytes()


def rows_of(blob: bytes) -> np.ndarray:
    """A packed matrix's rows as float32, each in its own scale (see `pack`)."""
    return np.frombuffer(blob, dtype=np.int8).reshape(-1, DIMS).astype(np.float32)


@dataclass(frozen=True)
class QueryPieces:
    """The query's word pieces as MaxSim weighs them: unit rows and their weights."""

    rows: np.ndarray  # (m, DIMS)
    weights: np.ndarray  # (m,), sums to 1

    @classmethod
    def read(
        cls, states: np.ndarray, spans: list[tuple[int, int]], words: list[tuple[int, int, float]]
    ) -> QueryPieces | None:
        """`states` and `spans`: each word piece's token state and character span (no
        [CLS]/[SEP]); `words`: each query word's span and weight (its term's IDF, 0 for a
        stopword). A word's weight is split over its pieces; a query whose words all weigh
        nothing weighs its pieces alike."""
        if len(states) == 0:
            return None
        owner: list[int | None] = []
        w = 0  # words and pieces both run left to right: one pass over each
        for start, _ in spans:
            while w < len(words) and words[w][1] <= start:
                w += 1
            owner.append(w if w < len(words) and words[w][0] <= start else None)
        pieces: dict[int, int] = {}
        for i in owner:
            if i is not None:
                pieces[i] = pieces.get(i, 0) + 1
        weights = np.array(
            [words[i][2] / pieces[i] if i is not None else 0.0 for i in owner], np.float32
        )
        if weights.sum() <= 0:
            weights = np.ones(len(owner), np.float32)
        return cls(project(states), weights / weights.sum())

    def maxsims(self, blobs: list[bytes]) -> list[float]:
        """For each passage's token matrix, the weighted mean over query pieces of the best
        cosine with any of its pieces (0 for an empty one). One product for all of them:
        a search's pool is up to 80 passages, and numpy's per-call cost dominated a loop."""
        lengths = [len(b) // DIMS for b in blobs]
        if not any(lengths):
            return [0.0] * len(blobs)
        # Cosines as dot products over the rows' norms: normalising the stored rows instead
        # writes one more array of them (1.6 MB for a pool), and its fresh pages cost 1.6 ms.
        rows = rows_of(b"".join(blobs))
        norms = np.maximum(np.sqrt(np.einsum("ij,ij->i", rows, rows)), 1e-12)
        sims = (self.rows @ rows.T) / norms  # (pieces, all passages' rows)
        starts = np.cumsum([0, *lengths[:-1]])
        present = [i for i, n in enumerate(lengths) if n]
        best = np.maximum.reduceat(sims, starts[present], axis=1)  # (pieces, present)
        scores = self.weights @ best
        out = [0.0] * len(blobs)
        for i, value in zip(present, scores.tolist(), strict=True):
            out[i] = value
        return out
