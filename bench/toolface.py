"""Benchmark: does ToolFace show the Planner the tools it needs, and how fast at scale?

    python bench/toolface.py                        # everything (several minutes on 2 cores)
    python bench/toolface.py --limit 20 --skip-scale --skip-single-turn   # a quick look
    python bench/toolface.py --out runs/bench/toolface_quick.json   # default: runs/bench/toolface.json

The figures go to ``--out`` as JSON under the run's provenance stamp (command, commit, date,
machine); curated results live in ``bench/results/``.

Three parts, each measured in this one run:

1. **Session catalogs** (as ``run_episode`` builds ToolFace: the task's own tools), every
   user turn that has gold calls, query = that turn's user text (no gold in it): the share
   of turns whose gold tools are *all* in the top k, for dense-only retrieval (MiniLM, the
   similarity-only reference), hybrid (MiniLM + BM25), hybrid top 7 + companions (filled up
   to 9), and the default (``heart.catalog.session_toolface``, what ``run_episode`` uses:
   the environment's measured settings, i.e. on BFCL also the query log and the usage
   prior), which show a variable number of tools: their mean is reported next to their
   recall. Also gold recall@1/5/10 (the share of a turn's gold tools in the top k). 95%
   intervals: bootstrap over tasks (a task's turns stay together). Everything learnt
   (companions, query log, usage prior) comes from train-split gold, and each task is
   measured *without its own turns* in it, so every split's row is honest; "held-out" is
   dev + test, which the statistics never saw at all.
2. **BFCL single-turn against the central catalog** (every BFCL + AgentDojo document,
   deduplicated): query → the entry's gold functions, recall@1/5/10 (all gold in top k).
3. **Scale**: the central catalog's real embeddings plus generated variants up to 25,519
   and 255,190 tools. Variants are *not* embedded (MiniLM at ~360 docs/s on 2 shared cores
   would take ~12 min for 255k): each is a real document's vector plus Gaussian noise,
   renormalised, and its text is the real text with a variant suffix (for BM25). Reports
   index build time, index memory, top-5 latency (dense search alone, and the whole
   hybrid retrieval with the query already embedded) for exact ``IndexFlatIP`` and HNSW,
   and HNSW's recall@5 against exact search. Query embedding time is reported apart.
4. **In the loop** (``--loop``): every task's gold-teacher episode (no faults) through
   the per-step loop, whose re-plans add tools retrieved for the feedback
   (``LoopConfig.replan_tools``); per turn with gold calls, whether all its gold tools were
   shown to the Planner on its first call (the default above, as the loop sees it) and by
   its last call of the turn, and how many tools each Planner call was shown. The
   re-plans here are driven by the gold Verifier's feedback, which names what is left of
   the request, so this is what the loop can find when its Verifier says that, not what a
   given model's Verifier will say.
5. **Relevance before selection** (``--relevance``, :mod:`heart.relevance`): per AgentDojo
   turn of ``--relevance-splits`` (default held-out: dev + test), ToolFace's top 20 (the
   session ToolFace ``run_episode`` builds, its fused ranking without companions) each judge
   in the Primitive's relevance mode whether they apply; the Planner would be shown those
   that do, at most 10, best rank first. Reported beside the default list (the figure of
   part 1): all gold tools shown, tools shown, gold in the top 20, and the judges' precision
   and recall against gold relevance and unparsed answers, for each judge of ``--judges``:
   ``oracle`` (gold relevance, the upper bound: the gold teacher's answers), ``base`` (the
   base model) and ``adapter`` (``--adapter``: a Primitive adapter trained with relevance
   rows), served by ``--engine`` with decoding constrained to the answer's schema.
   Judgements are cached by their exact prompt in ``--cache`` (greedy decoding: the same
   prompt gets the same answer), so a killed run resumes and ``bench/tool_injection.py``
   reuses the clean candidates' answers::

       python bench/toolface.py --relevance --skip-sessions --skip-single-turn --skip-scale \
           --judges oracle base adapter --adapter runs/relevance/adapter
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from heart.catalog import (  # noqa: E402
    RETRIEVAL_CATEGORIES,
    bfcl_data,
    central_catalog,
    content_index,
    read_jsonl,
    retrieval_config,
    session_toolface,
    tool_statistics,
)
from heart.environments import load_environment, split_of  # noqa: E402
from heart.roles.common import role_input  # noqa: E402
from heart.embeddings import Embedder  # noqa: E402
from heart.toolface import RetrievalConfig, Tool, ToolFace, ToolSpec  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "toolface.json"
"""Where a run's figures go by default (runs/ is not tracked)."""

DENSE = RetrievalConfig(dense_weight=1.0, expand_companions=False, min_shown=0, collapse_variants=False)
HYBRID = RetrievalConfig(expand_companions=False, min_shown=0, collapse_variants=False)
COLLAPSED = RetrievalConfig(expand_companions=False, min_shown=0)
"""Hybrid, one document per function name (the default's ranking, without companions)."""


def noop(**arguments):
    return arguments


def bootstrap(values_by_task: list[list[float]], n: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean over all values, and a 95% interval resampling tasks (clusters of turns)."""
    flat = np.array([v for task in values_by_task for v in task], dtype=float)
    sums = np.array([sum(task) for task in values_by_task], dtype=float)
    counts = np.array([len(task) for task in values_by_task], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values_by_task), size=(n, len(values_by_task)))
    means = sums[picks].sum(1) / counts[picks].sum(1)
    return float(flat.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt(stat: tuple[float, float, float]) -> str:
    return f"{stat[0]:.3f} [{stat[1]:.3f}, {stat[2]:.3f}]"


# -- 1. session catalogs -------------------------------------------------------------------
def session_cases(env_name: str, limit: int | None):
    """(task id, split, session, [(query, gold names)]) for every task."""
    env = load_environment(env_name)
    cases = []
    for task_id in env.task_ids()[:limit]:
        task = env.load_task(task_id)
        session = env.start(task)
        turns = [(query, sorted({c.name for c in gold}))
                 for query, gold in zip(task.turns, task.gold or []) if gold]
        cases.append((task_id, split_of(env_name, task_id), session, turns))
    return env, cases


def add_by_split(rows: dict[str, dict[str, list[list[float]]]], split: str, key: str, task_values: list[float]):
    """One task's values under its split, "all", and "held-out" unless it is a train task."""
    for s in ("all", split, "held-out" if split != "train" else None):
        if s is not None:
            rows.setdefault(s, {}).setdefault(key, []).append(task_values)


def measure_sessions(env_name: str, limit: int | None, n_boot: int) -> dict:
    env, cases = session_cases(env_name, limit)
    statistics = tool_statistics(env, "train")
    # one batched pass over every query and every logged request
    Embedder().embed(sorted({q for *_, turns in cases for q, _ in turns} | {q for q, _ in statistics.query_log()}))
    rows: dict[str, dict[str, list[list[float]]]] = {}
    tools_per_task = []
    companions_only = retrieval_config(env, query_log_weight=0.0, usage_weight=0.0)
    for task_id, split, session, turns in cases:
        tools = session.tools
        tools_per_task.append(len(tools))
        faces = {name: ToolFace(tools, config=config) for name, config in (("dense", DENSE), ("hybrid", HYBRID))}
        faces["companions"] = session_toolface(env, session, config=companions_only)
        faces["default"] = session_toolface(env, session)
        values: dict[str, list[float]] = {}
        for query, gold in turns:
            for name in ("dense", "hybrid"):
                ranked = [t for t, _ in faces[name].search(query, len(tools))]
                for k in (5, 10, 20):
                    values.setdefault(f"{name} all@{k}", []).append(float(set(gold) <= set(ranked[:k])))
                for k in (1, 5, 10):
                    values.setdefault(f"{name} recall@{k}", []).append(len(set(gold) & set(ranked[:k])) / len(gold))
            for name in ("companions", "default"):
                shown = [t.name for t in faces[name].retrieve(query)]
                values.setdefault(f"{name} all@shown", []).append(float(set(gold) <= set(shown)))
                values.setdefault(f"{name} shown", []).append(float(len(shown)))
        for key, v in values.items():
            add_by_split(rows, split, key, v)
    result = {
        "tasks": len(cases),
        "turns": sum(len(t) for *_, t in cases),
        "tools_per_task_median": float(np.median(tools_per_task)),
        "train_turns_learnt_from": len(statistics.turns),
        "settings": {k: v for k, v in vars(retrieval_config(env)).items()},
    }
    for split, by_key in rows.items():
        result[split] = {key: bootstrap(v, n_boot) for key, v in by_key.items()}
        result[split]["turns"] = sum(len(t) for t in by_key["default shown"])
    return result


def print_sessions(results: dict[str, dict]) -> None:
    print("\n## Session catalogs: all gold tools of a turn shown (95% bootstrap over tasks)\n")
    print("| environment | split | turns | tools/task | dense top-5 | dense top-10 | dense top-20 "
          "| hybrid top-5 | hybrid top-10 | hybrid top-20 | hybrid 7 + companions (≥ 9) | shown (mean) "
          "| **default** | shown (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for env, r in results.items():
        for split in ("all", "train", "dev", "test", "held-out"):
            if split not in r:
                continue
            s = r[split]
            cells = [fmt(s[f"{m} all@{k}"]) for m in ("dense", "hybrid") for k in (5, 10, 20)]
            cells += [f"{fmt(s[f'{m} all@shown'])} | {s[f'{m} shown'][0]:.1f}" for m in ("companions", "default")]
            print(f"| {env} | {split} | {s['turns']} | {r['tools_per_task_median']:.0f} | " + " | ".join(cells) + " |")
    print("\n## Session catalogs: gold recall@k (share of a turn's gold tools in the top k)\n")
    print("| environment | split | dense @1 | dense @5 | dense @10 | hybrid @1 | hybrid @5 | hybrid @10 |")
    print("|---|---|---|---|---|---|---|---|")
    for env, r in results.items():
        for split in ("all", "held-out"):
            s = r[split]
            cells = [fmt(s[f"{m} recall@{k}"]) for m in ("dense", "hybrid") for k in (1, 5, 10)]
            print(f"| {env} | {split} | " + " | ".join(cells) + " |")


def measure_loop(env_name: str, limit: int | None, n_boot: int) -> dict:
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill.eval.e2e import EpisodeEvents
    from heart.episode import run_episode

    env = load_environment(env_name)
    rows: dict[str, dict[str, list[list[float]]]] = {}
    for task_id in env.task_ids()[:limit]:
        task = env.load_task(task_id)
        events = EpisodeEvents()  # in memory: only the Planner inputs are read back
        run_episode(env, task, GoldTeacher(task, env.catalog()), trace=events)
        planners = [r for r in events.rows if r["kind"] == "event" and r["role"] == "planner"]
        values: dict[str, list[float]] = {"first": [], "last": [], "shown": [], "calls": []}
        for turn, gold in enumerate(task.gold or []):
            names = {c.name for c in gold}
            shown = [{name for tools in role_input(r["messages"])["available_tools"].values() for name in tools}
                     for r in planners if r["turn"] == turn]
            if not names or not shown:
                continue
            values["first"].append(float(names <= shown[0]))
            values["last"].append(float(names <= set().union(*shown)))
            values["shown"] += [float(len(s)) for s in shown]
            values["calls"].append(float(len(shown)))
        for key, v in values.items():
            if v:
                add_by_split(rows, split_of(env_name, task_id), key, v)
    return {split: {key: bootstrap(v, n_boot) for key, v in by_key.items()} | {"turns": sum(map(len, by_key["first"]))}
            for split, by_key in rows.items()}


def print_loop(results: dict[str, dict]) -> None:
    print("\n## In the loop: all gold tools of a turn shown to the Planner (gold teacher, 95% bootstrap over tasks)\n")
    print("| environment | split | turns | first Planner call | **by the turn's last Planner call** "
          "| tools shown per Planner call (mean) | Planner calls per turn (mean) |")
    print("|---|---|---|---|---|---|---|")
    for env, r in results.items():
        for split in ("all", "train", "dev", "test", "held-out"):
            if split in r:
                s = r[split]
                print(f"| {env} | {split} | {s['turns']} | {fmt(s['first'])} | **{fmt(s['last'])}** "
                      f"| {s['shown'][0]:.1f} | {s['calls'][0]:.2f} |")


# -- 5. relevance before selection ----------------------------------------------------------
JUDGES = ("oracle", "base", "adapter")


class AnswerCache:
    """A backend that answers each exact prompt once: greedy answers are looked up by a hash
    of (judge, role, messages, schema, budget) in a JSON-lines file, and only misses reach
    ``backend`` (in one batch). It makes a long measurement resumable and lets the injection
    bench reuse the clean candidates' answers."""

    def __init__(self, backend, judge: str, path: Path | None):
        self.backend, self.judge, self.path = backend, judge, path
        self.name = getattr(backend, "name", judge)
        self.answers: dict[str, dict] = {}
        self.hits = self.misses = 0
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a torn last line of a killed run
                    continue
                self.answers[row["key"]] = row

    def key(self, request) -> str:
        import hashlib

        parts = [self.judge, request.role, request.messages, request.sampling.guided_json,
                 request.sampling.max_new_tokens]
        if request.sampling.first_token_logprobs:  # a scored answer (older keys stay as they were)
            parts.append(list(request.sampling.first_token_logprobs))
        blob = json.dumps(parts, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def generate(self, role, messages, sampling=None):
        from heart.runtime.base import GenerationRequest, SamplingConfig

        return self.generate_batch([GenerationRequest(role, messages, sampling or SamplingConfig())])[0]

    def generate_batch(self, requests):
        from heart.runtime.base import Generation

        keys = [self.key(r) for r in requests]
        todo = [i for i, k in enumerate(keys) if k not in self.answers]
        self.hits += len(requests) - len(todo)
        self.misses += len(todo)
        if todo:
            fresh = self.backend.generate_batch([requests[i] for i in todo])
            rows = [{"key": keys[i], "text": g.text, "backend": g.backend, "adapter": g.adapter,
                     "completion_tokens": g.completion_tokens,
                     **({"first_token_logprobs": g.meta["first_token_logprobs"]}
                        if "first_token_logprobs" in g.meta else {})} for i, g in zip(todo, fresh)]
            for row in rows:
                self.answers[row["key"]] = row
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
        return [Generation(text=self.answers[k]["text"], backend=self.answers[k]["backend"],
                           adapter=self.answers[k]["adapter"],
                           completion_tokens=self.answers[k]["completion_tokens"],
                           meta={"first_token_logprobs": self.answers[k]["first_token_logprobs"]}
                           if "first_token_logprobs" in self.answers[k] else {}) for k in keys]


class OracleJudge:
    """Gold relevance for whichever task is current: the gold teacher's relevance answers."""

    name = "oracle"

    def __init__(self):
        self.teacher = None

    def use(self, task, catalog) -> None:
        from heart_distill.data.gold_teacher import GoldTeacher

        self.teacher = GoldTeacher(task, catalog)

    def generate_batch(self, requests):
        return self.teacher.generate_batch(requests)


def trained_short(adapter: str) -> bool:
    """Whether the adapter was trained on the short system prompt (its manifest's recipe)."""
    manifest = Path(adapter) / "manifest.json"
    if not manifest.exists():
        return False
    return json.loads(manifest.read_text()).get("recipe", {}).get("data", {}).get("system_prompt") == "short"


def relevance_judges(names, engine: str, adapter: str | None, cache: Path | None,
                     adapter_prompt: str = "auto") -> dict:
    """judge name → (backend, system prompt): the oracle, the base model, the adapter (served
    with the short prompt when it was trained on it: ``adapter_prompt`` "auto" reads its
    manifest, "short" / "full" say so for a folder without one, e.g. a training checkpoint)."""
    from heart.roles.registry import PRIMITIVE
    from heart.runtime.engines import local_backend

    mode = PRIMITIVE.mode("relevance")
    judges = {}
    for name in names:
        if name == "oracle":
            judges[name] = (OracleJudge(), mode.system_prompt(short=False))
        elif name == "base":
            backend = local_backend(engine, "smollm2-135m", max_batch_size=20, slot_tokens=1024)
            judges[name] = (AnswerCache(backend, f"base:{engine}", cache), mode.system_prompt(short=False))
        elif name == "adapter":
            if not adapter or not Path(adapter).is_dir():
                raise SystemExit(f"error: --judges adapter needs --adapter PATH (a Primitive adapter folder), got {adapter!r}")
            backend = local_backend(engine, "smollm2-135m", adapters={"primitive": adapter},
                                    max_batch_size=20, slot_tokens=1024)
            short = trained_short(adapter) if adapter_prompt == "auto" else adapter_prompt == "short"
            prompt = mode.system_prompt(short)
            judges[name] = (AnswerCache(backend, f"adapter:{engine}:{Path(adapter).resolve()}", cache), prompt)
        else:
            raise SystemExit(f"error: unknown judge {name!r} (one of {JUDGES})")
    return judges


def judge_turn(backend, system_prompt: str, task, catalog, query: str, cards: list[dict], scored: bool = False,
               max_new_tokens: int | None = None):
    """One turn's relevance judgements through :func:`heart.relevance.judge` (``scored``:
    with P(applies) from the verdict token; ``max_new_tokens``: a shorter budget, e.g. 1
    when only the verdict's probability is read)."""
    from heart.calls import EpisodeContext, RoleClient
    from heart.relevance import judge

    if isinstance(backend, OracleJudge):
        backend.use(task, catalog)
    roles = RoleClient(backend, EpisodeContext(f"relevance/{task.task_id}", task.task_id, task.env))
    if scored:
        return judge(roles, query, cards, system_prompt=system_prompt, scored=True, max_new_tokens=max_new_tokens)
    return judge(roles, query, cards, system_prompt=system_prompt, constrained=True)


def judge_summary(name: str, counts: dict, judges: dict) -> dict:
    from heart.roles.registry import PRIMITIVE

    backend, system_prompt = judges[name]
    short = PRIMITIVE.mode("relevance").system_prompt(short=True)
    return {**counts, "precision": counts["tp"] / max(1, counts["tp"] + counts["fp"]),
            "recall": counts["tp"] / max(1, counts["tp"] + counts["fn"]),
            "system_prompt": "short" if system_prompt == short else "full",
            "backend": getattr(backend, "name", name),
            "cache": {"hits": getattr(backend, "hits", 0), "misses": getattr(backend, "misses", 0)}}


def measure_relevance(env_name: str, splits: list[str], limit: int | None, n_boot: int, judges: dict) -> dict:
    from heart.progress import progress_bar
    from heart.relevance import CANDIDATES, SHOWN, candidate_cards, select

    env, cases = session_cases(env_name, limit)
    cases = [c for c in cases if c[1] in splits]
    catalog = env.catalog()
    Embedder().embed(sorted({q for *_, turns in cases for q, _ in turns}))
    rows: dict[str, dict[str, list[list[float]]]] = {}
    counts = {name: {"tp": 0, "fp": 0, "fn": 0, "tn": 0, "unparsed": 0, "calls": 0} for name in judges}
    for task_id, split, session, turns in progress_bar(cases, unit="task", desc="relevance"):
        task = env.load_task(task_id)
        face = session_toolface(env, session)
        values: dict[str, list[float]] = {}
        for query, gold in turns:
            default = [t.name for t in face.retrieve(query)]
            names = [n for n, _ in face.search(query, CANDIDATES)]
            values.setdefault("default all@shown", []).append(float(set(gold) <= set(default)))
            values.setdefault("default shown", []).append(float(len(default)))
            values.setdefault("candidates all@20", []).append(float(set(gold) <= set(names)))
            values.setdefault("candidates top-10 all", []).append(float(set(gold) <= set(names[:SHOWN])))
            cards = candidate_cards(face, names)
            for name, (backend, system_prompt) in judges.items():
                judgements = judge_turn(backend, system_prompt, task, catalog, query, cards)
                shown = select(judgements, SHOWN)
                values.setdefault(f"{name} all@shown", []).append(float(set(gold) <= set(shown)))
                values.setdefault(f"{name} shown", []).append(float(len(shown)))
                c = counts[name]
                for j in judgements:
                    c["calls"] += 1
                    c["unparsed"] += j.error is not None
                    c[("tp" if j.applies else "fn") if j.name in gold else ("fp" if j.applies else "tn")] += 1
        for key, v in values.items():
            add_by_split(rows, split, key, v)
    result: dict = {"environment": env_name, "splits": splits, "tasks": len(cases),
                    "candidates": CANDIDATES, "shown_at_most": SHOWN,
                    "confidence": "ToolFace rank (the engines expose no token probabilities)",
                    "judges": {name: judge_summary(name, c, judges) for name, c in counts.items()}}
    for split, by_key in rows.items():
        if split != "all":
            result[split] = {key: bootstrap(v, n_boot) for key, v in by_key.items()}
            result[split]["turns"] = sum(len(t) for t in by_key["default shown"])
    return result


def print_relevance(r: dict) -> None:
    print(f"\n## Relevance before selection ({r['environment']}): all gold tools shown to the first Planner "
          f"call (≤ {r['shown_at_most']} of the top {r['candidates']}; 95% bootstrap over tasks)\n")
    names = list(r["judges"])
    print("| split | turns | default list | shown (mean) | gold in top 20 | top 10 of the 20 | "
          + " | ".join(f"{n} | shown (mean)" for n in names) + " |")
    print("|---|---|---|---|---|---|" + "---|---|" * len(names))
    held_out = [split for split in r["splits"] if split != "train"]
    for split in ("train", "dev", "test", "held-out"):
        if split in r and not (split == "held-out" and len(held_out) < 2):  # held-out = dev + test
            s = r[split]
            print(f"| {split} | {s['turns']} | {fmt(s['default all@shown'])} | {s['default shown'][0]:.1f} "
                  f"| {fmt(s['candidates all@20'])} | {fmt(s['candidates top-10 all'])} | "
                  + " | ".join(f"**{fmt(s[f'{n} all@shown'])}** | {s[f'{n} shown'][0]:.1f}" for n in names) + " |")
    print("\n| judge | system prompt | relevance calls | precision | recall | unparsed (does not apply) |")
    print("|---|---|---|---|---|---|")
    for n, j in r["judges"].items():
        print(f"| {n} | {j['system_prompt']} | {j['calls']} | {j['precision']:.3f} | {j['recall']:.3f} | {j['unparsed']} |")


# -- 2. single-turn against the central catalog ---------------------------------------------
def single_turn_cases(catalog) -> list[tuple[str, list[str]]]:
    """(query, gold catalog names) for every single-turn entry with gold calls."""
    from heart.catalog import bfcl_schema, content_key

    by_content = content_index(catalog)
    data = bfcl_data()
    cases = []
    for category in RETRIEVAL_CATEGORIES:
        answers = {a["id"]: a for a in read_jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
        for entry in read_jsonl(data / f"BFCL_v4_{category}.json"):
            gold_names = {name for call in answers[entry["id"]]["ground_truth"] for name in call}
            docs = {d["name"]: d for d in entry["function"]}
            gold = [by_content[content_key(ToolSpec(n, docs[n].get("description", ""),
                                                     bfcl_schema(docs[n].get("parameters", {}))))]
                    for n in sorted(gold_names) if n in docs]
            query = "\n".join(m["content"] for m in entry["question"][0] if m["role"] == "user")
            if gold:
                cases.append((query, gold))
    return cases


def measure_single_turn(n_boot: int, limit: int | None) -> dict:
    catalog = central_catalog()
    cases = single_turn_cases(catalog)[:limit]
    tools = [Tool(spec, noop) for spec in catalog]
    Embedder().embed(sorted({q for q, _ in cases}))
    result = {"catalog_size": len(catalog), "categories": len({s.category for s in catalog}),
              "queries": len(cases)}
    for name, config in (("dense", DENSE), ("hybrid", HYBRID), ("hybrid, one per name", COLLAPSED)):
        face = ToolFace(tools, config=config)
        values: dict[str, list[list[float]]] = {}
        for query, gold in cases:
            ranked = [t for t, _ in face.search(query, 10)]
            for k in (1, 5, 10):
                values.setdefault(f"all@{k}", []).append([float(set(gold) <= set(ranked[:k]))])
                # The live categories repeat a function with slightly different documents
                # (kept apart as name~hash): finding any document of the gold name counts here.
                names = {base_name(t) for t in ranked[:k]}
                values.setdefault(f"name@{k}", []).append([float({base_name(g) for g in gold} <= names)])
        result[name] = {key: bootstrap(v, n_boot) for key, v in values.items()}
    return result


def base_name(name: str) -> str:
    return name.split("~", 1)[0]


def print_single_turn(r: dict) -> None:
    print(f"\n## BFCL single-turn query → gold functions, central catalog of {r['catalog_size']} tools "
          f"in {r['categories']} categories ({r['queries']} queries; all gold in top k)\n")
    print("| retrieval | match | @1 | @5 | @10 |")
    print("|---|---|---|---|---|")
    for name in ("dense", "hybrid", "hybrid, one per name"):
        for match, label in (("all", "exact document"), ("name", "document of the gold name")):
            print(f"| {name} | {label} | " + " | ".join(fmt(r[name][f"{match}@{k}"]) for k in (1, 5, 10)) + " |")


# -- 3. scale --------------------------------------------------------------------------------
class PrecomputedEmbedder:
    """Vectors looked up by text: the real and generated catalog, and pre-embedded queries."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.vectors[text][None, :]


def scaled_catalog(size: int, sigma: float, seed: int = 0):
    """``size`` specs: the central catalog, then variants of its documents; and a text →
    vector map (real embeddings for real documents, perturbed ones for variants)."""
    real = list(central_catalog())
    real_vectors = Embedder().embed([s.index_text() for s in real])
    rng = np.random.default_rng(seed)
    specs, vectors = [], {}
    for i in range(size):
        base = real[i % len(real)]
        if i < len(real):
            spec, vector = base, real_vectors[i]
        else:
            spec = ToolSpec(f"{base.name}__v{i}", f"{base.description} (variant {i})", base.parameters,
                            category=base.category)
            vector = real_vectors[i % len(real)] + rng.normal(0, sigma, real_vectors.shape[1]).astype(np.float32)
            vector /= np.linalg.norm(vector)
        specs.append(spec)
        vectors[spec.index_text()] = vector
    return specs, vectors


def measure_scale(sizes: list[int], n_queries: int, sigma: float, ef_searches: list[int]) -> list[dict]:
    import faiss

    queries = [q for q, _ in single_turn_cases(central_catalog())][:n_queries]
    q_vectors = Embedder().embed(queries)
    from heart.embeddings import load_embedder

    model = load_embedder()
    start = time.perf_counter()
    for q in queries[:50]:
        model.encode([q], normalize_embeddings=True)
    embed_ms = (time.perf_counter() - start) / 50 * 1000
    results = []
    for size in sizes:
        specs, vectors = scaled_catalog(size, sigma)
        vectors.update({q: v for q, v in zip(queries, q_vectors)})
        tools = [Tool(s, noop) for s in specs]
        exact_ids = None
        for kind in ("flat", "hnsw"):
            with tempfile.TemporaryDirectory() as cache:
                face = ToolFace(tools, cache_dir=Path(cache), embedder=PrecomputedEmbedder(vectors),
                                config=RetrievalConfig(index=kind, expand_companions=False, min_shown=0))
                start = time.perf_counter()
                face.build_index()
                build_s = time.perf_counter() - start
                memory_mb = faiss.serialize_index(face._index).nbytes / 2**20
                for ef in ([None] if kind == "flat" else ef_searches):
                    if ef is not None:
                        face._index.hnsw.efSearch = ef
                    start = time.perf_counter()
                    ids = np.array([face._index.search(v[None, :], 5)[1][0] for v in q_vectors])  # one query at a time, as the loop asks
                    dense_ms = (time.perf_counter() - start) / len(q_vectors) * 1000
                    start = time.perf_counter()
                    for q in queries:
                        face.retrieve(q, 5)
                    hybrid_ms = (time.perf_counter() - start) / len(queries) * 1000
                    if kind == "flat":
                        exact_ids = ids
                    overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(ids, exact_ids)])
                    row = {"size": size, "index": kind if ef is None else f"hnsw ef={ef}", "build_s": build_s,
                           "index_mb": memory_mb, "top5_dense_ms": dense_ms, "top5_hybrid_ms": hybrid_ms,
                           "recall@5_vs_exact": float(overlap), "query_embed_ms": embed_ms}
                    results.append(row)
                    print(f"  scale {size} {row['index']}: "
                          f"{json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})}",
                          file=sys.stderr, flush=True)
    return results


def print_scale(rows: list[dict], sigma: float) -> None:
    print(f"\n## Scale (real documents + perturbed variants, sigma={sigma}; query already embedded)\n")
    print("| tools | index | build (s) | index memory (MiB) | top-5 dense (ms) | top-5 hybrid (ms) | recall@5 vs exact |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']:,} | {r['index']} | {r['build_s']:.1f} | {r['index_mb']:.1f} | "
              f"{r['top5_dense_ms']:.2f} | {r['top5_hybrid_ms']:.2f} | {r['recall@5_vs_exact']:.3f} |")
    if rows:
        print(f"\nQuery embedding (MiniLM, one query, uncached): {rows[0]['query_embed_ms']:.1f} ms")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="first N tasks per environment")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--sizes", type=int, nargs="*", default=[25_519, 255_190])
    parser.add_argument("--queries", type=int, default=200, help="queries for the latency figures")
    parser.add_argument("--ef-search", type=int, nargs="*", default=[128, 512],
                        help="HNSW search breadths to measure (the index is built once)")
    parser.add_argument("--sigma", type=float, default=0.02, help="noise per dimension of a variant's vector")
    parser.add_argument("--skip-sessions", action="store_true")
    parser.add_argument("--skip-single-turn", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--loop", action="store_true", help="also measure what the loop shows (gold teacher)")
    parser.add_argument("--relevance", action="store_true",
                        help="also measure relevance before selection on AgentDojo (part 5)")
    parser.add_argument("--judges", nargs="+", default=["oracle"], choices=JUDGES,
                        help="who judges relevance (default: oracle)")
    parser.add_argument("--adapter", default=None, help="the Primitive adapter folder for --judges adapter")
    parser.add_argument("--engine", default="llamacpp:f16", help="engine serving base and adapter (heart.runtime.engines)")
    parser.add_argument("--adapter-prompt", default="auto", choices=["auto", "short", "full"],
                        help="the adapter's relevance system prompt (auto: as its manifest's recipe trained it)")
    parser.add_argument("--relevance-splits", nargs="+", default=["dev", "test"], choices=["train", "dev", "test"],
                        help="splits of the relevance measurement (default: held-out = dev + test)")
    parser.add_argument("--cache", type=Path, default=OUT.parent / "relevance_answers.jsonl",
                        help="relevance answers by prompt (resumes a killed run; default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="the figures as JSON (default: %(default)s)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    run_stamp = stamp(script=__file__)

    report: dict = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
    if not args.skip_sessions:
        report["sessions"] = {env: measure_sessions(env, args.limit, args.bootstrap)
                              for env in ("bfcl", "agentdojo")}
        print_sessions(report["sessions"])
    if args.loop:
        report["loop"] = {env: measure_loop(env, args.limit, args.bootstrap) for env in ("bfcl", "agentdojo")}
        print_loop(report["loop"])
    if args.relevance:
        judges = relevance_judges(args.judges, args.engine, args.adapter, args.cache, args.adapter_prompt)
        report["relevance"] = measure_relevance("agentdojo", args.relevance_splits, args.limit, args.bootstrap, judges)
        print_relevance(report["relevance"])
    if not args.skip_single_turn:
        report["single_turn"] = measure_single_turn(args.bootstrap, None if args.limit is None else args.limit * 10)
        print_single_turn(report["single_turn"])
    if not args.skip_scale:
        report["scale"] = measure_scale(args.sizes, args.queries, args.sigma, args.ef_search)
        print_scale(report["scale"], args.sigma)
        print(f"\nLoad average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
              "(a shared machine: compare rows within this run, not across runs)")
    write_stamped_json(args.out, report, run_stamp, indent=2)


if __name__ == "__main__":
    main()
