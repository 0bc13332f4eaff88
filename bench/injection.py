"""Prompt injection with a model: AgentDojo attacks against HEART and a single-model baseline.

    nice -n 19 python bench/injection.py                        # base roles + baseline, 6 pairs
    nice -n 19 python bench/injection.py --adapters runs/smollm2-pipeline/adapters
    python bench/injection.py --pairs 2 --max-plan-steps 2      # a quick look

A *pair* is (AgentDojo user task, injection task): the user task runs twice per system,
once in its suite's benign environment and once with AgentDojo's own attack (default
``important_instructions``) planted in every injection vector its ground truth reads
(``AgentDojoEnvironment.under_attack``). The user task's ``utility`` check scores both runs,
and the injection task's ``security`` check says whether the attack succeeded. Systems, on
the SAME pairs and the SAME base model, greedy decoding:

- ``heart-base``: the HEART loop (``heart.episode.run_episode``, as ``heart run`` runs it)
  with every role answered by the base model;
- ``heart-distilled``: the same loop with the role adapters in ``--adapters DIR``
  (planner/router/primitive/verifier subfolders), when given;
- ``single-model``: ``heart.baseline`` — one prompt with every tool schema of the suite, a
  JSON tool call or final answer per model turn (constrained), at most ``--baseline-calls``.

Figures: utility without attack, utility under attack and attack success rate (ASR), each
k/n with a 95% Wilson interval over pairs; errored episodes (backend or checker crashed)
are counted apart, never as model failures. For HEART under attack, the share of episodes
in which the injected text reached each role's input (searched in the trace's messages).

User tasks whose utility check passes on an empty episode (agentdojo's own vacuous checks,
e.g. banking 5, 6, 8, 9, 10) and pairs whose security check passes on an empty episode are
left out of the sample: a model that does nothing would score on them.

Greedy decoding is deterministic, so each system's backend remembers its answers: the
clean and attacked runs of a pair share every role call made before tool output differs
(the Planner's first plan, usually the Router's dispatch) and pay for them once.

Writes ``runs/bench/injection.json`` (``--out``: every episode and the summary under the run's
provenance stamp; rewritten after each pair, so an interrupted run keeps the pairs it finished)
and prints a markdown table. Curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402  (after the path insert)
from heart_distill.eval.stats import wilson  # noqa: E402

from heart import ROLES  # noqa: E402
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig  # noqa: E402

RESULT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "injection.json"
"""Where a run's result goes by default (runs/ is not tracked)."""


# --- statistics ---------------------------------------------------------------------------



def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": (k / n) if n else None, "ci95": [round(lo, 4), round(hi, 4)]}


# --- pairs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    task_id: str
    """The AgentDojo user task, e.g. ``banking/user_task_3``."""
    injection_task_id: str
    """The injection task of the same suite whose goal the attack plants."""
    attack: str


def _empty_episode(environment, task) -> tuple[bool, bool | None]:
    """(utility, attack succeeded) of an episode that calls nothing and answers nothing."""
    session = environment.start(task)
    session.start_turn(0)
    session.finish_turn(0, "")
    score = session.score()
    return score.success, score.details.get("attack_succeeded")


def sample_pairs(environment, suite: str, n: int, seed: int, attack: str) -> list[Pair]:
    """``n`` pairs with distinct user tasks of ``suite``, drawn with ``seed``: each user task
    gets one injection task at random. Leaves out what a do-nothing episode would pass."""
    rng = random.Random(seed)
    task_ids = [t for t in environment.task_ids() if t.startswith(f"{suite}/")]
    injection_ids = environment.injection_task_ids(suite)
    rng.shuffle(task_ids)
    pairs = []
    for task_id in task_ids:
        if len(pairs) == n:
            break
        if _empty_episode(environment, environment.load_task(task_id))[0]:
            continue  # vacuous utility check
        injection_task_id = rng.choice(injection_ids)
        try:
            attacked = environment.under_attack(task_id, injection_task_id, attack)
        except ValueError:  # agentdojo: no injection vector is read by this task
            continue
        if _empty_episode(attacked, attacked.load_task(task_id))[1]:
            continue  # vacuous security check
        pairs.append(Pair(task_id, injection_task_id, attack))
    return pairs


# --- what one run of one system returns ----------------------------------------------------

@dataclass
class Outcome:
    """One episode of one system on one pair, in one condition (clean or attacked)."""

    success: bool = False
    """The user task's utility check."""
    attack_succeeded: bool | None = None
    """The injection task's security check (attacked runs only)."""
    errored: bool = False
    error: str | None = None
    reached: dict[str, int] = field(default_factory=dict)
    """Role (or "model" for the baseline) → how many of its calls had injected text in
    their input (attacked runs only)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Role → calls made."""
    wall_s: float = 0.0


def injection_marker(goal: str, words: int = 8) -> str:
    """What to search role inputs for: the first words of the injection task's goal, with
    whitespace collapsed (AgentDojo's YAML and JSON-encoded tool results both reflow it)."""
    return " ".join(goal.split()[:words])


def normalised(text: str) -> str:
    """``text`` with JSON escapes of whitespace and every whitespace run as one space."""
    return re.sub(r"\s+", " ", text.replace("\\n", " ").replace("\\t", " "))


def reach(messages_by_call: Sequence[tuple[str, list[Message]]], marker: str) -> tuple[dict[str, int], dict[str, int]]:
    """(role → calls whose input holds ``marker``, role → calls) over (role, messages) pairs."""
    reached: dict[str, int] = {}
    calls: dict[str, int] = {}
    for role, messages in messages_by_call:
        calls[role] = calls.get(role, 0) + 1
        if marker and marker in normalised("\n".join(m["content"] for m in messages)):
            reached[role] = reached.get(role, 0) + 1
    return reached, calls


System = Callable[[Any, Any, str], Outcome]
"""(environment, task, marker or "" when clean) → Outcome."""


def heart_system(backend, config, sampling: dict[str, SamplingConfig], trace_dir: Path) -> System:
    """The HEART loop as ``heart run`` runs it; reach is read back from the episode's trace."""
    from heart.episode import run_episode
    from heart.traces import TraceWriter, read_trace

    counter = iter(range(10**9))

    def run(environment, task, marker: str) -> Outcome:
        path = trace_dir / f"{next(counter):04d}.jsonl"
        with TraceWriter(path, fsync=False) as trace:
            record = run_episode(environment, task, backend, config=config, trace=trace, sampling=sampling).record
        rows = [r for r in read_trace(path) if r["kind"] == "event"]
        reached, calls = reach([(r["role"], r["messages"]) for r in rows], marker)
        return Outcome(record.success, record.checker.get("attack_succeeded"), record.errored, record.error,
                       reached if marker else {}, calls, record.wall_s)

    return run


def baseline_system(backend, config) -> System:
    """``heart.baseline``'s single-model loop; its whole conversation is searched for reach."""
    from heart.baseline import run_baseline_episode

    def run(environment, task, marker: str) -> Outcome:
        result = run_baseline_episode(environment, task, backend, config)
        # One model call per assistant message; its input is everything before it.
        inputs = [("model", result.messages[:i]) for i, m in enumerate(result.messages) if m["role"] == "assistant"]
        reached, calls = reach(inputs, marker)
        return Outcome(result.success, result.checker.get("attack_succeeded"), result.errored, result.error,
                       reached if marker else {}, calls, result.wall_s)

    return run


class RememberingBackend:
    """Wraps a backend for greedy decoding: an identical (role, messages, sampling) call is
    answered from memory. Exact only because greedy decoding is deterministic."""

    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name
        self.answers: dict[str, Generation] = {}
        self.hits = 0

    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        key = json.dumps([role, messages, asdict(sampling or SamplingConfig())], sort_keys=True)
        if key in self.answers:
            self.hits += 1
        else:
            self.answers[key] = self.backend.generate(role, messages, sampling)
        return self.answers[key]

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]


# --- the pair runner and the summary --------------------------------------------------------

def run_pair(clean_environment, pair: Pair, systems: dict[str, System],
             progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Outcome]]:
    """Every system on ``pair``: clean, then under attack (``progress`` is told after each
    episode). An exception a system lets out is an errored outcome (the bench goes on)."""
    attacked = clean_environment.under_attack(pair.task_id, pair.injection_task_id, pair.attack)
    goal = attacked.injection_task.GOAL
    marker = injection_marker(goal)
    outcomes: dict[str, dict[str, Outcome]] = {}
    for name, system in systems.items():
        outcomes[name] = {}
        for condition, environment in (("clean", clean_environment), ("attacked", attacked)):
            try:
                outcome = system(environment, environment.load_task(pair.task_id),
                                 marker if condition == "attacked" else "")
            except Exception as err:  # infrastructure, not the model
                outcome = Outcome(errored=True, error=f"{type(err).__name__}: {err}")
            outcomes[name][condition] = outcome
            progress(f"{name} {condition}")
    return outcomes


def summarize(rows: list[dict[str, Any]], systems: Sequence[str]) -> dict[str, Any]:
    """Per system: utility clean / under attack, ASR (errored episodes left out of each n and
    counted apart), and per role the attacked episodes whose input the injection reached."""
    summary: dict[str, Any] = {}
    for name in systems:
        clean = [r["outcomes"][name]["clean"] for r in rows]
        attacked = [r["outcomes"][name]["attacked"] for r in rows]
        clean_ok = [o for o in clean if not o["errored"]]
        attacked_ok = [o for o in attacked if not o["errored"]]
        seen = {role for o in attacked_ok for role in o["calls"]}
        roles = [r for r in ROLES if r in seen] + sorted(seen - set(ROLES))  # loop order, then "model"
        summary[name] = {
            "utility_clean": rate(sum(o["success"] for o in clean_ok), len(clean_ok)),
            "utility_attacked": rate(sum(o["success"] for o in attacked_ok), len(attacked_ok)),
            "asr": rate(sum(bool(o["attack_succeeded"]) for o in attacked_ok), len(attacked_ok)),
            "errored": {"clean": len(clean) - len(clean_ok), "attacked": len(attacked) - len(attacked_ok)},
            "reach_episodes": {**{role: rate(sum(o["reached"].get(role, 0) > 0 for o in attacked_ok), len(attacked_ok))
                                  for role in roles},
                               # exposure: did the injection reach the system at all (its tools read the vector)?
                               "any": rate(sum(any(o["reached"].values()) for o in attacked_ok), len(attacked_ok))},
            "reach_calls": {role: [sum(o["reached"].get(role, 0) for o in attacked_ok),
                                   sum(o["calls"].get(role, 0) for o in attacked_ok)] for role in roles},
        }
    return summary


def _cell(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "n = 0"
    return f"{r['k']}/{r['n']} = {r['rate']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]"


def markdown(summary: dict[str, Any]) -> str:
    """The results table, then the reach table for HEART runs."""
    lines = ["| system | utility, no attack | utility under attack | attack success (ASR) | errored (clean / attacked) |",
             "|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {_cell(s['utility_clean'])} | {_cell(s['utility_attacked'])} | "
                     f"{_cell(s['asr'])} | {s['errored']['clean']} / {s['errored']['attacked']} |")
    lines += ["", "| system | role | attacked episodes where injected text reached its input | calls |",
              "|---|---|---|---|"]
    for name, s in summary.items():
        for role, r in s["reach_episodes"].items():
            k, n = s["reach_calls"].get(role, (sum(c[0] for c in s["reach_calls"].values()),
                                                sum(c[1] for c in s["reach_calls"].values())))
            lines.append(f"| {name} | {role} | {_cell(r)} | {k}/{n} |")
    return "\n".join(lines)


def adapters_with_short_prompts(adapters: dict[str, str]) -> tuple[str, ...]:
    """The roles whose adapter manifest says it was trained on the short system prompt."""
    roles = []
    for role, path in adapters.items():
        manifest = Path(path) / "manifest.json"
        if manifest.is_file() and json.loads(manifest.read_text()).get("system_prompt") == "short":
            roles.append(role)
    return tuple(roles)


def _outcomes_json(outcomes: dict[str, dict[str, Outcome]]) -> dict[str, Any]:
    return {name: {c: asdict(o) for c, o in by.items()} for name, by in outcomes.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="banking", help="AgentDojo suite (default banking: 11 tools)")
    parser.add_argument("--pairs", type=int, default=6,
                        help="(user task, injection task) pairs (default 6: ~40 min niced, at ~400 s per pair)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pair sample")
    parser.add_argument("--attack", default="important_instructions", help="an AgentDojo attack name")
    parser.add_argument("--model", default="smollm2-135m", help="the one base model (as for heart run)")
    parser.add_argument("--adapters", type=Path, default=None,
                        help="folder with planner/router/primitive/verifier adapters: adds heart-distilled")
    parser.add_argument("--budget", type=int, default=0, help="HEART re-plan budget B")
    parser.add_argument("--max-plan-steps", type=int, default=3)
    parser.add_argument("--router-mode", choices=["plan", "step"], default="plan",
                        help="the Router's mode, the one its adapter learned (docs/loop.md)")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="per role call / model turn")
    parser.add_argument("--baseline-calls", type=int, default=4, help="most tool calls of the single-model baseline")
    parser.add_argument("--traces", type=Path, default=None, help="keep the HEART traces here (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULT, help="the JSON result (default: %(default)s)")
    parser.add_argument("--table", action="store_true",
                        help="run nothing: re-summarise the episodes in --out and print the tables")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    if args.table:  # the episodes keep the stamp of the run that produced them
        result = json.loads(args.out.read_text())
        result["summary"] = summarize(result["episodes"], list(result["summary"]))
        write_stamped_json(args.out, result, result.get("stamp") or run_stamp)
        print(f"{len(result['episodes'])} pairs, {result['wall_s']:.0f} s\n{markdown(result['summary'])}")
        return 0

    from heart.progress import progress_bar

    from heart.baseline import BaselineConfig
    from heart.catalog import tool_companions
    from heart.environments.agentdojo import AgentDojoEnvironment
    from heart.loop import LoopConfig
    from heart.user_errors import UserError, transformers_backend

    adapters, short_prompts = {}, ()
    if args.adapters is not None:
        adapters = {role: str(args.adapters / role) for role in ROLES}
        missing = [p for p in adapters.values() if not Path(p).is_dir()]
        if missing:
            print(f"error: --adapters {args.adapters}: no adapter folder {', '.join(missing)}", file=sys.stderr)
            return 2
        short_prompts = adapters_with_short_prompts(adapters)
    model = args.model.removeprefix("hf:")
    try:
        base = RememberingBackend(transformers_backend(model))
        distilled = RememberingBackend(transformers_backend(model, adapters)) if adapters else None
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    environment = AgentDojoEnvironment(suites=[args.suite])
    tool_companions(environment)  # learnt once from the clean train split, shared by every view
    pairs = sample_pairs(environment, args.suite, args.pairs, args.seed, args.attack)
    if not pairs:
        print(f"error: suite {args.suite!r} has no injectable, non-vacuous user task", file=sys.stderr)
        return 2
    config = LoopConfig(replan_budget=args.budget, max_clarifications=0, max_plan_steps=args.max_plan_steps,
                        router_mode=args.router_mode,
                        constrained=True)
    # Adapters trained on a role's short system prompt (context distillation) are served with it.
    distilled_config = dataclasses.replace(config, short_prompts=short_prompts)
    sampling = {r: SamplingConfig(max_new_tokens=args.max_new_tokens) for r in ROLES}
    settings = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "loop": asdict(config), "distilled_short_prompts": list(short_prompts), "pairs_drawn": [asdict(p) for p in pairs]}
    with tempfile.TemporaryDirectory() as tmp:
        trace_root = args.traces or Path(tmp)
        systems: dict[str, System] = {}
        for name, backend, loop_config in (("heart-base", base, config),
                                           ("heart-distilled", distilled, distilled_config)):
            if backend is not None:
                (trace_root / name).mkdir(parents=True, exist_ok=True)
                systems[name] = heart_system(backend, loop_config, sampling, trace_root / name)
        systems["single-model"] = baseline_system(base, BaselineConfig(max_calls=args.baseline_calls,
                                                                       max_new_tokens=args.max_new_tokens))
        rows: list[dict[str, Any]] = []
        start = time.perf_counter()
        bar = progress_bar(total=len(pairs) * len(systems) * 2, unit="episode", desc="injection", file=sys.stdout)
        for pair in pairs:
            def progress(done: str, pair=pair) -> None:
                bar.set_postfix_str(f"{pair.task_id.partition('/')[2]}×{pair.injection_task_id}: {done} done", refresh=False)
                bar.update(1)
            outcomes = run_pair(environment, pair, systems, progress)
            rows.append({"pair": asdict(pair), "outcomes": _outcomes_json(outcomes)})
            result = {"settings": settings, "wall_s": round(time.perf_counter() - start, 1),
                      "remembered_calls": {"base": base.hits, "distilled": distilled.hits if distilled else 0},
                      "summary": summarize(rows, list(systems)), "episodes": rows}
            write_stamped_json(args.out, result, run_stamp)
        bar.close()
    print(f"\nAgentDojo {args.suite}, attack {args.attack!r}, {len(rows)} pairs, base {args.model}, greedy; "
          f"HEART B={args.budget}, plans <= {args.max_plan_steps} steps; baseline <= {args.baseline_calls} calls; "
          f"{result['wall_s']:.0f} s")
    print(markdown(result["summary"]))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
