"""A readable account of an episode as it runs: plan, dispatches, results, verdicts, score."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Account:
    """An observer for :class:`heart.loop.HeartLoop` that prints what happens."""

    def __init__(self, out: TextIO | None = None):
        self.out = out  # None: whatever sys.stdout is when printing (not when this module loaded)

    def __call__(self, kind: str, p: dict[str, Any]) -> None:
        w = lambda line: print(line, file=self.out or sys.stdout, flush=True)  # noqa: E731
        if kind == "turn":
            w(f"\n── turn {p['turn']} ── user: {_short(p['query'], 300)}")
        elif kind == "clarification":
            w(f"  ? planner asks: {_short(p['question'])}\n    user answers: {_short(p['answer'])}")
        elif kind == "plan":
            plan = p["plan"]
            if plan.status == "INSUFFICIENT":
                return  # the clarification event tells it
            again = " (re-plan)" if plan.replanned else ""
            w(f"  [attempt {p['attempt']}] plan{again} ({_short(plan.intent.task or 'no task stated', 120)}):")
            for s in plan.plan:
                deps = f" after {s.dependencies}" if s.dependencies else ""
                code = " (code)" if s.family == "code" else ""
                w(f"    {s.step}. {s.tool_hint}{code}{deps}: {_short(s.objective, 120)}")
        elif kind == "dispatch":
            for d in p["dispatch"].dispatch:
                h = d.h_params
                w(f"    → step {d.step} {d.target_tool} {_short(d.resolved_bindings, 100)} "
                  f"(retry={h.retry}, priority={h.priority}, timeout={h.timeout_s}s): {_short(d.invocation_request, 100)}")
        elif kind == "result":
            e = p["envelope"]
            if e.reused:
                w(f"    ↺ step {p['step']} {e.tool}: kept from attempt {e.meta['reused']['attempt']} step "
                  f"{e.meta['reused']['step']} (not run again) → {_short(e.summary or e.details, 120)}")
            elif e.ok:
                w(f"    ✓ step {p['step']} {e.tool}({_short(e.bound_arguments, 80)}) → {_short(e.summary, 120)}")
            else:
                w(f"    ✗ step {p['step']} {e.tool}: {e.failure_type}: {_short(e.details, 140)}")
        elif kind == "verdict":
            v = p["verdict"]
            detail = "" if v.status == "PASS" else f" {v.criteria.failed()} {_short(v.feedback, 200)}"
            w(f"  verifier (step {v.step}): {v.status}{detail}")
        elif kind == "parse_error":
            w(f"  ! {p['role']} output unusable (attempt {p['attempt']}): {_short(p['error'], 200)}")
        elif kind == "replan":
            w(f"  ↻ re-plan {p['attempt']} with {len(p['feedback'])} feedback(s), latest: {_short(p['feedback'][-1], 200)}")
        elif kind == "turn_end":
            r = p["result"]
            w(f"  turn {p['turn']}: {r.verdict} after {len(r.attempts)} attempt(s)")
        elif kind == "score" and p["record"].errored:
            r = p["record"]
            w(f"\n═ episode {r.task_id}: ERRORED (infrastructure, not a model failure): {r.error}")
        elif kind == "score":
            r = p["record"]
            w(f"\n═ episode {r.task_id}: score {r.score:.2f} ({'valid' if r.success else 'invalid'} by the "
              f"{r.env} checker), verdicts {r.verdicts}, re-plans {r.replans_used}, {r.wall_s:.1f}s")
            if r.reused_steps or r.passed_steps_reexecuted or r.state_changing_executed_twice:
                w(f"  re-plans kept {r.reused_steps} executed step(s) instead of running them again; "
                  f"passed steps re-executed: {r.passed_steps_reexecuted}, state-changing calls executed "
                  f"twice: {r.state_changing_executed_twice}")
            if not r.success and r.checker:
                w(f"  checker: {_short(r.checker, 300)}")
