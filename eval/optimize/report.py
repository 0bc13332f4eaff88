"""The protocol's figures: four arms on one scorecard per run, their lifts and reliability.

Per run i (its split seed's scorecard tasks, evaluated once after selection), in points:

- arm lift over base: base + harness, distilled, distilled + harness, each minus base,
  paired on the run's tasks;
- the optimizer's own lift: (arm + harness) − arm, for each arm that got a search;
- the interaction: (distilled + harness − base) − (distilled − base) − (base + harness − base):
  positive when harness optimization adds more on the distilled model than on the base;
- with a seed middleware other than the default, the reference: (arm + default middleware)
  − arm, the known repair, and per run how much of it the search recovered
  (:func:`recovery`: the optimizer's lift over the reference's, and whether it reached half).

Over runs: MeanLift with a 95% bootstrap interval over runs, WorstLift (the lowest mean
lift of a pre-declared condition), RR0 (share of runs with lift > 0), and for the
optimizer's lifts RelLift95(B) (:func:`heart_distill.eval.stats.rel_lift95`, selection by
the run's gate lift G_i) at each budget of ``budget_runs``. None is computed from fewer than
:data:`MIN_RUNS` runs; below :data:`DECISIVE_RUNS` the report says the interval decides nothing.

Per search, the report also says what it spent of B and how many candidates it proposed and
gated, and why each other was not (:func:`heart_distill.eval.optimize.search.proposal_tally`):
a lift of 0 from runs that gated nothing measures the budget, not the harness.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from heart_distill.eval.stats import bootstrap, rel_lift95, rr0, worst_lift

MIN_RUNS = 2
DECISIVE_RUNS = 8


def _lift(a: dict[str, float], b: dict[str, float], keys: list[str]) -> float:
    return 100.0 * float(np.mean([a[k] - b[k] for k in keys]))


def series(scorecards: list[dict[str, Any]], optimized: list[str]) -> dict[str, dict[str, Any]]:
    """Per named lift: per-run values, per-condition per-run values, gate statistics."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, run: dict[str, Any], upper: str, lower: str, gate: float | None) -> None:
        arms = run["arms"]
        if upper not in arms or lower not in arms:
            return
        s = out.setdefault(name, {"runs": [], "values": [], "gates": [], "by_condition": {}})
        keys = run["tasks"]
        s["runs"].append(run["run"])
        s["values"].append(_lift(arms[upper]["scores"], arms[lower]["scores"], keys))
        s["gates"].append(gate)
        for condition in sorted({k.split("|")[0] for k in keys}):
            ck = [k for k in keys if k.split("|")[0] == condition]
            s["by_condition"].setdefault(condition, []).append(_lift(arms[upper]["scores"], arms[lower]["scores"], ck))

    for run in scorecards:
        for arm in ("base+harness", "distilled", "distilled+harness"):
            add(f"{arm} − base", run, arm, "base", None)
        for arm in optimized:
            gate = run["arms"].get(f"{arm}+harness", {}).get("gate_lift")
            add(f"optimize on {arm}", run, f"{arm}+harness", arm, gate)
        for arm in [a for a in run["arms"] if "+" not in a]:
            add(f"default middleware on {arm}", run, f"{arm}+default", arm, None)
        arms = run["arms"]
        if all(a in arms for a in ("base", "base+harness", "distilled", "distilled+harness")):
            keys = run["tasks"]
            both = _lift(arms["distilled+harness"]["scores"], arms["base"]["scores"], keys)
            distil = _lift(arms["distilled"]["scores"], arms["base"]["scores"], keys)
            opt = _lift(arms["base+harness"]["scores"], arms["base"]["scores"], keys)
            s = out.setdefault("interaction", {"runs": [], "values": [], "gates": [], "by_condition": {}})
            s["runs"].append(run["run"])
            s["values"].append(both - distil - opt)
            s["gates"].append(None)
    return out


def figures(scorecards: list[dict[str, Any]], optimized: list[str], budget_runs: list[int],
            resamples: int = 5000, seed: int = 0) -> dict[str, Any]:
    """Every lift's statistics over the runs (module docstring)."""
    result: dict[str, Any] = {}
    for name, s in series(scorecards, optimized).items():
        values = np.array(s["values"], dtype=float)
        row: dict[str, Any] = {"runs": s["runs"], "per_run": [round(v, 3) for v in s["values"]], "n": len(values)}
        if len(values) >= MIN_RUNS:
            row["mean_lift"] = bootstrap(values, n_resamples=resamples, seed=seed).to_dict()
            if s["by_condition"]:
                worst, where = worst_lift(s["by_condition"])
                row["worst_lift"] = {"value": worst, "condition": where,
                                     "by_condition": {c: float(np.mean(v)) for c, v in s["by_condition"].items()}}
            row["rr0"] = rr0(values)
            if all(g is not None for g in s["gates"]):
                row["gate_lift_per_run"] = s["gates"]
                row["rel_lift95"] = {f"B={k}x": rel_lift95(s["gates"], values, runs_per_draw=k, run_ids=s["runs"],
                                                           n_resamples=resamples, seed=seed) for k in budget_runs}
            row["decides"] = len(values) >= DECISIVE_RUNS
        result[name] = row
    return result


def recovery(scorecards: list[dict[str, Any]], arm: str, share: float = 0.5) -> dict[str, Any]:
    """Per run, the known repair's scorecard lift ((arm + default) − arm, points), the search's
    ((arm + harness) − arm) and whether the search reached ``share`` of it; over runs, how many
    did. A run whose reference lift is not positive has nothing known to recover: it is
    counted apart (``no_reference_lift``), never as a success."""
    rows = []
    for run in scorecards:
        arms, keys = run["arms"], run["tasks"]
        if not all(a in arms for a in (arm, f"{arm}+default", f"{arm}+harness")):
            continue
        known = _lift(arms[f"{arm}+default"]["scores"], arms[arm]["scores"], keys)
        found = _lift(arms[f"{arm}+harness"]["scores"], arms[arm]["scores"], keys)
        rows.append({"run": run["run"], "reference_lift": round(known, 3), "optimizer_lift": round(found, 3),
                     "harness": arms[f"{arm}+harness"].get("harness"),
                     "recovered": None if known <= 0 else round(found / known, 3),
                     "reached": known > 0 and found >= share * known - 1e-9})
    return {"arm": arm, "share": share, "runs": rows, "n": len(rows),
            "reached": sum(r["reached"] for r in rows),
            "no_reference_lift": sum(r["recovered"] is None for r in rows)}


def arm_scores(scorecards: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each arm's mean scorecard success over runs (points), with its interval over runs."""
    per_arm: dict[str, list[float]] = {}
    for run in scorecards:
        for arm, v in run["arms"].items():
            per_arm.setdefault(arm, []).append(100.0 * float(np.mean([v["scores"][k] for k in run["tasks"]])))
    return {arm: bootstrap(np.array(v)).to_dict() for arm, v in per_arm.items()}


def markdown(doc: dict[str, Any]) -> list[str]:
    """The report's tables."""
    lines = ["| arm | scorecard success (points, mean over runs, 95% interval) |", "|---|---|"]
    for arm, e in doc["arms"].items():
        lines.append(f"| {arm} | {_fmt(e)} |")
    lines += ["", "| lift | MeanLift [95% interval over runs] | WorstLift (condition) | RR0 | RelLift95(B) | runs |",
              "|---|---|---|---|---|---|"]
    for name, row in doc["figures"].items():
        if "mean_lift" not in row:
            lines.append(f"| {name} | – (fewer than {MIN_RUNS} runs) | – | – | – | {row['n']} |")
            continue
        worst = row.get("worst_lift")
        rel = ", ".join(f"{k}: {v:+.1f}" for k, v in row.get("rel_lift95", {}).items()) or "–"
        worst_text = f"{worst['value']:+.1f} ({worst['condition']})" if worst else "–"
        lines.append(f"| {name} | {_fmt(row['mean_lift'], signed=True)} | {worst_text} | "
                     f"{100 * row['rr0']:.0f}% | {rel} | {row['n']} |")
    if any(not row.get("decides", True) for row in doc["figures"].values()):
        lines += ["", f"Fewer than {DECISIVE_RUNS} runs: a 5th percentile is one of the smallest draws, and the "
                      "interval decides nothing."]
    return lines + recovery_lines(doc.get("recovery") or {}) + search_lines(doc.get("searches") or {})


def recovery_lines(recoveries: dict[str, dict[str, Any]]) -> list[str]:
    """Per optimized arm and run: the reference's lift, the search's, the share recovered."""
    lines = []
    for arm, r in recoveries.items():
        if not r["runs"]:
            continue
        lines += ["", f"Known repair on {arm} (seed → seed prompts + default middleware) against the search "
                      f"(seed → selected harness), scorecard points: {r['reached']} of {r['n']} runs recovered at "
                      f"least {100 * r['share']:.0f}% of it ({r['no_reference_lift']} without a reference lift).", "",
                  "| run | reference lift | optimizer lift | recovered | selected |", "|---|---|---|---|---|"]
        for row in r["runs"]:
            share = "–" if row["recovered"] is None else f"{100 * row['recovered']:.0f}%"
            lines.append(f"| {row['run']} | {row['reference_lift']:+.1f} | {row['optimizer_lift']:+.1f} | {share} | "
                         f"{row['harness']} |")
    return lines


def search_lines(searches: dict[str, dict[str, Any]]) -> list[str]:
    """Per search: what it spent of B, how many proposals it made and gated, and why the
    others were not gated — a run that selects the seed says whether it had any chance."""
    if not searches:
        return []
    lines = ["", "| search | rollouts / B | proposed | gated | not gated (why) | unfilled slots (why) | selected |",
             "|---|---|---|---|---|---|---|"]
    for name, s in searches.items():
        tally = s.get("proposals")
        spent = f"{s['spent']['rollouts']} / {s.get('budget') or '?'}"
        if not tally:
            lines.append(f"| {name} | {spent} | – | – | not counted in this log | – | {s['selected']} |")
            continue
        lines.append(f"| {name} | {spent} | {tally['proposed']} of {tally['planned']} | {tally['gated']} | "
                     f"{_reasons(tally['not_gated'])} | {_reasons(tally['unfilled'])} | {s['selected']} |")
    return lines


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {reason}" for reason, k in counts.items()) or "–"


def _fmt(e: dict[str, Any], signed: bool = False) -> str:
    if e.get("value") is None:
        return "–"
    f = "{:+.1f}" if signed else "{:.1f}"
    if e.get("low") is None:
        return f.format(e["value"]) + f" (n={e['n']})"
    return f"{f.format(e['value'])} [{f.format(e['low'])}, {f.format(e['high'])}] (n={e['n']})"
