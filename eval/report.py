"""``heart report``: one markdown page and its PNG plots from evaluation results.

    heart report runs/NAME/eval --out runs/NAME/report
    heart report runs/NAME/eval/roles-base runs/NAME/eval/roles-distilled runs/NAME/eval/e2e-* --out …

Every ``roles.json`` (``heart eval roles``) and ``e2e.json`` (``heart eval e2e``) found under
the given folders becomes a column — base, distilled, teacher — of the per-role tables
and the end-to-end tables; each figure is printed with its bootstrap 95% interval and n.
Distilled end-to-end runs are paired with the base run of the same benchmark, split and
category for the lift figures (:mod:`eval.stats`): Lift_s per distilled run (seed),
MeanLift, WorstLift over the benchmark/category conditions, RR0 and RelLift95. The page
ends with how it was made: the exact commands, package versions, the adapters'
manifests and the datasets' fingerprints. Plots: ``roles.png`` (each role's primary
metric per model, with error bars) and ``lift.png`` (lift per seed and condition).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from heart_distill.eval.formats import ROLES
from heart_distill.eval.metrics import CLARIFICATION_FIGURES, HEADLINE, RATES, paired_difference
from heart_distill.eval.stats import Estimate, lifts, mean_lift, rel_lift95, rr0, worst_lift

ORDER = {"base": 0, "distilled": 1, "teacher": 2}


def find_results(paths: list[str]) -> list[dict[str, Any]]:
    """Every roles.json / e2e.json at or under ``paths``, with the folder it came from."""
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        files = [path] if path.is_file() else sorted([*path.rglob("roles.json"), *path.rglob("e2e.json")])
        for file in files:
            result = json.loads(file.read_text())
            if result.get("kind") not in ("roles", "e2e"):
                raise ValueError(f"{file} is not a heart eval result (no kind roles/e2e)")
            result["_folder"] = str(file.parent)
            found.append(result)
    if not found:
        raise FileNotFoundError(f"no roles.json or e2e.json under {', '.join(paths)}")
    return found


def _columns(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(column name, result): the label, qualified by the folder when a label repeats."""
    results = sorted(results, key=lambda r: (ORDER.get(r["label"], 9), r["_folder"]))
    counts = defaultdict(int)
    for r in results:
        counts[r["label"]] += 1
    return [(r["label"] if counts[r["label"]] == 1 else f"{r['label']} ({Path(r['_folder']).name})", r)
            for r in results]


def _cell(figure: dict[str, Any] | None, name: str) -> str:
    if figure is None:
        return "–"
    estimate = Estimate(**figure)
    return estimate.format(100, 1) if name in RATES or name == "success_rate" else estimate.format(1, 2)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _examples(result: dict[str, Any], role: str) -> list[dict[str, Any]]:
    path = Path(result["_folder"]) / "roles_examples.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["role"] == role]


def role_tables(results: list[dict[str, Any]]) -> list[str]:
    columns = _columns([r for r in results if r["kind"] == "roles"])
    if not columns:
        return []
    lines = ["## Per role (held-out role inputs)", "",
             "Each cell: value [95% bootstrap interval] (n examples). Shares in percent; tokens per "
             "call; latency in seconds per call (wall time of the batch that served it).", ""]
    for role in ROLES:
        present = [(name, r) for name, r in columns if role in r["figures"]]
        if not present:
            continue
        names = list(present[0][1]["figures"][role])
        lines += [f"### {role.capitalize()} (primary: `{HEADLINE[role]}`)", ""]
        rows = [[f"**{n}**" if n == HEADLINE[role] else n] + [_cell(r["figures"][role].get(n), n) for _, r in present]
                for n in names]
        counts = [f"{r['counts'][role]['rows']} / {r['counts'][role]['errored']} / "
                  f"{r['counts'][role]['target_unparsed']} / {r['counts'][role].get('over_long_left_out', 0)}"
                  for _, r in present]
        rows.append(["rows / errored / unreadable targets / over-long left out", *counts])
        base = next((r for _, r in present if r["label"] == "base"), None)
        if base is not None and len(present) > 1:
            cells = []
            for _, r in present:
                if r is base:
                    cells.append("–")
                    continue
                diff = paired_difference(role, HEADLINE[role], _examples(base, role), _examples(r, role))
                cells.append(diff.format(100, 1) if diff.value is not None else "–")
            rows.append([f"Δ {HEADLINE[role]} vs base (paired, points)", *cells])
        lines += _table(["metric", *[name for name, _ in present]], rows) + [""]
    return lines


def _condition(result: dict[str, Any]) -> str:
    return f"{result['env']}/{result.get('category') or '-'}/{result['config']['split']}"


def e2e_tables(results: list[dict[str, Any]]) -> list[str]:
    runs = [r for r in results if r["kind"] == "e2e"]
    if not runs:
        return []
    lines = ["## End to end (held-out tasks, the benchmark's own checker)", "",
             "Success: mean over tasks of each task's mean score over seeds, [95% bootstrap interval over "
             "tasks] (n tasks). Errored episodes (infrastructure) are left out and counted.", ""]
    by_condition = defaultdict(list)
    for r in runs:
        by_condition[_condition(r)].append(r)
    for condition, group in sorted(by_condition.items()):
        columns = _columns(group)
        lines += [f"### {condition}", ""]
        names = ["success_rate", "prompt_tokens_per_task", "completion_tokens_per_task", "role_calls_per_task",
                 *(f"{role}_calls_per_task" for role in ROLES), "parse_failures_per_task", "wall_s_per_task"]
        names += [n for n in CLARIFICATION_FIGURES if any(n in r["figures"] for _, r in columns)]  # BFCL miss_param
        rows = [[f"**{n}**" if n == "success_rate" else n] + [_cell(r["figures"].get(n), n) for _, r in columns]
                for n in names]
        ks = sorted({k for _, r in columns for k in r["pass_hat_k"]}, key=int)
        for k in ks:
            rows.append([f"pass^{k}"] + [f"{100 * r['pass_hat_k'][k]['value']:.1f} (n={r['pass_hat_k'][k]['n']})"
                                          if k in r["pass_hat_k"] else "–" for _, r in columns])
        rows.append(["episodes / errored / seeds"] + [f"{r['counts']['episodes']} / {r['counts']['errored']} / "
                                                      f"{len(r['config']['seeds'])}" for _, r in columns])
        lines += _table(["figure", *[name for name, _ in columns]], rows) + [""]
    return lines


MIN_RUNS = 2
DECISIVE_RUNS = 8
"""Below this many runs a 5th-percentile statistic is one of the few smallest draws (PRISM uses ≥ 8)."""
"""Reliability statistics (MeanLift, WorstLift, RR0, RelLift95) need this many runs of a condition."""


def lift_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Lift_s of each distilled e2e run against the base run of its condition, paired on
    the tasks both scored; then MeanLift, WorstLift, RR0, RelLift95 over all of them."""
    runs = [r for r in results if r["kind"] == "e2e"]
    base = {_condition(r): r for r in runs if r["label"] == "base"}
    per_seed, by_condition = [], defaultdict(list)
    for r in runs:
        if r["label"] != "distilled" or _condition(r) not in base:
            continue
        b = base[_condition(r)]
        tasks = sorted(set(r["per_task_score"]) & set(b["per_task_score"]))
        if not tasks:
            continue
        value = float(lifts(np.array([[r["per_task_score"][t] for t in tasks]]),
                            np.array([b["per_task_score"][t] for t in tasks]))[0])
        per_seed.append({"run": Path(r["_folder"]).name, "condition": _condition(r), "lift": value,
                         "tasks": len(tasks)})
        by_condition[_condition(r)].append(value)
    if not per_seed:
        return {}
    runs_per_condition = max(len(values) for values in by_condition.values())
    figures: dict[str, Any] = {"per_seed": per_seed, "runs_per_condition": runs_per_condition}
    if runs_per_condition < MIN_RUNS:
        return figures  # one run per condition: its lift is one draw, not a reliability figure
    values = [p["lift"] for p in per_seed]
    worst, where = worst_lift(by_condition)
    return {**figures, "mean_lift": mean_lift(values), "worst_lift": worst, "worst_condition": where,
            "rr0": rr0(values),
            # No gate statistic chooses among distillation seeds: at the budget of one run
            # RelLift95 is the 5th percentile of the runs' lifts (eval.stats.rel_lift95).
            "rel_lift95": rel_lift95(np.zeros(len(values)), values, runs_per_draw=1),
            "decides": len(values) >= DECISIVE_RUNS}


def lift_section(figures: dict[str, Any]) -> list[str]:
    if not figures:
        return []
    lines = ["## Lift of distillation (end to end, points)", "",
             "Lift_s = 100 × mean over the tasks both runs scored of (distilled_s − base); "
             "WorstLift = minimum over conditions of the mean lift within it; RR0 = share of seeds "
             "with lift > 0; RelLift95 = 5th percentile, over 5,000 resamples of the runs, of the lift "
             "of one run (no gate statistic chooses among distillation seeds).", ""]
    rows = [[p["run"], p["condition"], f"{p['lift']:+.1f}", str(p["tasks"])] for p in figures["per_seed"]]
    lines += _table(["distilled run", "condition", "Lift_s", "n tasks"], rows) + [""]
    if "mean_lift" not in figures:
        lines += [f"One run per condition: no reliability statistics. MeanLift, WorstLift, RR0 and RelLift95 "
                  f"are figures over repeated runs (seeds) of a condition and need at least {MIN_RUNS}; "
                  f"the lifts above are single draws.", ""]
        return lines
    lines += [f"MeanLift {figures['mean_lift']:+.1f} · WorstLift {figures['worst_lift']:+.1f} "
              f"({figures['worst_condition']}) · RR0 {100 * figures['rr0']:.0f}% · "
              f"RelLift95 {figures['rel_lift95']:+.1f} (S={len(figures['per_seed'])} runs)", ""]
    if not figures.get("decides", True):
        lines += [f"With {len(figures['per_seed'])} runs (fewer than {DECISIVE_RUNS}) a 5th percentile is the "
                  "smallest lift or near it: the interval decides nothing.", ""]
    return lines


def provenance_section(results: list[dict[str, Any]]) -> list[str]:
    lines = ["## How this was made", "", "Commands, per column (runs made through the Python API show that "
             "process's command line; their full config is in the result file):", "", "```bash"]
    by_command: dict[str, list[str]] = {}  # one process may make several columns (base and distilled)
    for name, r in _columns(results):
        by_command.setdefault(r["provenance"]["command"], []).append(f"{r['kind']}: {name}  ({r['_folder']})")
    for command, columns in by_command.items():
        lines += [f"# {column}" for column in columns] + [command]
    lines += ["```", ""]
    first = results[0]["provenance"]
    lines += [f"Code commit `{first.get('commit')}`; versions: "
              + ", ".join(f"{k} {v}" for k, v in first["versions"].items()), ""]
    adapters = {}
    for r in results:
        for role, a in r.get("adapters", {}).items():
            adapters[(role, a["path"])] = a.get("manifest", {})
    if adapters:
        rows = []
        for (role, path), m in sorted(adapters.items()):
            base = m.get("base_model", {})
            data = m.get("dataset", {})
            sft = (m.get("recipe") or {}).get("sft", {})
            rows.append([role, f"`{path}`", f"{base.get('name', '?')} `{str(base.get('content_hash'))[:16]}`",
                         f"r={m.get('lora', {}).get('r', '?')}", _training(m, sft),
                         str(m.get("system_prompt", "?")), f"`{str(data.get('fingerprint'))[:23]}`",
                         str(data.get("sizes", {}).get("train", "?"))])
        lines += ["Adapters (from their manifest.json):", ""]
        lines += _table(["role", "folder", "base (hash)", "LoRA", "training", "system prompt",
                         "train dataset fingerprint", "train rows"], rows) + [""]
    datasets = {}
    for r in results:
        for role, d in (r.get("datasets") or {}).items():
            datasets[(role, d["path"], d["split"])] = d["fingerprint"]
    if datasets:
        lines += ["Held-out role datasets:", ""]
        lines += _table(["role", "folder", "split", "fingerprint"],
                        [[role, f"`{path}`", split, f"`{fp[:23]}`"] for (role, path, split), fp in
                         sorted(datasets.items())]) + [""]
    return lines


def plot_roles(results: list[dict[str, Any]], path: Path) -> bool:
    columns = _columns([r for r in results if r["kind"] == "roles"])
    if not columns:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(columns)
    x = np.arange(len(ROLES))
    for i, (name, r) in enumerate(columns):
        values, low, high = [], [], []
        for role in ROLES:
            f = r["figures"].get(role, {}).get(HEADLINE[role]) or {}
            v = f.get("value")
            values.append(100 * v if v is not None else np.nan)
            low.append(100 * (v - f["low"]) if f.get("low") is not None else 0)
            high.append(100 * (f["high"] - v) if f.get("high") is not None else 0)
        bars = ax.bar(x + (i - (len(columns) - 1) / 2) * width, values, width, yerr=[low, high], capsize=3, label=name)
        for bar, role, value, up in zip(bars, ROLES, values, high):
            n = (r["figures"].get(role, {}).get(HEADLINE[role]) or {}).get("n")
            if not np.isnan(value):  # above the error bar, so nothing overlaps
                ax.annotate(f"{value:.0f}\nn={n}", (bar.get_x() + bar.get_width() / 2, value + up + 1),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{role}\n{HEADLINE[role]}" for role in ROLES], fontsize=8)
    ax.set_ylabel("% (95% bootstrap interval)")
    ax.set_ylim(0, 122)
    ax.set_yticks(range(0, 101, 20))
    ax.set_title("Primary held-out metric per role")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(columns), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_lift(figures: dict[str, Any], path: Path) -> bool:
    if not figures:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_seed = figures["per_seed"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{p['run']}\n{p['condition']}" for p in per_seed]
    values = [p["lift"] for p in per_seed]
    ax.bar(range(len(values)), values, color=["tab:green" if v > 0 else "tab:red" for v in values])
    ax.axhline(0, color="black", linewidth=0.8)
    if "mean_lift" in figures:  # only over repeated runs (lift_figures)
        ax.axhline(figures["mean_lift"], color="tab:blue", linestyle="--",
                   label=f"MeanLift {figures['mean_lift']:+.1f}")
    for i, v in enumerate(values):
        ax.annotate(f"{v:+.1f}", (i, v), ha="center", va="bottom" if v >= 0 else "top", fontsize=8)
    span = max(10.0, 1.25 * max(abs(v) for v in values))  # a zero lift still gets a readable axis
    ax.set_ylim(-span, span)
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("lift (points)")
    ax.set_title("End-to-end lift per distilled run (seed)")
    if "mean_lift" in figures:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(paths: list[str], out: str | Path, argv: list[str] | None = None) -> Path:
    results = find_results(paths)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lift = lift_figures(results)
    lines = ["# HEART role distillation: evaluation report", "",
             f"{sum(r['kind'] == 'roles' for r in results)} per-role run(s), "
             f"{sum(r['kind'] == 'e2e' for r in results)} end-to-end run(s).", ""]
    if plot_roles(results, out / "roles.png"):
        lines += ["![primary metric per role](roles.png)", ""]
    lines += role_tables(results) + e2e_tables(results) + lift_section(lift)
    if plot_lift(lift, out / "lift.png"):
        lines += ["![lift per seed](lift.png)", ""]
    lines += provenance_section(results)
    if argv is not None:
        lines += ["Report: `heart " + " ".join(argv) + "`", ""]
    page = out / "report.md"
    page.write_text("\n".join(lines))
    (out / "report.json").write_text(json.dumps({"lift": lift, "runs": [r["_folder"] for r in results]}, indent=2))
    return page


def main(argv: list[str], full_argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart report", description="markdown report + PNG plots")
    parser.add_argument("runs", nargs="+", help="folders holding roles.json / e2e.json (searched recursively)")
    parser.add_argument("--out", required=True, help="folder for report.md, roles.png, lift.png")
    args = parser.parse_args(argv)
    try:
        page = write_report(args.runs, args.out, full_argv)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0


def _training(manifest: dict, sft: dict) -> str:
    """What the adapter was trained for: the optimizer steps it ran (its metrics), else what its
    recipe asked for (``max_steps`` -1 means "epochs", as in transformers)."""
    steps = (manifest.get("metrics") or {}).get("steps")
    if steps is not None:
        return f"{steps} steps"
    if sft.get("max_steps", -1) not in (-1, None):
        return f"{sft['max_steps']} steps"
    return f"{sft.get('epochs', '?')} epoch(s)"
