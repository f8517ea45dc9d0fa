"""Write relay/data/token_projection.npy: the projection of MiniLM token states that
relay.late stores passages' word pieces in.

    .venv/bin/python scripts/fit_token_projection.py

The top `relay.late.DIMS` principal directions (uncentred, so cosines keep their geometry)
of the token states of a public corpus that no recall benchmark scores:
`../shared/bench/cursorrules_bullets` (awesome-cursorrules, CC0), each rule embedded as an
import writes it (heading as title). Unsupervised: no query or label is read. Changing the
file changes what stored token matrices mean: bump `relay.late.PROJECTION_ID` with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from relay.bench_recall import memory_drafts, read_jsonl
from relay.embedding import OnnxEmbedder
from relay.late import DIMS, PROJECTION_FILE
from relay.passages import split_passages
from relay.writes import embedding_text

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "cursorrules_bullets"
SAMPLE = 200_000  # token rows; the directions are stable well before this


def main() -> None:
    texts = [
        embedding_text(draft.title, passage)
        for _, draft in memory_drafts(read_jsonl(CORPUS / "memories.jsonl"))
        for passage in split_passages(draft.body)
    ]
    _, states = OnnxEmbedder(2).embed_tokens(texts)
    rows = np.vstack([s for s in states if len(s)])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rng = np.random.default_rng(0)
    if len(rows) > SAMPLE:
        rows = rows[rng.choice(len(rows), SAMPLE, replace=False)]
    _, singular, vt = np.linalg.svd(rows, full_matrices=False)
    energy = float((singular[:DIMS] ** 2).sum() / (singular**2).sum())
    PROJECTION_FILE.parent.mkdir(exist_ok=True)
    np.save(PROJECTION_FILE, vt[:DIMS].T.astype(np.float32))
    print(f"{len(texts)} passages, {len(rows)} token rows, {DIMS} dims keep {energy:.3f} of energy")
    print(f"wrote {PROJECTION_FILE}")


if __name__ == "__main__":
    main()
