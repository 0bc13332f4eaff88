"""Relevance that only prunes: ToolFace's default list, less what the judge is sure does not apply.

Per held-out turn (dev and test tasks) of each environment, ToolFace's top 20 candidates are
scored by a judge in the Primitive's relevance mode: P(applies) from the verdict token's
log-probabilities (:func:`heart.relevance.judge` with ``scored``; one token decoded, the
probability is all this reads). :func:`heart.relevance.calibrate` chooses the prune policy's
thresholds on the **dev** turns (keep ≥ 99% of the gold tools the default lists hold; add a
candidate only where additions are gold at least half the time) and the **test** turns read
them once. Per environment and judge, the share of turns whose gold tools are all shown to
the first Planner call (95% bootstrap over tasks) and the tools shown, for:

- ``default``: ToolFace's default list (``retrieve``: what the loop shows without relevance);
- ``gate``: the candidates the judge says apply (P ≥ 0.5), at most 10 (the gate policy);
- ``prune``: the default list less the tools scored below ``prune_below``, plus those above
  ``add_above`` (:func:`heart.relevance.prune`);
- the ``oracle`` judge is gold relevance (the gold teacher's answers: P is 1 or 0).

Judges: ``oracle``, ``base`` (the embedded SmolLM2, full prompt) and ``adapter`` (a Primitive
adapter trained on relevance rows, e.g. ``recipes/smollm2-135m/primitive-relevance.yaml``;
served with the prompt its manifest says). The answers are cached by prompt
(``--cache``): a killed run resumes where it stopped. Each judge's thresholds are written
beside the report (``relevance_thresholds-<env>-<judge>.json``), the file ``heart run
--relevance --relevance-thresholds PATH`` reads.

    python bench/relevance_prune.py --adapter runs/relevance/adapters/primitive \\
        --judges oracle base adapter --envs agentdojo bfcl
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.toolface import (  # noqa: E402
    add_by_split, bootstrap, fmt, judge_turn, relevance_judges, session_cases, session_toolface,
)
from heart_distill.eval.provenance import stamp, usable_cores, write_stamped_json  # noqa: E402

OUT = Path("runs/bench/relevance_prune.json")
SPLITS = ("dev", "test")
POLICIES = ("default", "gate", "prune")


def judged_turns(env_name: str, judges: dict, limit: int | None, per_split: int | None) -> tuple[dict, dict]:
    """Every held-out turn's (split, task, default list, gold, {judge: judgements}), by task,
    and the candidates' counts."""
    from heart.embeddings import Embedder
    from heart.progress import progress_bar
    from heart.relevance import CANDIDATES, candidate_cards

    env, cases = session_cases(env_name, limit)
    cases = [c for c in cases if c[1] in SPLITS]
    if per_split is not None:  # the first N tasks of each split (task-id order)
        cases = [c for split in SPLITS for c in [c for c in cases if c[1] == split][:per_split]]
    catalog = env.catalog()
    Embedder().embed(sorted({q for *_, turns in cases for q, _ in turns}))
    by_task: dict[str, list[dict]] = {}
    gold_in_candidates = []
    for task_id, split, session, turns in progress_bar(cases, unit="task", desc=f"relevance {env_name}"):
        task = env.load_task(task_id)
        face = session_toolface(env, session)
        for query, gold in turns:
            default = [t.name for t in face.retrieve(query)]
            names = [n for n, _ in face.search(query, CANDIDATES)]
            gold_in_candidates.append(set(gold) <= set(names))
            cards = candidate_cards(face, names)
            judged = {name: judge_turn(backend, prompt, task, catalog, query, cards, scored=True, max_new_tokens=1)
                      for name, (backend, prompt) in judges.items()}
            by_task.setdefault(task_id, []).append({"split": split, "default": default, "gold": set(gold),
                                                    "judged": judged})
    return by_task, {"turns": len(gold_in_candidates), "gold_in_top_20": sum(gold_in_candidates)}


def shown_by(policy: str, turn: dict, judge: str, thresholds) -> list[str]:
    from heart.relevance import SHOWN, prune

    judgements = turn["judged"][judge]
    if policy == "default":
        return turn["default"]
    if policy == "gate":
        return [j.name for j in sorted(judgements, key=lambda j: j.rank) if (j.p or 0.0) >= 0.5][:SHOWN]
    return prune(judgements, turn["default"], thresholds, SHOWN)


def separation(turns: list[dict], judge: str) -> dict:
    """How well P(applies) separates the candidates that are gold from the others: ROC AUC
    (the chance a gold candidate outscores another of the same split; 0.5: no better than
    a coin, 1: a threshold separates them), with the counts it is over."""
    import numpy as np

    gold = [j.p for t in turns for j in t["judged"][judge] if j.p is not None and j.name in t["gold"]]
    other = np.array([j.p for t in turns for j in t["judged"][judge] if j.p is not None and j.name not in t["gold"]])
    if not gold or not len(other):
        return {"auc": None, "gold": len(gold), "other": len(other)}
    wins = sum(float((p > other).sum() + 0.5 * (p == other).sum()) for p in gold)
    return {"auc": round(wins / (len(gold) * len(other)), 4), "gold": len(gold), "other": int(len(other))}


def measure(env_name: str, judges: dict, limit: int | None, per_split: int | None, n_boot: int,
            out_dir: Path) -> dict:
    from heart.relevance import calibrate

    by_task, counts = judged_turns(env_name, judges, limit, per_split)
    result: dict = {"environment": env_name, "tasks_per_split_at_most": per_split, **counts, "judges": {}}
    for judge in judges:
        dev = [(t["default"], t["judged"][judge], t["gold"]) for turns in by_task.values() for t in turns
               if t["split"] == "dev"]
        thresholds = calibrate(dev)
        path = thresholds.save(out_dir / f"relevance_thresholds-{env_name}-{judge}.json")
        rows: dict[str, dict[str, list[list[float]]]] = {}
        for turns in by_task.values():
            values: dict[str, list[float]] = {}
            for t in turns:
                for policy in POLICIES:
                    shown = shown_by(policy, t, judge, thresholds)
                    values.setdefault(f"{policy} all@shown", []).append(float(t["gold"] <= set(shown)))
                    values.setdefault(f"{policy} shown", []).append(float(len(shown)))
                scored = [j for j in t["judged"][judge] if j.p is not None]
                values.setdefault("scored share", []).append(len(scored) / max(1, len(t["judged"][judge])))
            for key, v in values.items():
                add_by_split(rows, turns[0]["split"], key, v)
        summary = {"thresholds": {"prune_below": thresholds.prune_below, "add_above": thresholds.add_above,
                                  "file": str(path), **(thresholds.calibration or {})}}
        for split in SPLITS:
            summary.setdefault("separation", {})[split] = separation(
                [t for turns in by_task.values() for t in turns if t["split"] == split], judge)
        for split in SPLITS:
            if split in rows:
                by_key = rows[split]
                summary[split] = {key: bootstrap(v, n_boot) for key, v in by_key.items()}
                summary[split]["turns"] = sum(len(v) for v in by_key["default shown"])
        result["judges"][judge] = summary
    return result


def print_result(r: dict) -> None:
    print(f"\n## {r['environment']}: {r['turns']} held-out turns, gold tools all in ToolFace's top 20 in "
          f"{r['gold_in_top_20']}\n")
    print("| judge | split | turns | AUC gold vs other | prune_below / add_above | default list | shown "
          "| gate (P ≥ 0.5) | shown | prune | shown |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for judge, s in r["judges"].items():
        th = s["thresholds"]
        for split in SPLITS:
            if split in s:
                v = s[split]
                print(f"| {judge} | {split} | {v['turns']} | {s['separation'][split]['auc']} "
                      f"| {th['prune_below']:.4f} / {th['add_above']} | "
                      + " | ".join(f"{fmt(v[f'{p} all@shown'])} | {v[f'{p} shown'][0]:.1f}" for p in POLICIES)
                      + " |")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["agentdojo", "bfcl"], choices=["agentdojo", "bfcl"])
    parser.add_argument("--judges", nargs="+", default=["oracle", "adapter"], choices=["oracle", "base", "adapter"],
                        help="who scores relevance (default: oracle adapter)")
    parser.add_argument("--adapter", default=None, help="the Primitive adapter folder for --judges adapter")
    parser.add_argument("--adapter-prompt", default="auto", choices=["auto", "short", "full"],
                        help="the adapter's relevance system prompt (auto: as its manifest's recipe trained it)")
    parser.add_argument("--engine", default="llamacpp:f16", help="engine serving base and adapter")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks per environment (all splits)")
    parser.add_argument("--tasks-per-split", type=int, default=None,
                        help="first N dev and first N test tasks per environment (default: all)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--cache", type=Path, default=OUT.parent / "relevance_answers.jsonl",
                        help="relevance answers by prompt (resumes a killed run; default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="the figures as JSON (default: %(default)s)")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    run_stamp = stamp(script=__file__)
    judges = relevance_judges(args.judges, args.engine, args.adapter, args.cache, args.adapter_prompt)
    report: dict = {"cpus": usable_cores(), "engine": args.engine, "adapter": args.adapter,
                    "splits": {"calibrated on": "dev", "read on": "test"}, "environments": {}}
    for env_name in args.envs:
        report["environments"][env_name] = measure(env_name, judges, args.limit, args.tasks_per_split,
                                                  args.bootstrap, args.out.parent)
        print_result(report["environments"][env_name])
    write_stamped_json(args.out, report, run_stamp, indent=1)
    print(f"\nrelevance_prune: wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
