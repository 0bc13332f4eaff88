"""The library's admission run: propose → validate → admit on BFCL + AgentDojo, held-out use,
and the false-admission check.

    python bench/library_admission.py --traces runs/smollm2-pipeline/collect
    python bench/library_admission.py --traces runs/smollm2-pipeline/collect --adapter-role verifier \\
        --adapters runs/smollm2-pipeline/adapters --data runs/smollm2-pipeline/datasets

1. **Admission** (a fresh library under ``--work``): candidates mined from the collection's
   verified train-split traces (``--max-candidates`` per environment), each validated on the
   dev split against the library without it, paired per (task, seed), with the gold teacher;
   then admitted by the library's rule (:func:`heart_distill.eval.library.decide`).
2. **Held out**: test-split tasks, paired, with the admitted library vs without — the gold
   teacher on ``--test-limit`` tasks per environment (``held_out``), and the unadapted
   SmolLM2-135M through llama.cpp (f16) on ``--base-tasks`` BFCL test tasks (``base``:
   end-to-end success near zero there; the role-call counts are what it shows).
3. **False admission**: over ``--rounds`` seeds, candidates built to be useless — random
   chains of two tools of one category with random bindings, and mined chains miswired (the
   second call's first input bound to the first call's whole result) — validated and decided
   the same way, each in a scratch library; every one must be rejected. With
   ``--adapter-role``, the role's distilled adapter is first decided against the bare base,
   then a copy with noised LoRA weights (one noise seed per round) against the incumbent.

``--parts`` selects what runs, in the order given. Writes ``--out`` (default
``runs/bench/library_admission.json``) under the run's provenance stamp after each part,
and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.library import load_library, parse_composite  # noqa: E402  (after the path insert)
from heart_distill.eval.library import (add_candidates, admit, admit_adapter, decide, format_estimate,  # noqa: E402
                                        load_env, mine, miswired, paired_evidence, random_chain, run_side,
                                        trace_files, validate, validate_adapter, verified_calls)
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "bench" / "library_admission.json"
WORK = ROOT / "runs" / "bench" / "library"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", nargs="+", default=[str(ROOT / "runs" / "smollm2-pipeline" / "collect")],
                        help="collection folder(s) or trace files (default: the main job's collection)")
    parser.add_argument("--envs", nargs="+", default=["bfcl", "agentdojo"], choices=["bfcl", "agentdojo"])
    parser.add_argument("--max-candidates", type=int, default=4, help="mined candidates per environment")
    parser.add_argument("--min-support", type=int, default=3)
    parser.add_argument("--dev-limit", type=int, default=0, help="dev tasks per environment (0: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="gold-teacher seeds (conditions)")
    parser.add_argument("--test-limit", type=int, default=0, help="held-out test tasks per environment (0: all)")
    parser.add_argument("--base-tasks", type=int, default=3, help="BFCL test tasks for the 135M base")
    parser.add_argument("--rounds", type=int, default=3, help="false-admission rounds (seeds)")
    parser.add_argument("--adapter-role", choices=["planner", "router", "primitive", "verifier"])
    parser.add_argument("--adapters", type=Path, help="folder of the distilled adapters (<dir>/<role>)")
    parser.add_argument("--data", type=Path, help="role datasets (gate rows: split 'validation')")
    parser.add_argument("--adapter-rows", type=int, default=16)
    parser.add_argument("--noise", type=float, default=3.0, help="noise std in units of each LoRA tensor's std")
    parser.add_argument("--parts", nargs="+", default=["admission", "held_out", "false_admission", "base", "adapters"],
                        choices=["admission", "held_out", "false_admission", "base", "adapters"],
                        help="what to run (held_out and false_admission need admission's library and candidates; "
                             "adapters runs only with --adapter-role)")
    parser.add_argument("--work", type=Path, default=WORK, help="where the libraries are built (replaced)")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def row(name: str, ev: dict, decision: str, reason: str) -> dict:
    return {"name": name, "env": ev.get("env"), "signal": ev["signal"], "lift": ev["lift"],
            "success_without": ev["success"]["without"], "success_with": ev["success"]["with"],
            "calls_without": ev["role_calls_per_task"]["without"], "calls_with": ev["role_calls_per_task"]["with"],
            "episodes_using": ev["episodes_using_candidate"], "tasks": ev["tasks"],
            "worst_condition": min(ev["conditions"].values()), "decision": decision, "reason": reason}


def print_rows(rows: list[dict]) -> None:
    print("| candidate | env | tasks | used in | signal | paired lift [95% CI] | success without → with | "
          "role calls/task without → with | decision |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['env']} | {r['tasks']} | {r['episodes_using']} | {r['signal']} | "
              f"{format_estimate(r['lift'])} | {r['success_without']:.3f} → {r['success_with']:.3f} | "
              f"{r['calls_without']:.1f} → {r['calls_with']:.1f} | {r['decision']} |", flush=True)


def admission(args, environments, calls, catalogs) -> dict:
    library = args.work / "library"
    shutil.rmtree(library, ignore_errors=True)
    found = mine(calls, catalogs, args.min_support, args.max_candidates)
    add_candidates(library, found)
    evidence = validate(library, None, "dev", args.dev_limit or None, tuple(args.seeds), environments=environments)
    decisions = {d["name"]: d for d in admit(library)}
    rows = [row(n, ev, decisions[n]["decision"], decisions[n]["reason"]) for n, ev in evidence.items()]
    print_rows(rows)
    return {"library": str(library.relative_to(ROOT)) if library.is_relative_to(ROOT) else str(library),
            "candidates": found, "rows": rows, "library_version": load_library(library).version}


def held_out(args, environments, library) -> dict:
    out = {}
    lib = load_library(library)
    for env, environment in environments.items():
        composites = lib.composites(env)
        tasks = environment.task_ids("test")[:args.test_limit or None]
        without = run_side(environment, [], tasks, tuple(args.seeds))
        with_ = run_side(environment, composites, tasks, tuple(args.seeds))
        out[f"{env}/gold"] = {"composites": [c.name for c in composites],
                              **paired_evidence(without, with_, lib.config)}
    print_held_out(out)
    return out


def base_model(args, environments, library) -> dict:
    """The unadapted SmolLM2-135M (llama.cpp, f16) on BFCL test tasks, library vs none, paired."""
    from heart_distill.eval.models import resolve_role_models, shared_backend

    lib = load_library(library)
    backend = shared_backend(resolve_role_models("base"), 1, "llamacpp:f16")
    environment = environments["bfcl"]
    composites = lib.composites("bfcl")
    tasks = environment.task_ids("test")[:args.base_tasks]
    without = run_side(environment, [], tasks, (0,), "base", backend, "llamacpp:f16", concurrency=1)
    with_ = run_side(environment, composites, tasks, (0,), "base", backend, "llamacpp:f16", concurrency=1)
    ev = {"composites": [c.name for c in composites], **paired_evidence(without, with_, lib.config)}
    print_held_out({"bfcl/smollm2-135m-base": ev})
    return ev


def print_held_out(out: dict) -> None:
    print("\n| held out (test) | tasks | success without → with | paired success lift (points) | "
          "role calls/task without → with | calls saved/task |\n|---|---|---|---|---|---|")
    for name, ev in out.items():
        print(f"| {name} | {ev['tasks']} | {ev['success']['without']:.3f} → {ev['success']['with']:.3f} | "
              f"{format_estimate(ev['success']['lift_points'])} | {ev['role_calls_per_task']['without']:.1f} → "
              f"{ev['role_calls_per_task']['with']:.1f} | {format_estimate(ev['role_calls_per_task']['saved'])} |")


def false_admission(args, environments, found, catalogs) -> dict:
    rounds = []
    for seed in range(args.rounds):
        rng = random.Random(seed)
        useless = []
        for env in environments:
            useless += [random_chain(env, catalogs[env], rng, f"{seed}{i}") for i in range(2)]
            mined = [c for c in found if c["env"] == env]
            for c in rng.sample(mined, min(1, len(mined))):
                bad = miswired(c, catalogs[env], seed)
                if bad is not None:
                    useless.append(bad)
        library = args.work / f"false-admission-{seed}"
        shutil.rmtree(library, ignore_errors=True)
        for c in useless:
            parse_composite(c, catalogs[c["env"]])
        add_candidates(library, useless, origin="built to be useless")
        evidence = validate(library, None, "dev", args.dev_limit or None, (seed,), environments=environments)
        decisions = {d["name"]: d for d in admit(library)}
        rows = [row(n, ev, decisions[n]["decision"], decisions[n]["reason"]) for n, ev in evidence.items()]
        print(f"\nfalse-admission round {seed}:")
        print_rows(rows)
        rounds.append({"seed": seed, "rows": rows, "admitted": sum(r["decision"] == "admitted" for r in rows)})
    return {"rounds": rounds, "admitted_total": sum(r["admitted"] for r in rounds),
            "candidates_total": sum(len(r["rows"]) for r in rounds)}


def noised_copy(source: Path, target: Path, noise: float, seed: int) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    weights = load_file(str(source / "adapter_model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    noised = {k: v + noise * v.float().std() * torch.randn(v.shape, generator=generator).to(v.dtype)
              for k, v in weights.items()}
    save_file(noised, str(target / "adapter_model.safetensors"))
    return target


def adapters(args) -> dict:
    role = args.adapter_role
    library = args.work / "adapter-library"
    shutil.rmtree(library, ignore_errors=True)
    source = args.adapters / role
    first = validate_adapter(library, role, source, args.data, limit=args.adapter_rows)
    incumbent = admit_adapter(library, role, source, first)
    print(f"\ndistilled {role} vs the bare base: {format_estimate(first['lift'])} → {incumbent['decision']}")
    rounds = []
    for seed in range(args.rounds):
        degraded = noised_copy(source, args.work / f"degraded-{role}-{seed}", args.noise, seed)
        ev = validate_adapter(library, role, degraded, args.data, limit=args.adapter_rows)
        d = admit_adapter(library, role, degraded, ev)
        print(f"noised {role} (seed {seed}) vs incumbent: {format_estimate(ev['lift'])} → {d['decision']}")
        rounds.append({"seed": seed, "evidence": ev, "decision": d["decision"], "reason": d["reason"]})
    served = load_library(library).adapters.get(role)
    return {"role": role, "distilled_vs_base": {"evidence": first, "decision": incumbent["decision"],
                                                "reason": incumbent["reason"]},
            "degraded": rounds, "served_version": served["version"] if served else None,
            "noise_std_units": args.noise}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    environments = {env: load_env(env) for env in args.envs}
    catalogs = {env: {s.name: s for s in e.catalog()} for env, e in environments.items()}
    calls = verified_calls(trace_files(args.traces))
    result = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "verified_train_episodes": len(calls)}
    stages = {"admission": lambda: admission(args, environments, calls, catalogs),
              "held_out": lambda: held_out(args, environments, args.work / "library"),
              "false_admission": lambda: false_admission(
                  args, environments, mine(calls, catalogs, args.min_support, args.max_candidates), catalogs),
              "base": lambda: base_model(args, environments, args.work / "library"),
              "adapters": lambda: adapters(args) if args.adapter_role else None}
    for part in args.parts:  # each part's result is written as soon as it is done
        result[part] = stages[part]()
        result["wall_s"] = round(time.perf_counter() - start, 1)
        write_stamped_json(args.out, result, run_stamp)
    print(f"\n→ {args.out}  ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
