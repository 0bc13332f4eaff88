"""Four role adapters against one joint adapter trained on the same rows (α-UMi's question).

    python bench/joint_vs_roles.py --eval runs/your-tools-time/eval --out bench/results/joint_vs_roles.json
    python bench/joint_vs_roles.py --eval docs/results/role-benchmark-2026-12-06b/eval \
        --joint-eval docs/results/joint-2026-12-06b/eval --out bench/results/joint_vs_roles_benchmark.json

Reads, from one evaluation folder, the held-out role evaluations ``roles-base``,
``roles-distilled`` (the four adapters) and ``roles-joint`` (``heart train --joint``, served
for every role; from ``--joint-eval`` when it was evaluated apart), and, where they exist, the
end-to-end runs ``e2e-base``, ``e2e-distilled`` and ``e2e-joint`` on the same tasks (the
role benchmark's joint arm runs end to end in ``heart eval bench`` instead). Per role: each side's primary metric and the paired difference four − joint
on the inputs both scored; end to end: success per side and the paired difference over tasks.
Every interval is a paired bootstrap over the same rows or tasks; at a few dozen of them an
interval that spans 0 decides nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart import ROLES  # noqa: E402  (after the path insert)
from heart_distill.eval.metrics import HEADLINE, paired_difference  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402
from heart_distill.eval.stats import bootstrap  # noqa: E402

SIDES = ("base", "distilled", "joint")


def role_rows(folder: Path, role: str) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "roles_examples.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["role"] == role]


def task_success(folder: Path) -> dict[str, float]:
    """Task → its success (seed 0) in an e2e folder; errored episodes left out."""
    rows = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines() if line.strip()]
    return {r["task_id"]: float(bool(r["success"])) for r in rows if not r.get("errored")}


def percent(value: float | None) -> float | None:
    return None if value is None else round(value * 100.0, 1)


def estimate(e) -> dict:
    """An :class:`~heart_distill.eval.stats.Estimate` of a share, in percent."""
    return {"value": percent(e.value), "low": percent(e.low), "high": percent(e.high), "n": e.n}


def recorded(figure: dict) -> dict:
    """A figure of roles.json (a share with its interval), in percent."""
    return {"value": percent(figure["value"]), "low": percent(figure["low"]), "high": percent(figure["high"]),
            "n": figure["n"]}


def cell(e: dict) -> str:
    return f"{e['value']} [{e['low']}, {e['high']}] (n={e['n']})"


def compare(eval_dir: Path, joint_dir: Path | None = None) -> dict:
    roles = {}
    for role in ROLES:
        metric = HEADLINE[role]
        folders = {side: (joint_dir or eval_dir if side == "joint" else eval_dir) / f"roles-{side}" for side in SIDES}
        rows = {side: role_rows(folder, role) for side, folder in folders.items()}
        if not rows["joint"]:
            continue
        figures = {side: recorded(json.loads((folders[side] / "roles.json").read_text())["figures"][role][metric])
                   for side in SIDES}
        roles[role] = {"metric": metric, **{side: figures[side] for side in SIDES},
                       "four_minus_joint": estimate(paired_difference(role, metric, rows["joint"], rows["distilled"])),
                       "joint_minus_base": estimate(paired_difference(role, metric, rows["base"], rows["joint"]))}
    if not all((eval_dir / f"e2e-{side}" / "episodes.jsonl").is_file() for side in SIDES):
        return {"eval": str(eval_dir), "joint_eval": str(joint_dir or eval_dir), "roles": roles, "e2e": {"tasks": 0}}
    success = {side: task_success(eval_dir / f"e2e-{side}") for side in SIDES}
    common = sorted(set.intersection(*(set(s) for s in success.values())))
    table = np.asarray([[success[side][t] for side in SIDES] for t in common])
    e2e = {side: estimate(bootstrap(table[:, i])) for i, side in enumerate(SIDES)} if common else {}
    if common:
        e2e["four_minus_joint"] = estimate(bootstrap(table[:, 1] - table[:, 2]))
        e2e["joint_minus_base"] = estimate(bootstrap(table[:, 2] - table[:, 0]))
    return {"eval": str(eval_dir), "joint_eval": str(joint_dir or eval_dir), "roles": roles,
            "e2e": {"tasks": len(common), **e2e}}


REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", type=Path, default=REPO / "runs" / "your-tools-time" / "eval",
                        help="folder with roles-{base,distilled,joint} and e2e-{base,distilled,joint} "
                             "(default: the your-tools example's, %(default)s)")
    parser.add_argument("--joint-eval", type=Path, default=None,
                        help="folder with roles-joint when it is not under --eval")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "joint_vs_roles.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = compare(args.eval, args.joint_eval)
    write_stamped_json(args.out, result, stamp(argv))
    for role, r in result["roles"].items():
        print(f"{role:9} {r['metric']:17} base {cell(r['base'])}  four {cell(r['distilled'])}  "
              f"joint {cell(r['joint'])}  four - joint {cell(r['four_minus_joint'])}")
    e = result["e2e"]
    if e.get("tasks"):
        print(f"end to end ({e['tasks']} tasks): base {cell(e['base'])}  four {cell(e['distilled'])}  "
              f"joint {cell(e['joint'])}  four - joint {cell(e['four_minus_joint'])}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
