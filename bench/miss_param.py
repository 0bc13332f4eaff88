"""BFCL multi_turn_miss_param with the gold teacher: valid episodes, clarifications, dataset rows.

    nice -n 19 python bench/miss_param.py --out bench/results/miss_param.json

Every miss_param task (or ``--limit`` of each split) runs through the HEART loop three ways,
each scored by BFCL's own multi-turn checker:

- ``gold``: the gold teacher, which asks in exactly the turns whose request withholds a
  parameter (an empty gold turn followed by the user's turn giving it); the environment's
  user answers with that next turn;
- ``never_asks`` (control): the same teacher told that nothing is withheld — it plans nothing
  in the withheld turn and gets the next turn as its next user turn, as BFCL's own runner
  would give it;
- ``always_asks`` (control): the gold teacher that first asks a question in every turn.

Per arm: valid episodes by BFCL's checker (per split and overall), errored episodes, and
clarification precision and recall over turns (``heart_distill.eval.metrics``), with
bootstrap intervals over tasks. The controls show what each figure can tell: BFCL's checker
skips an empty turn and still gives the next one, so a Planner that never asks can pass it;
recall is what tells it apart. Then ``heart collect --category multi_turn_miss_param`` on
the train split and ``heart datasets build`` count the clarification rows that reach the
Planner's dataset and its card. Writes one stamped JSON (default under runs/bench/).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from heart.environments.bfcl import BFCLEnvironment  # noqa: E402
from heart.episode import run_episode  # noqa: E402
from heart.roles.common import render_answer, role_input  # noqa: E402
from heart_distill.data.gold_teacher import GoldTeacher  # noqa: E402
from heart_distill.eval.metrics import clarification_figures  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402
from heart_distill.eval.stats import bootstrap  # noqa: E402

CATEGORY = "multi_turn_miss_param"
SPLITS = ("train", "dev", "test")


class NeverAsks(GoldTeacher):
    """The gold teacher told that nothing is withheld (the session still knows)."""

    def __init__(self, task, tools):
        super().__init__(dataclasses.replace(task, meta={**task.meta, "withheld_turns": []}), tools)


class AlwaysAsks(GoldTeacher):
    """The gold teacher that first asks one question in every turn, needed or not."""

    QUESTION = {"status": "INSUFFICIENT", "intent": {"task": "Ask.", "objective": "Ask.", "tool_categories": [],
                                                     "constraints": []},
                "clarification": "Is there anything else I should know?", "replanned": False}

    def generate(self, role, messages, sampling=None):
        generation = super().generate(role, messages, sampling)
        payload = role_input(messages)
        if role == "planner" and not payload.get("clarifications") and not payload.get("feedback"):
            return dataclasses.replace(generation, text=render_answer(self.QUESTION), meta={})
        return generation


ARMS = {"gold": GoldTeacher, "never_asks": NeverAsks, "always_asks": AlwaysAsks}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks of each split (0: all)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--no-dataset", action="store_true", help="skip the train collection and dataset build")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench" / "miss_param.json"))
    parser.add_argument("--run-dir", default=str(REPO / "runs" / "bench" / "miss_param-run"),
                        help="where the train collection and its datasets go (replaced)")
    return parser


def run_arm(env: BFCLEnvironment, arm: str, task_ids: dict[str, list[str]]) -> dict:
    rows, start = [], time.perf_counter()
    for split, ids in task_ids.items():
        for task_id in ids:
            task = env.load_task(task_id)
            record = run_episode(env, task, ARMS[arm](task, env.catalog())).record
            rows.append({"task_id": task_id, "split": split, "errored": record.errored, "success": record.success,
                         "checker": record.checker, "error_type": record.checker.get("error_type")})
    scored = [r for r in rows if not r["errored"]]
    by_split = {split: {"valid": sum(r["success"] for r in scored if r["split"] == split),
                        "episodes": sum(1 for r in scored if r["split"] == split)} for split in task_ids}
    return {
        "episodes": len(rows), "errored": len(rows) - len(scored),
        "valid": sum(r["success"] for r in scored),
        "valid_rate": bootstrap([float(r["success"]) for r in scored]).to_dict(),
        "by_split": by_split, **clarification_figures(rows),
        "invalid": [{"task_id": r["task_id"], "error_type": r["error_type"]} for r in scored if not r["success"]],
        "wall_s": round(time.perf_counter() - start, 1),
    }


def dataset_rows(run_dir: Path, limit: int) -> dict:
    """``heart collect --category multi_turn_miss_param --split train --teacher gold`` and
    ``heart datasets build``: the clarification rows of the Planner's dataset and card."""
    import json
    import shutil

    from datasets import load_from_disk

    from heart_distill.data.build import BuildOptions, build_role_datasets
    from heart_distill.data.collect import main as collect

    shutil.rmtree(run_dir, ignore_errors=True)
    argv = ["--env", "bfcl", "--category", CATEGORY, "--split", "train", "--teacher", "gold", "--out", str(run_dir),
            *(["--limit", str(limit)] if limit else [])]
    start = time.perf_counter()
    status = collect(argv)
    collected = json.loads((run_dir / "last_collect.json").read_text())
    report = build_role_datasets(run_dir, run_dir / "datasets", BuildOptions(roles=("planner",)))
    planner = load_from_disk(str(run_dir / "datasets" / "planner"))
    by_split = {split: sum(json.loads(r["messages"][-1]["content"])["status"] == "INSUFFICIENT" for r in rows)
                for split, rows in planner.items()}
    card = (run_dir / "datasets" / "planner" / "README.md").read_text()
    line = next(x for x in card.splitlines() if x.startswith("- clarification rows"))
    return {"collect_command": "heart collect " + " ".join(argv), "collect_status": status,
            "collected": {k: collected[k] for k in ("n", "ok", "errored")},
            "planner_rows": report.roles["planner"]["splits"],
            "clarification_rows": by_split, "card_quality": report.roles["planner"]["quality"],
            "card_line": line, "wall_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    env = BFCLEnvironment(CATEGORY)
    task_ids = {split: env.task_ids(split)[:args.limit or None] for split in SPLITS}
    result = {"category": CATEGORY, "tasks": {s: len(ids) for s, ids in task_ids.items()}, "arms": {}}
    for arm in args.arms:
        result["arms"][arm] = run_arm(env, arm, task_ids)
        a = result["arms"][arm]
        print(f"{arm}: {a['valid']}/{a['episodes'] - a['errored']} valid, {a['errored']} errored; clarification "
              f"precision {a['clarification_precision']['value']}, recall {a['clarification_recall']['value']} "
              f"({a['wall_s']} s)", flush=True)
    if not args.no_dataset:
        result["planner_dataset"] = dataset_rows(Path(args.run_dir), args.limit)
        print(f"planner dataset: {result['planner_dataset']['card_line']}", flush=True)
    write_stamped_json(args.out, result, run_stamp)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
