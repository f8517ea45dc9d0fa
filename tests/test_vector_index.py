"""The embedded store's vector index: the 8-bit shortlist must not change the answer."""

from __future__ import annotations

import numpy as np
import pytest

from relay.store.vector_index import DIM, QUANTIZE_FROM, OrgVectors

NOW = 1_800_000_000.0


def clustered_rows(
    n: int, seed: int = 7
) -> tuple[np.ndarray, list[tuple[int, bytes, float | None, str]]]:
    """Unit vectors around a few hundred topics, like a team's memories; mixed audiences
    and expiry so the access mask matters."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((300, DIM)).astype(np.float32)
    matrix = topics[rng.integers(0, 300, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(
        np.float32
    )
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    rows = []
    for i, vec in enumerate(matrix):
        audiences = "everyone" if i % 3 else "backend"
        until = NOW - 60 if i % 11 == 0 else (NOW + 3600 if i % 2 else None)
        rows.append((1000 + i, vec.tobytes(), until, audiences))
    return matrix, rows


def exact_top(matrix, rows, query, audiences, limit):  # noqa: ANN001, ANN201
    visible = [
        i
        for i, (_, _, until, aud) in enumerate(rows)
        if (until is None or until > NOW) and set(aud.split(",")) & audiences
    ]
    scores = matrix[visible] @ query
    order = np.argsort(-scores, kind="stable")[:limit]
    return [(rows[visible[i]][0], float(scores[i])) for i in order]


@pytest.mark.parametrize("audiences", [frozenset({"everyone"}), frozenset({"everyone", "backend"})])
def test_quantized_shortlist_returns_the_exact_top_results(audiences: frozenset[str]) -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM * 2)
    index = OrgVectors.build(1, rows)
    assert index.quantized is not None
    rng = np.random.default_rng(11)
    for probe in rng.integers(0, len(rows), 50):
        query = matrix[probe] + 0.3 * rng.standard_normal(DIM).astype(np.float32)
        query /= np.linalg.norm(query)
        got = index.search(query, audiences, NOW, 40)
        want = exact_top(matrix, rows, query, audiences, 40)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
        assert {r for r, _ in got} == {r for r, _ in want}


def test_masked_rows_never_come_back_from_either_path() -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM + 10)
    small = OrgVectors.build(1, rows[:500])
    large = OrgVectors.build(1, rows)
    assert small.quantized is None and large.quantized is not None
    hidden = {
        r for r, _, until, aud in rows if aud == "backend" or (until is not None and until <= NOW)
    }
    for index in (small, large):
        for probe in range(0, 400, 7):
            hits = index.search(matrix[probe], frozenset({"everyone"}), NOW, 40)
            assert hits and not hidden & {r for r, _ in hits}
            assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_fewer_visible_rows_than_asked_for() -> None:
    matrix, rows = clustered_rows(QUANTIZE_FROM)
    rows = [(r, b, u, "everyone" if i < 5 else "backend") for i, (r, b, u, _) in enumerate(rows)]
    index = OrgVectors.build(1, rows)
    hits = index.search(matrix[0], frozenset({"everyone"}), NOW, 40)
    assert {r for r, _ in hits} == {r for r, _, u, a in rows[:5] if u is None or u > NOW}
