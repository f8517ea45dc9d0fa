"""The embedding providers on the real model and real bench text: no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relay.embedding import (
    DIM,
    MAX_TOKENS,
    OnnxEmbedder,
    SentenceTransformerEmbedder,
    load_embedder,
    plan_batches,
)
from relay.errors import InvalidRequestError, RelayError

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / ".." / "shared" / "bench"


def bench_texts(name: str, n: int) -> list[str]:
    with open(BENCH / name / "memories.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f, strict=False)]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """~50 real memories of mixed length, plus the edge cases."""
    mixed = bench_texts("cursorrules_bullets", 25) + bench_texts("locomo_observations", 25)
    return [*mixed, "", "ok", "migrations " * 400]  # empty, one word, past MAX_TOKENS


@pytest.fixture(scope="module")
def onnx() -> OnnxEmbedder:
    # Two threads and tiny batches so the pool and the bucketing both get exercised.
    return OnnxEmbedder(2, batch_size=4, batch_tokens=64)


def test_shapes_dtype_and_unit_rows(onnx: OnnxEmbedder, texts: list[str]) -> None:
    vectors = onnx.embed(texts)
    assert vectors.shape == (len(texts), DIM) == (len(texts), onnx.dim)
    assert vectors.dtype == np.float32
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    query = onnx.embed_query("how do we name database migrations?")
    assert query.shape == (DIM,) and query.dtype == np.float32
    assert onnx.embed([]).shape == (0, DIM)


def test_batch_order_survives_length_bucketing(onnx: OnnxEmbedder, texts: list[str]) -> None:
    lengths = [len(onnx._tokenizer.encode(t).ids) for t in texts]
    batches = plan_batches(lengths, onnx.batch_size, onnx.batch_tokens)
    assert len(batches) > 5 and sorted(i for b in batches for i in b) == list(range(len(texts)))
    assert max(lengths) == MAX_TOKENS  # the long text was truncated, not rejected
    one_by_one = np.stack([onnx.embed_query(t) for t in texts])
    np.testing.assert_allclose(onnx.embed(texts), one_by_one, atol=1e-5)
    reversed_ = onnx.embed(texts[::-1])[::-1]
    np.testing.assert_allclose(reversed_, one_by_one, atol=1e-5)


def test_batches_respect_size_and_token_budget() -> None:
    lengths = [10, 200, 12, 11, 256, 9, 30]
    batches = plan_batches(lengths, batch_size=3, batch_tokens=256)
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 256
    widths = [max(lengths[i] for i in b) for b in batches]
    assert widths == sorted(widths)  # similar lengths together, shortest first


def test_embed_query_equals_embed_of_one(onnx: OnnxEmbedder) -> None:
    q = "Which linter do we run before committing Python code?"
    np.testing.assert_allclose(onnx.embed_query(q), onnx.embed([q])[0], atol=1e-6)


def test_paraphrase_beats_unrelated(onnx: OnnxEmbedder) -> None:
    anchor, paraphrase, unrelated = onnx.embed(
        [
            "Never commit API keys or passwords to the repository.",
            "Secrets such as credentials must not be checked into git.",
            "Melanie painted a sunrise over the lake last summer.",
        ]
    )
    assert anchor @ paraphrase > anchor @ unrelated + 0.3


def test_onnx_path_does_not_import_torch() -> None:
    code = (
        "import sys; from relay.embedding import load_embedder; "
        "load_embedder('onnx', 1).embed_query('hello'); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "False"


def test_onnx_agrees_with_sentence_transformers(onnx: OnnxEmbedder, texts: list[str]) -> None:
    pytest.importorskip("torch")
    reference = SentenceTransformerEmbedder(1)
    theirs = reference.embed(texts)
    assert theirs.shape == (len(texts), DIM) and theirs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)
    cosine = (onnx.embed(texts) * theirs).sum(axis=1)
    assert cosine.min() >= 0.99, cosine.min()
    np.testing.assert_allclose(reference.embed_query(texts[0]), theirs[0], atol=1e-5)


def test_unknown_provider_is_a_clear_relay_error() -> None:
    with pytest.raises(InvalidRequestError, match="unknown embedding provider 'openai'.*onnx"):
        load_embedder("openai")


def test_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import` raise ImportError, as an absent package does.
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(RelayError, match=r"'torch' extra") as caught:
        SentenceTransformerEmbedder(1)
    assert caught.value.details["extra"] == "torch"


def test_loaded_once_per_provider_and_threads() -> None:
    first = load_embedder("onnx", 1)
    assert load_embedder("onnx", 1) is first
    assert load_embedder("onnx", 2) is not first
    assert OnnxEmbedder(1) is not first  # a fresh one whenever a test wants it
    assert first.name == "minilm-l6-v2-onnx-int8" and first.dim == DIM


def test_the_providers_the_cli_offers_are_the_ones_that_load():
    """The CLI names them without importing this module (numpy): one list kept in step."""
    from relay.embedding import PROVIDERS
    from relay.settings import EMBEDDERS

    assert EMBEDDERS == tuple(PROVIDERS)


def test_loading_the_embedder_leaves_no_onnxruntime_device_id_in_home(tmp_path):
    """QA: every command that loaded the model left onnxruntime's telemetry device id,
    ~/.cache/Microsoft/DeveloperTools/.onnxruntime/deviceid, in the user's HOME."""
    import os

    # A CI variable makes onnxruntime skip telemetry itself: without them, as on a user's machine.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"CI", "GITHUB_ACTIONS", "TF_BUILD"} and not k.startswith("ORT_")
    }
    code = "from relay.embedding import load_embedder; load_embedder('onnx', 1).embed_query('x')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / ".cache" / "Microsoft").exists(), list(tmp_path.rglob("*"))
