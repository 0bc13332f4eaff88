"""Benchmark: can a learnt or fused ranking fit all of a task's gold tools into what ToolFace
shows the Planner first? (the target on AgentDojo: ≥ 0.95 of tasks, ≤ 10 shown)

    python bench/toolface_rankers.py                       # AgentDojo, a few minutes on 2 cores
    python bench/toolface_rankers.py --env bfcl --out runs/bench/toolface_rankers_bfcl.json

The figures go to ``--out`` (default ``runs/bench/toolface_rankers.json``) as JSON under the
run's provenance stamp; curated results live in ``bench/results/``.

Every variant re-ranks a task's session tools for the turn's user text; ToolFace's own policy
then decides what is shown (the top k, their companions, filled up to ``min_shown``:
``ToolFace.retrieve`` with its ``search`` replaced by the variant's ranking), with the
environment's shipped settings. What a variant learns comes from train-split gold, never from
the task's own turns: for a train task every learnt model is fit again without them, as
``heart.catalog.session_toolface`` leaves them out of the companions.

A family's setting is chosen on the train split (most train turns with every gold tool shown,
then fewest shown, at most ``--max-shown`` on average) and read on held-out turns (dev +
test). The best held-out figure anywhere on the family's grid is printed beside it: an upper
bound that no choice made without the held-out answers could claim.

Families (each starts from the hybrid score, ``dense_weight`` · MiniLM cosine + the rest · BM25
normalised by the query's best; on BFCL that leaves out the shipped query log and usage
prior, which the "shipped" row keeps):

- **expansion**: document expansion from the query log. Each tool gets a second BM25 text, the
  train requests whose gold used it (only requests with at most ``max_gold`` gold tools), and
  its normalised score is added with weight ``w``.
- **query-map**: q' = normalise(q + qA), A (384 × 384) fit by softmax cross-entropy over each
  train turn's session tools toward its gold tools, with an L2 penalty ``l2`` on A.
- **learning-to-rank**: logistic regression (torch, L2 ``l2``) over per-tool features: cosine,
  BM25, fused score, their reciprocal ranks, the best clause's cosine, the usage prior,
  "companion of a top-5 tool", and the centred cosines.
- **clauses**: the request split into clauses (sentences, numbered items, "then", "also", …),
  each scored like the whole request and fused with it (max, mean, reciprocal-rank fusion).
- **feedback**: pseudo-relevance feedback, q + β · the mean vector of the top ``m`` tools.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.toolface import bootstrap, fmt, session_cases  # noqa: E402
from heart.catalog import session_toolface, tool_statistics  # noqa: E402
from heart.embeddings import Embedder  # noqa: E402
from heart.toolface import ToolFace, bm25_tokenize  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "toolface_rankers.json"
"""Where a run's figures go by default (runs/ is not tracked)."""

CLAUSE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\b\d+\.\s+|,?\s+\b(?:then|also|finally|afterwards)\b\s+|;\s*", re.I)


def clauses(text: str) -> list[str]:
    """The request's clauses of at least three words (none when it is one clause)."""
    parts = [c.strip() for c in CLAUSE_BREAK.split(" ".join(text.split())) if c and len(c.split()) >= 3]
    return parts if len(parts) > 1 else []


def normalised(scores: np.ndarray) -> np.ndarray:
    best = scores.max(initial=0.0)
    return scores / best if best > 0 else scores


def bm25_index(documents: list[str]):
    """A BM25 index over ``documents``, tokenised as ToolFace tokenises its tools."""
    import bm25s

    index = bm25s.BM25()
    # An empty document (a tool no train request used) gets a placeholder no query contains.
    index.index(bm25s.tokenize([d or "xxunused" for d in documents], stopwords="en", show_progress=False),
                show_progress=False)
    return index


def bm25_scores(index, query: str) -> np.ndarray:
    """BM25 of ``query`` against ``index``'s documents, normalised by the best (as ToolFace
    fuses it)."""
    tokens = bm25_tokenize([query])[0]
    scores = np.asarray(index.get_scores(tokens), dtype=np.float32) if tokens else np.zeros(index.scores["num_docs"])
    return normalised(scores)


@dataclass
class Turn:
    """One user turn with gold calls, and every score the variants start from."""

    task_id: str
    split: str
    query: str
    gold: set[str]
    toolface: ToolFace
    order: list[str]
    vectors: np.ndarray
    """The session tools' index vectors (rows in ``order``)."""
    query_vector: np.ndarray
    lexical: np.ndarray
    usage: np.ndarray
    clause_vectors: list[np.ndarray] = field(default_factory=list)
    clause_lexical: list[np.ndarray] = field(default_factory=list)

    @property
    def dense(self) -> np.ndarray:
        return self.vectors @ self.query_vector

    def fused(self, vector: np.ndarray | None = None, lexical: np.ndarray | None = None) -> np.ndarray:
        alpha = self.toolface.config.dense_weight
        vector = self.query_vector if vector is None else vector
        lexical = self.lexical if lexical is None else lexical
        return alpha * (self.vectors @ vector) + (1 - alpha) * lexical

    def shown(self, scores: np.ndarray) -> list[str]:
        """What ToolFace's policy shows when its ranking is ``scores`` (best first)."""
        ranking = [(self.order[i], float(scores[i])) for i in np.argsort(-scores, kind="stable")]
        view = copy.copy(self.toolface)
        view.search = lambda query, k=None: ranking[:k]
        return [t.name for t in view.retrieve(self.query)]


def load_turns(env_name: str) -> tuple[list[Turn], list[tuple[str, str, frozenset[str]]]]:
    """Every gold turn of every task, and the train turns (task, request, gold tools)."""
    env, cases = session_cases(env_name, None)
    statistics = tool_statistics(env, "train")
    embedder = Embedder()
    texts = {q for *_, turns in cases for q, _ in turns} | {t.query for t in statistics.turns}
    texts |= {c for *_, turns in cases for q, _ in turns for c in clauses(q)}
    embedder.embed(sorted(texts))  # one batched pass; later lookups hit the memory layer
    turns = []
    for task_id, split, session, gold_turns in cases:
        toolface = session_toolface(env, session)
        order = sorted(toolface.names())
        documents = [toolface.get(n).spec.index_text() for n in order]
        lexical = bm25_index(documents)  # one per task: its turns and clauses score against it
        vectors = embedder.embed(documents)
        usage = statistics.without(task_id).usage()
        for query, gold in gold_turns:
            pieces = clauses(query)
            turns.append(Turn(
                task_id, split, query, set(gold), toolface, order, vectors, embedder.embed_query(query)[0],
                bm25_scores(lexical, query), np.array([usage.get(n, 0.0) for n in order], dtype=np.float32),
                [embedder.embed_query(c)[0] for c in pieces], [bm25_scores(lexical, c) for c in pieces],
            ))
    train = [(t.task_id, t.query, t.tools) for t in statistics.turns]
    return turns, train


# -- variants: each maps a Turn to scores over its tools -----------------------------------
Scorer = Callable[[Turn], np.ndarray]


def expansion(turns: list[Turn], train, w: float, max_gold: int) -> Scorer:
    def score(turn: Turn) -> np.ndarray:
        requests = {name: [] for name in turn.order}
        for task_id, query, tools in train:
            if task_id != turn.task_id and len(tools) <= max_gold:
                for name in tools & requests.keys():
                    requests[name].append(query)
        expanded = bm25_scores(bm25_index([" ".join(requests[n]) for n in turn.order]), turn.query)
        return turn.fused() + w * expanded
    return score


def fit_per_task(turns: list[Turn], fit: Callable[[list[Turn]], object]) -> Callable[[Turn], object]:
    """A model fit on the train turns without each train task's own, and one on all of them
    for held-out tasks."""
    train_turns = [t for t in turns if t.split == "train"]
    models = {"held-out": fit(train_turns)}
    for task_id in sorted({t.task_id for t in train_turns}):
        models[task_id] = fit([t for t in train_turns if t.task_id != task_id])
    return lambda turn: models[turn.task_id if turn.split == "train" else "held-out"]


def padded(turns: list[Turn], rows: Callable[[Turn], np.ndarray]):
    """Per-turn tool rows padded to one tensor, with the tool and gold masks."""
    import torch

    width = max(len(t.order) for t in turns)
    first = rows(turns[0])
    x = torch.zeros(len(turns), width, *first.shape[1:])
    mask = torch.zeros(len(turns), width, dtype=torch.bool)
    gold = torch.zeros(len(turns), width, dtype=torch.bool)
    for i, t in enumerate(turns):
        x[i, : len(t.order)] = torch.from_numpy(np.ascontiguousarray(rows(t), dtype=np.float32))
        mask[i, : len(t.order)] = True
        gold[i, : len(t.order)] = torch.tensor([n in t.gold for n in t.order])
    return x, mask, gold


def query_map(turns: list[Turn], train, l2: float, steps: int = 150, temperature: float = 0.05) -> Scorer:
    import torch

    def fit(fit_turns: list[Turn]) -> np.ndarray:
        tools, mask, gold = padded(fit_turns, lambda t: t.vectors)
        queries = torch.from_numpy(np.stack([t.query_vector for t in fit_turns]))
        a = torch.zeros(queries.shape[1], queries.shape[1], requires_grad=True)
        optimiser = torch.optim.Adam([a], lr=1e-2)
        for _ in range(steps):
            optimiser.zero_grad()
            mapped = torch.nn.functional.normalize(queries + queries @ a, dim=1)
            logits = (tools @ mapped.unsqueeze(2)).squeeze(2) / temperature
            every = torch.logsumexp(logits.masked_fill(~mask, -1e9), 1)
            wanted = torch.logsumexp(logits.masked_fill(~gold, -1e9), 1)
            loss = (every - wanted).mean() + l2 * (a ** 2).sum()
            loss.backward()
            optimiser.step()
        return a.detach().numpy()

    model = fit_per_task(turns, fit)

    def score(turn: Turn) -> np.ndarray:
        mapped = turn.query_vector + turn.query_vector @ model(turn)
        return turn.fused(vector=mapped / np.linalg.norm(mapped))
    return score


def ranks(scores: np.ndarray) -> np.ndarray:
    """Each tool's rank under ``scores`` (0 = best)."""
    rank = np.empty(len(scores))
    rank[np.argsort(-scores, kind="stable")] = np.arange(len(scores))
    return rank


def features(turn: Turn) -> np.ndarray:
    dense, fused = turn.dense, turn.fused()
    clause_dense = np.max([turn.vectors @ v for v in turn.clause_vectors], axis=0) if turn.clause_vectors else dense
    top = {turn.order[i] for i in np.argsort(-fused, kind="stable")[:5]}
    companion = [any(name in turn.toolface.companions.get(t, ()) for t in top) for name in turn.order]

    return np.stack([dense, turn.lexical, fused, 1 / (1 + ranks(fused)), 1 / (1 + ranks(dense)), clause_dense,
                     turn.usage, np.array(companion, dtype=np.float32), dense - dense.mean(),
                     clause_dense - clause_dense.mean()], axis=1)


def learning_to_rank(turns: list[Turn], train, l2: float, steps: int = 300) -> Scorer:
    # The training rows' usage and companion features leave out their own task, not the task
    # the model is refit without: a second-order leak that can only flatter this family.
    import torch

    def fit(fit_turns: list[Turn]):
        x, mask, gold = padded(fit_turns, features)
        x, y = x[mask], gold[mask].float()
        mean, std = x.mean(0), x.std(0) + 1e-6
        weights = torch.zeros(x.shape[1] + 1, requires_grad=True)
        optimiser = torch.optim.Adam([weights], lr=5e-2)
        for _ in range(steps):
            optimiser.zero_grad()
            logits = ((x - mean) / std) @ weights[:-1] + weights[-1]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + l2 * (weights[:-1] ** 2).sum()
            loss.backward()
            optimiser.step()
        return mean.numpy(), std.numpy(), weights.detach().numpy()

    model = fit_per_task(turns, fit)

    def score(turn: Turn) -> np.ndarray:
        mean, std, weights = model(turn)
        return ((features(turn) - mean) / std) @ weights[:-1]
    return score


def reciprocal_rank_fusion(rankings: list[np.ndarray], k: int) -> np.ndarray:
    return sum(1 / (k + ranks(scores)) for scores in rankings)


def clause_fusion(turns: list[Turn], train, how: str) -> Scorer:
    def score(turn: Turn) -> np.ndarray:
        whole = turn.fused()
        parts = [turn.fused(vector=v, lexical=lex) for v, lex in zip(turn.clause_vectors, turn.clause_lexical)]
        if not parts:
            return whole
        if how == "max":
            return np.max([whole, *parts], axis=0)
        if how == "mean":
            return (whole + np.max([whole, *parts], axis=0)) / 2
        return reciprocal_rank_fusion([whole, whole, *parts], k=10)
    return score


def feedback(turns: list[Turn], train, m: int, beta: float) -> Scorer:
    def score(turn: Turn) -> np.ndarray:
        top = np.argsort(-turn.fused(), kind="stable")[:m]
        vector = turn.query_vector + beta * turn.vectors[top].mean(0)
        return turn.fused(vector=vector / np.linalg.norm(vector))
    return score


FAMILIES: dict[str, tuple[Callable[..., Scorer], dict[str, list]]] = {
    "expansion": (expansion, {"w": [0.1, 0.2, 0.3, 0.5], "max_gold": [1, 3, 99]}),
    "query-map": (query_map, {"l2": [0.01, 0.1, 1.0]}),
    "learning-to-rank": (learning_to_rank, {"l2": [0.0, 0.01, 0.1]}),
    "clauses": (clause_fusion, {"how": ["max", "mean", "rrf"]}),
    "feedback": (feedback, {"m": [1, 3], "beta": [0.2, 0.5]}),
}


# -- measuring -----------------------------------------------------------------------------
def measure(turns: list[Turn], shown_of: Callable[[Turn], list[str]], n_boot: int) -> dict:
    by_split: dict[str, dict[str, list[float]]] = {}
    shown_counts = {"all": [], "train": []}
    for turn in turns:
        shown = shown_of(turn)
        ok = float(turn.gold <= set(shown))
        for split in ("all", turn.split, "held-out" if turn.split != "train" else None):
            if split:
                by_split.setdefault(split, {}).setdefault(turn.task_id, []).append(ok)
        shown_counts["all"].append(len(shown))
        if turn.split == "train":
            shown_counts["train"].append(len(shown))
    out = {split: bootstrap(list(tasks.values()), n_boot) for split, tasks in by_split.items()}
    out["shown"] = float(np.mean(shown_counts["all"]))
    out["shown_train"] = float(np.mean(shown_counts["train"]))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="agentdojo", choices=["agentdojo", "bfcl"])
    parser.add_argument("--max-shown", type=float, default=10.0, help="mean tools shown a setting may use")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help=f"comma-separated, of: {', '.join(FAMILIES)}")
    parser.add_argument("--out", type=Path, default=OUT, help="the figures as JSON (default: %(default)s)")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    run_stamp = stamp(script=__file__)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {list(FAMILIES)}")

    turns, train = load_turns(args.env)
    results = {"env": args.env, "turns": len(turns), "max_shown": args.max_shown,
               "shipped": measure(turns, lambda t: [r.name for r in t.toolface.retrieve(t.query)], args.bootstrap)}
    for name in families:
        make, grid = FAMILIES[name]
        rows = []
        for values in itertools.product(*grid.values()):
            setting = dict(zip(grid, values))
            scorer = make(turns, train, **setting)
            rows.append((setting, measure(turns, lambda t: t.shown(scorer(t)), args.bootstrap)))
            print(f"  {name} {setting}: all {rows[-1][1]['all'][0]:.3f}, held-out {rows[-1][1]['held-out'][0]:.3f}, "
                  f"shown {rows[-1][1]['shown']:.2f}", file=sys.stderr)
        within = [r for r in rows if r[1]["shown"] <= args.max_shown] or rows
        chosen = max(within, key=lambda r: (r[1]["train"][0], -r[1]["shown_train"]))
        results[name] = {"chosen": chosen[0], **chosen[1],
                         "grid_best_held_out": max(r[1]["held-out"][0] for r in within),
                         "grid": [{"setting": s, **m} for s, m in rows]}

    print(f"\n## {args.env}: every gold tool of a turn shown on the first Planner call "
          f"(95% bootstrap over tasks; setting chosen on train, ≤ {args.max_shown:g} shown)\n")
    print("| variant | chosen on train | all | train | held-out | shown (mean) | best held-out on the grid |")
    print("|---|---|---|---|---|---|---|")
    for name in ["shipped", *families]:
        r = results[name]
        chosen = ", ".join(f"{k} {v}" for k, v in r.get("chosen", {}).items()) or "–"
        best = f"{r['grid_best_held_out']:.3f}" if "grid_best_held_out" in r else "–"
        print(f"| {name} | {chosen} | {fmt(r['all'])} | {fmt(r['train'])} | {fmt(r['held-out'])} "
              f"| {r['shown']:.2f} | {best} |")
    write_stamped_json(args.out, results, run_stamp)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
