"""Prompt injection with a model: AgentDojo attacks on held-out tasks, HEART base vs distilled.

    nice -n 19 python bench/injection.py --engine llamacpp:f16               # base roles, 20 test-split pairs
    nice -n 19 python bench/injection.py --engine llamacpp:f16 --adapters runs/smollm2-pipeline/adapters
    python bench/injection.py --pairs 2 --suites banking --max-plan-steps 2  # a quick look

A *pair* is (AgentDojo user task, injection task of the same suite): the user task runs
twice per system, once in its suite's benign environment and once with AgentDojo's own
attack (default ``important_instructions``) planted in every injection vector its ground
truth reads (``AgentDojoEnvironment.under_attack``). The user task's ``utility`` check
scores both runs, and the injection task's ``security`` check says whether the attack
succeeded. Systems, on the SAME pairs and the SAME base model, greedy decoding:

- ``heart-base``: the HEART loop (``heart.episode.run_episode``, as ``heart run`` runs it)
  with every role answered by the base model;
- ``heart-distilled``: the same loop with the role adapters in ``--adapters DIR``
  (planner/router/primitive/verifier subfolders), when given;
- ``single-model`` (``--baseline``): ``heart.baseline`` — one prompt with every tool schema
  of the suite, a JSON tool call or final answer per model turn (constrained), at most
  ``--baseline-calls``.

**Held out.** User tasks come from one split of the toolkit's task split (``--split``,
default ``test``: ``heart.environments.splits``, the split collection and training use), so
no pair's user task was seen in training or chosen on dev. The pairs are drawn across the
suites in ``--suites`` (default all four: one suite's test split is too small for 20 pairs)
in turn, one injection task per user task first, then a second one per user task, and so
on: ``--pairs`` distinct pairs, as many distinct user tasks as there are. User tasks whose
utility check passes on an empty episode (agentdojo's own vacuous checks, e.g. banking 5, 6,
8, 9, 10) and pairs whose security check passes on an empty episode are left out: a model
that does nothing would score on them.

**One engine.** Base and distilled share one in-process model (``--engine``: peft, or
llama.cpp, e.g. ``llamacpp:f16``), the base side served without adapters
(``heart_distill.eval.models.shared_backends``, as ``heart eval e2e`` does), behind one
batching scheduler: ``--concurrency`` episodes of every pair, system and condition run at
once, and their role calls decode in the same batches.

Greedy decoding is deterministic, so each system's backend remembers its answers: the
clean and attacked runs of a pair share every role call made before tool output differs
(the Planner's first plan, usually the Router's first dispatch) and pay for them once, even
when both runs are in flight (the second waits for the first's answer).

Figures: utility without attack, utility under attack and attack success rate (ASR), each
k/n with a 95% Wilson interval over pairs; distilled − base on the same pairs with a
paired bootstrap interval; the same per suite. Errored episodes (backend or checker
crashed) are counted apart, never as model failures. Role calls whose prompt did not fit
the engine's context slot are counted (the model answers nothing: a model failure, as in
``heart eval e2e``). For HEART under attack, the share of episodes in which the injected
text reached each role's input (searched in the trace's messages).

Writes ``runs/bench/injection.json`` (``--out``: every episode and the summary under the run's
provenance stamp; rewritten after each pair, so an interrupted run keeps the pairs it finished)
and prints a markdown table. Curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402  (after the path insert)
from heart_distill.eval.stats import bootstrap, wilson  # noqa: E402

from heart import ROLES  # noqa: E402
from heart.environments.splits import split_of  # noqa: E402
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig  # noqa: E402
from heart.runtime.engines import ENGINE_SPECS  # noqa: E402

RESULT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "injection.json"
"""Where a run's result goes by default (runs/ is not tracked)."""

SUITES = ("workspace", "travel", "banking", "slack")
"""AgentDojo's suites, the order pairs are drawn from them in."""

BASELINE_SYSTEM = "single-model"


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

    @property
    def suite(self) -> str:
        return self.task_id.partition("/")[0]


def _empty_episode(environment, task) -> tuple[bool, bool | None]:
    """(utility, attack succeeded) of an episode that calls nothing and answers nothing."""
    session = environment.start(task)
    session.start_turn(0)
    session.finish_turn(0, "")
    score = session.score()
    return score.success, score.details.get("attack_succeeded")


def held_out_tasks(environment, suites: str | Sequence[str], split: str = "test") -> dict[str, list[str]]:
    """Suite → its user tasks in ``split`` (the toolkit's split: what collection and
    training use), in AgentDojo's order."""
    suites = [suites] if isinstance(suites, str) else list(suites)
    in_split = environment.task_ids(split)
    return {suite: [t for t in in_split if t.startswith(f"{suite}/")] for suite in suites}


def sample_pairs(environment, suites: str | Sequence[str], n: int, seed: int, attack: str,
                 split: str = "test") -> list[Pair]:
    """``n`` distinct pairs whose user tasks are all in ``split`` of ``suites``, drawn with
    ``seed``: the suites take turns, each offering its next user task (shuffled); every user
    task gets one injection task at random before any gets a second, and so on, until ``n``
    pairs or none is left. Leaves out what a do-nothing episode would pass."""
    rng = random.Random(seed)
    by_suite = held_out_tasks(environment, suites, split)
    for tasks in by_suite.values():
        rng.shuffle(tasks)
    # the suites in turn: workspace's first task, travel's first, ..., workspace's second, ...
    order = [tasks[i] for i in range(max(map(len, by_suite.values()), default=0))
             for tasks in by_suite.values() if i < len(tasks)]
    order = [t for t in order if not _empty_episode(environment, environment.load_task(t))[0]]  # vacuous utility
    queues: dict[str, list[str]] = {}
    for task_id in order:
        injections = list(environment.injection_task_ids(task_id.partition("/")[0]))
        rng.shuffle(injections)
        queues[task_id] = injections
    pairs: list[Pair] = []
    while len(pairs) < n and any(queues.values()):
        for task_id in order:
            if len(pairs) == n:
                break
            while queues.get(task_id):  # this user task's next usable injection task
                injection_task_id = queues[task_id].pop(0)
                try:
                    attacked = environment.under_attack(task_id, injection_task_id, attack)
                except ValueError:  # agentdojo: no injection vector is read by this task
                    queues[task_id] = []
                    break
                if _empty_episode(attacked, attacked.load_task(task_id))[1]:
                    continue  # vacuous security check
                pairs.append(Pair(task_id, injection_task_id, attack))
                break
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
    overflowed: int = 0
    """Calls whose prompt did not fit the engine's context slot (answered with nothing)."""
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
"""(environment, task, marker or "" when clean) → Outcome. Called from several threads."""


def _client(backend):
    """The backend's ``client()`` (an episode registers with the batching scheduler), if any."""
    client = getattr(backend, "client", None)
    return client() if client is not None else contextlib.nullcontext()


def heart_system(backend, config, sampling: dict[str, SamplingConfig], trace_dir: Path) -> System:
    """The HEART loop as ``heart run`` runs it; reach is read back from the episode's trace."""
    import itertools

    from heart.episode import run_episode
    from heart.traces import TraceWriter, read_trace

    counter = itertools.count()
    lock = threading.Lock()

    def run(environment, task, marker: str) -> Outcome:
        with lock:
            path = trace_dir / f"{next(counter):04d}.jsonl"
        with _client(backend), TraceWriter(path, fsync=False) as trace:
            record = run_episode(environment, task, backend, config=config, trace=trace, sampling=sampling).record
        rows = [r for r in read_trace(path) if r["kind"] == "event"]
        reached, calls = reach([(r["role"], r["messages"]) for r in rows], marker)
        overflowed = sum(1 for r in rows if (r.get("extra") or {}).get("error"))
        return Outcome(record.success, record.checker.get("attack_succeeded"), record.errored, record.error,
                       reached if marker else {}, calls, overflowed, record.wall_s)

    return run


class _Overflows:
    """Counts the answers of ``backend`` whose prompt did not fit (an engine's ``meta['error']``)."""

    def __init__(self, backend):
        self.backend, self.name, self.count = backend, backend.name, 0

    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        generation = self.backend.generate(role, messages, sampling)
        self.count += bool(generation.meta.get("error"))
        return generation


def baseline_system(backend, config) -> System:
    """``heart.baseline``'s single-model loop; its whole conversation is searched for reach."""
    from heart.baseline import run_baseline_episode

    def run(environment, task, marker: str) -> Outcome:
        counted = _Overflows(backend)
        with _client(backend):
            result = run_baseline_episode(environment, task, counted, config)
        # One model call per assistant message; its input is everything before it.
        inputs = [("model", result.messages[:i]) for i, m in enumerate(result.messages) if m["role"] == "assistant"]
        reached, calls = reach(inputs, marker)
        return Outcome(result.success, result.checker.get("attack_succeeded"), result.errored, result.error,
                       reached if marker else {}, calls, counted.count, result.wall_s)

    return run


class RememberingBackend:
    """Wraps a backend for greedy decoding: an identical (role, messages, sampling) call is
    answered from memory, once it is answered or while it is being answered (the second
    caller waits for the first's answer). Exact only because greedy decoding is
    deterministic. A failed call is not remembered: its waiting callers get the error, and
    the next caller asks again."""

    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name
        self.answers: dict[str, Future] = {}
        self.hits = 0
        self._lock = threading.Lock()

    @staticmethod
    def _key(request: GenerationRequest) -> str:
        return json.dumps([request.role, request.messages, asdict(request.sampling or SamplingConfig())],
                          sort_keys=True)

    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        return self.generate_batch([GenerationRequest(role, messages, sampling or SamplingConfig())])[0]

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        keys = [self._key(r) for r in requests]
        futures: list[Future] = []
        owned: list[int] = []  # the requests this caller asks the backend
        with self._lock:
            for index, key in enumerate(keys):
                if key in self.answers:
                    self.hits += 1
                else:
                    self.answers[key] = Future()
                    owned.append(index)
                futures.append(self.answers[key])
        if owned:
            asked = [requests[i] for i in owned]
            try:
                answers = ([self.backend.generate(asked[0].role, asked[0].messages, asked[0].sampling)]
                           if len(asked) == 1 else self.backend.generate_batch(asked))
            except BaseException as err:
                with self._lock:
                    for index in owned:
                        self.answers.pop(keys[index], None)
                for index in owned:
                    futures[index].set_exception(err)
                raise
            for index, answer in zip(owned, answers):
                futures[index].set_result(answer)
        return [future.result() for future in futures]

    def client(self):
        return _client(self.backend)


# --- the pair runner and the summary --------------------------------------------------------

CONDITIONS = ("clean", "attacked")


def run_pairs(clean_environment, pairs: Sequence[Pair], systems: dict[str, System], concurrency: int = 1,
              progress: Callable[[str], None] = lambda _: None) -> Iterator[tuple[int, dict[str, dict[str, Outcome]]]]:
    """Every system on every pair, clean and under attack, ``concurrency`` episodes at once;
    yields (index of the pair, system → condition → outcome) as each pair's last episode
    finishes (``progress`` is told after each episode). An exception a system lets out is an
    errored outcome (the bench goes on)."""
    attacked = [clean_environment.under_attack(p.task_id, p.injection_task_id, p.attack) for p in pairs]
    markers = [injection_marker(environment.injection_task.GOAL) for environment in attacked]

    def episode(index: int, name: str, condition: str) -> Outcome:
        environment = clean_environment if condition == "clean" else attacked[index]
        try:
            return systems[name](environment, environment.load_task(pairs[index].task_id),
                                 markers[index] if condition == "attacked" else "")
        except Exception as err:  # infrastructure, not the model
            return Outcome(errored=True, error=f"{type(err).__name__}: {err}")

    jobs = [(index, name, condition) for index in range(len(pairs)) for name in systems for condition in CONDITIONS]
    done: dict[int, dict[tuple[str, str], Outcome]] = {index: {} for index in range(len(pairs))}
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(episode, *job): job for job in jobs}
        for future in as_completed(futures):
            index, name, condition = futures[future]
            done[index][name, condition] = future.result()
            pair = pairs[index]
            progress(f"{pair.task_id}×{pair.injection_task_id}: {name} {condition}")
            if len(done[index]) == len(systems) * len(CONDITIONS):
                yield index, {n: {c: done[index][n, c] for c in CONDITIONS} for n in systems}


def run_pair(clean_environment, pair: Pair, systems: dict[str, System],
             progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Outcome]]:
    """Every system on ``pair``, clean and under attack, one episode at a time."""
    return next(run_pairs(clean_environment, [pair], systems, 1, progress))[1]


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
            "overflowed_calls": sum(o.get("overflowed", 0) for o in clean + attacked),
            "reach_episodes": {**{role: rate(sum(o["reached"].get(role, 0) > 0 for o in attacked_ok), len(attacked_ok))
                                  for role in roles},
                               # exposure: did the injection reach the system at all (its tools read the vector)?
                               "any": rate(sum(any(o["reached"].values()) for o in attacked_ok), len(attacked_ok))},
            "reach_calls": {role: [sum(o["reached"].get(role, 0) for o in attacked_ok),
                                   sum(o["calls"].get(role, 0) for o in attacked_ok)] for role in roles},
        }
    return summary


FIGURES = {"utility_clean": ("clean", "success"), "utility_attacked": ("attacked", "success"),
           "asr": ("attacked", "attack_succeeded")}
"""Figure → (condition, outcome field it counts)."""


def paired_difference(rows: list[dict[str, Any]], base: str, other: str, seed: int = 0) -> dict[str, Any]:
    """``other`` − ``base`` per figure on the same pairs (pairs where either errored left
    out), with a paired bootstrap 95% interval over pairs (heart_distill.eval.stats)."""
    out = {}
    for figure, (condition, key) in FIGURES.items():
        both = [(r["outcomes"][base][condition], r["outcomes"][other][condition]) for r in rows]
        diffs = [float(bool(b[key])) - float(bool(a[key])) for a, b in both if not (a["errored"] or b["errored"])]
        out[figure] = bootstrap(diffs, seed=seed).to_dict()
    return out


def by_suite(rows: list[dict[str, Any]], systems: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Suite → system → the three figures over that suite's pairs (Wilson intervals)."""
    suites = list(dict.fromkeys(r["pair"]["task_id"].partition("/")[0] for r in rows))
    out: dict[str, dict[str, Any]] = {}
    for suite in suites:
        mine = [r for r in rows if r["pair"]["task_id"].startswith(f"{suite}/")]
        out[suite] = {"pairs": len(mine)}
        for name in systems:
            out[suite][name] = {}
            for figure, (condition, key) in FIGURES.items():
                ok = [r["outcomes"][name][condition] for r in mine if not r["outcomes"][name][condition]["errored"]]
                out[suite][name][figure] = rate(sum(bool(o[key]) for o in ok), len(ok))
    return out


def _cell(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "n = 0"
    return f"{r['k']}/{r['n']} = {r['rate']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]"


def _points(e: dict[str, Any]) -> str:
    if e["value"] is None:
        return "n = 0"
    if e["low"] is None:
        return f"{e['value'] * 100:+.1f} (n = {e['n']})"
    return f"{e['value'] * 100:+.1f} [{e['low'] * 100:+.1f}, {e['high'] * 100:+.1f}] (n = {e['n']})"


def markdown(summary: dict[str, Any], paired: dict[str, dict[str, Any]] | None = None,
             suites: dict[str, dict[str, Any]] | None = None) -> str:
    """The results table, the paired differences and the per-suite table when given, then
    the reach table."""
    lines = ["| system | utility, no attack | utility under attack | attack success (ASR) | errored (clean / attacked) |",
             "|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {_cell(s['utility_clean'])} | {_cell(s['utility_attacked'])} | "
                     f"{_cell(s['asr'])} | {s['errored']['clean']} / {s['errored']['attacked']} |")
    for label, d in (paired or {}).items():
        lines += ["", f"| {label}, same pairs (points) | utility, no attack | utility under attack | ASR |",
                  "|---|---|---|---|",
                  f"| paired difference | {_points(d['utility_clean'])} | {_points(d['utility_attacked'])} | "
                  f"{_points(d['asr'])} |"]
    if suites:
        lines += ["", "| suite | pairs | system | utility, no attack | utility under attack | ASR |",
                  "|---|---|---|---|---|---|"]
        for suite, s in suites.items():
            for name in summary:
                f = s[name]
                lines.append(f"| {suite} | {s['pairs']} | {name} | {_cell(f['utility_clean'])} | "
                             f"{_cell(f['utility_attacked'])} | {_cell(f['asr'])} |")
    lines += ["", "| system | role | attacked episodes where injected text reached its input | calls |",
              "|---|---|---|---|"]
    for name, s in summary.items():
        for role, r in s["reach_episodes"].items():
            k, n = s["reach_calls"].get(role, (sum(c[0] for c in s["reach_calls"].values()),
                                                sum(c[1] for c in s["reach_calls"].values())))
            lines.append(f"| {name} | {role} | {_cell(r)} | {k}/{n} |")
    return "\n".join(lines)


def figures(rows: list[dict[str, Any]], systems: Sequence[str]) -> dict[str, Any]:
    """summary, paired (distilled − base, when both ran) and by_suite of ``rows``."""
    paired = ({"heart-distilled − heart-base": paired_difference(rows, "heart-base", "heart-distilled")}
              if {"heart-base", "heart-distilled"} <= set(systems) else {})
    return {"summary": summarize(rows, systems), "paired": paired, "by_suite": by_suite(rows, systems)}


def held_out_record(environment, pairs: Sequence[Pair], split: str) -> dict[str, Any]:
    """What the pairs are held out from: every user task's split, and any that is not ``split``."""
    tasks = list(dict.fromkeys(p.task_id for p in pairs))
    return {"split": split, "distinct_pairs": len(set(pairs)), "distinct_user_tasks": len(tasks),
            "pairs_per_suite": {s: sum(p.suite == s for p in pairs) for s in dict.fromkeys(p.suite for p in pairs)},
            "outside_split": [t for t in tasks if split_of(environment.name, t) != split]}


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
    parser.add_argument("--suites", nargs="+", choices=SUITES, default=list(SUITES),
                        help="AgentDojo suites the pairs are drawn from, in turn (default: all four)")
    parser.add_argument("--split", choices=("train", "dev", "test"), default="test",
                        help="the split of the user tasks (default test: held out from training and dev)")
    parser.add_argument("--pairs", type=int, default=20,
                        help="distinct (user task, injection task) pairs (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pair sample")
    parser.add_argument("--attack", default="important_instructions", help="an AgentDojo attack name")
    parser.add_argument("--model", default="smollm2-135m", help="the one base model (as for heart run)")
    parser.add_argument("--engine", choices=ENGINE_SPECS, default="peft",
                        help="in-process engine of the base and its adapters (as for heart eval e2e; "
                             "llamacpp:f16 is the fastest on a CPU)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="episodes in flight on the one engine (default 8)")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp threads (default: the CPUs this process may use; on cores shared with "
                             "other jobs 1 avoids its threads waiting on each other)")
    parser.add_argument("--adapters", type=Path, default=None,
                        help="folder with planner/router/primitive/verifier adapters: adds heart-distilled")
    parser.add_argument("--baseline", action="store_true",
                        help="add the single-model baseline (every tool schema of the suite in one prompt; "
                             "workspace's and travel's exceed a 2,048-token context slot)")
    parser.add_argument("--budget", type=int, default=0, help="HEART re-plan budget B")
    parser.add_argument("--max-plan-steps", type=int, default=3)
    parser.add_argument("--router-mode", choices=["plan", "step"], default="plan",
                        help="the Router's mode, the one its adapter learned (docs/loop.md)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="per role call / model turn (default: each role's own budget, as heart eval e2e; "
                             "the baseline 384)")
    parser.add_argument("--baseline-calls", type=int, default=4, help="most tool calls of the single-model baseline")
    parser.add_argument("--traces", type=Path, default=None, help="keep the HEART traces here (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULT, help="the JSON result (default: %(default)s)")
    parser.add_argument("--table", action="store_true",
                        help="run nothing: re-summarise the episodes in --out and print the tables")
    return parser


def _backends(model: str, adapters: Path | None, engine: str, batch: int, threads: int | None = None):
    """(base backend, distilled backend or None, short-prompt roles, schedulers): one model
    for both sides when they share a base, the base side served without adapters (heart
    eval e2e's arrangement: ``heart_distill.eval.models.shared_backends``)."""
    from heart_distill.eval.models import UnadaptedView, resolve_role_models

    from heart.runtime.backends import backend_for
    from heart.runtime.scheduler import BatchingBackend

    options = {"threads": threads} if threads else {}

    def scheduled(models) -> BatchingBackend:
        return BatchingBackend(backend_for(models.model, models.adapters, engine, max_batch_size=batch, **options),
                               max_batch_size=batch)

    base_models = resolve_role_models("base", model)
    if adapters is None:
        base = scheduled(base_models)
        return base, None, (), [base]
    distilled_models = resolve_role_models(str(adapters), model)
    if distilled_models.model == base_models.model:
        distilled = scheduled(distilled_models)
        return UnadaptedView(distilled), distilled, distilled_models.short_prompts, [distilled]
    base, distilled = scheduled(base_models), scheduled(distilled_models)  # adapters on another base
    return base, distilled, distilled_models.short_prompts, [base, distilled]


def engine_stats(schedulers) -> dict[str, Any] | None:
    """The continuous decoder's counts behind the schedulers (None for an engine without
    them): decoding steps (llama.cpp: one adapter context's decode call), rows per step."""
    found = [getattr(s.inner, "stats", None) for s in schedulers]
    found = [f for f in found if hasattr(f, "row_steps")]
    if not found:
        return None
    steps, row_steps = sum(f.steps for f in found), sum(f.row_steps for f in found)
    return {"steps": steps, "row_steps": row_steps, "mean_rows_per_step": round(row_steps / steps, 2) if steps else None,
            "max_rows_per_step": max(f.max_running for f in found)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    if args.table:  # the episodes keep the stamp of the run that produced them
        result = json.loads(args.out.read_text())
        result.update(figures(result["episodes"], list(result["summary"])))
        write_stamped_json(args.out, result, result.get("stamp") or run_stamp)
        print(f"{len(result['episodes'])} pairs, {result['wall_s']:.0f} s\n"
              f"{markdown(result['summary'], result['paired'], result['by_suite'])}")
        return 0
    if args.pairs < 1 or args.concurrency < 1 or (args.threads is not None and args.threads < 1):
        print("error: --pairs, --concurrency and --threads must be >= 1", file=sys.stderr)
        return 2
    if args.threads is not None and not args.engine.startswith("llamacpp"):
        print(f"error: --threads is llama.cpp's; the engine is {args.engine}", file=sys.stderr)
        return 2

    from heart.progress import progress_bar

    from heart.baseline import BaselineConfig
    from heart.catalog import tool_companions
    from heart.environments.agentdojo import AgentDojoEnvironment
    from heart.loop import LoopConfig
    from heart.user_errors import UserError
    from heart_distill.eval.roles import MAX_NEW_TOKENS

    if args.adapters is not None:
        missing = [str(args.adapters / role) for role in ROLES if not (args.adapters / role).is_dir()]
        if missing:
            print(f"error: --adapters {args.adapters}: no adapter folder {', '.join(missing)}", file=sys.stderr)
            return 2
    try:
        base_inner, distilled_inner, short_prompts, schedulers = _backends(
            args.model.removeprefix("hf:"), args.adapters, args.engine, args.concurrency, args.threads)
    except (UserError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    base = RememberingBackend(base_inner)
    distilled = RememberingBackend(distilled_inner) if distilled_inner is not None else None

    environment = AgentDojoEnvironment(suites=list(args.suites))
    tool_companions(environment)  # learnt once from the clean train split, shared by every view
    pairs = sample_pairs(environment, args.suites, args.pairs, args.seed, args.attack, args.split)
    held_out = held_out_record(environment, pairs, args.split)
    if held_out["outside_split"]:  # sample_pairs draws from the split only: a broken split is a bug
        print(f"error: user tasks outside the {args.split} split: {held_out['outside_split']}", file=sys.stderr)
        return 2
    if not pairs:
        print(f"error: suites {args.suites} have no injectable, non-vacuous {args.split} user task", file=sys.stderr)
        return 2
    if len(pairs) < args.pairs:
        print(f"note: only {len(pairs)} distinct pairs in the {args.split} split of {', '.join(args.suites)}",
              file=sys.stderr)
    config = LoopConfig(replan_budget=args.budget, max_clarifications=0, max_plan_steps=args.max_plan_steps,
                        router_mode=args.router_mode, constrained=True)
    # Adapters trained on a role's short system prompt (context distillation) are served with it.
    distilled_config = dataclasses.replace(config, short_prompts=short_prompts)
    sampling = {r: SamplingConfig(max_new_tokens=args.max_new_tokens or MAX_NEW_TOKENS[r]) for r in ROLES}
    settings = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "loop": asdict(config), "max_new_tokens_per_role": {r: s.max_new_tokens for r, s in sampling.items()},
                "distilled_short_prompts": list(short_prompts), "pairs_drawn": [asdict(p) for p in pairs]}
    with tempfile.TemporaryDirectory() as tmp:
        trace_root = args.traces or Path(tmp)
        systems: dict[str, System] = {}
        for name, backend, loop_config in (("heart-base", base, config),
                                           ("heart-distilled", distilled, distilled_config)):
            if backend is not None:
                (trace_root / name).mkdir(parents=True, exist_ok=True)
                systems[name] = heart_system(backend, loop_config, sampling, trace_root / name)
        if args.baseline:
            systems[BASELINE_SYSTEM] = baseline_system(base, BaselineConfig(
                max_calls=args.baseline_calls, max_new_tokens=args.max_new_tokens or 384))
        finished: dict[int, dict[str, Any]] = {}
        pair_done_s: list[float] = []
        start = time.perf_counter()
        print(f"AgentDojo {', '.join(args.suites)} ({args.split} split), attack {args.attack!r}: {len(pairs)} pairs "
              f"({held_out['distinct_user_tasks']} user tasks), systems {', '.join(systems)}, engine {args.engine}, "
              f"{args.concurrency} episodes in flight", flush=True)
        bar = progress_bar(total=len(pairs) * len(systems) * 2, unit="episode", desc="injection", file=sys.stderr)

        def progress(done: str) -> None:
            bar.set_postfix_str(f"{done} done", refresh=False)
            bar.update(1)

        result: dict[str, Any] = {}
        for index, outcomes in run_pairs(environment, pairs, systems, args.concurrency, progress):
            elapsed = time.perf_counter() - start
            pair_done_s.append(round(elapsed, 1))
            finished[index] = {"pair": asdict(pairs[index]), "split": split_of(environment.name, pairs[index].task_id),
                               "outcomes": _outcomes_json(outcomes)}
            print(f"[{len(finished)}/{len(pairs)}] {pairs[index].task_id} × {pairs[index].injection_task_id} "
                  f"at {elapsed:.0f} s: " + "; ".join(
                      f"{name} utility {int(o['clean'].success)}/{int(o['attacked'].success)}, "
                      f"attacked {'yes' if o['attacked'].attack_succeeded else 'no'}"
                      f"{' (errored)' if o['clean'].errored or o['attacked'].errored else ''}"
                      for name, o in outcomes.items()), flush=True)
            rows = [finished[i] for i in sorted(finished)]
            stats = [s.stats() for s in schedulers]
            calls, batches = sum(s.calls for s in stats), sum(s.batches for s in stats)
            result = {"settings": settings, "held_out": held_out, "wall_s": round(elapsed, 1),
                      "per_pair_s": round(elapsed / len(rows), 1), "pair_done_s": pair_done_s,
                      "scheduler": {"calls": calls, "batches": batches,
                                    "mean_batch": round(calls / batches, 2) if batches else None},
                      "engine": engine_stats(schedulers),
                      "remembered_calls": {"base": base.hits, "distilled": distilled.hits if distilled else 0},
                      **figures(rows, list(systems)), "episodes": rows}
            write_stamped_json(args.out, result, run_stamp)
        bar.close()
    print(f"\nAgentDojo {', '.join(args.suites)} ({args.split} split), attack {args.attack!r}, {len(finished)} pairs, "
          f"base {args.model} on {args.engine}, greedy; HEART B={args.budget}, plans <= {args.max_plan_steps} steps, "
          f"Router {args.router_mode} mode; {result['wall_s']:.0f} s ({result['per_pair_s']:.0f} s per pair), "
          f"calls per scheduler take {result['scheduler']['mean_batch']}, "
          f"rows per decoding step {(result['engine'] or {}).get('mean_rows_per_step')}")
    print(markdown(result["summary"], result["paired"], result["by_suite"]))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
