"""Role runtime on this CPU: continuous batching, int8 and llama.cpp vs a one-call-at-a-time fp32 baseline, in one run.

Every figure is a ratio of two measurements taken side by side in this process, so a shared
machine slows both sides alike. The prompts are real role calls: the gold teacher runs a few
BFCL dev tasks and its trace gives the exact messages each role was sent; four LoRA adapters
(r=8, all-linear, seeded random lora_B so each changes the output, as a trained one would)
serve the roles on SmolLM2-135M. Each call may decode as many tokens as the gold teacher's
answer to that prompt had (``--new-tokens N`` caps every call at N instead): the roles' real
answers are long for the Planner and the Router (~160 tokens) and short for the Primitive and
the Verifier (~30-60), so decoding, not prefill, is most of the work, as in the loop.
Decoding is greedy and unconstrained (xgrammar costs ~5%).
The baseline (every ``over_today`` ratio's denominator, the episodes' ``today_s``) is the plain
transformers path: fp32, one call at a time, transformers' dynamic KV cache. ``fp32_sequential``
is the same through the backend's default (its own continuous decoding loop);
``fp32_batched_whole_batches`` is the scheduler with whole ``generate`` batches (no
continuous batching), ``fp32_batched`` with continuous batching. ``mean_batch`` is the
scheduler's calls per batch (continuous: per admission into the running batch).
``llamacpp_*`` serve the same fp32 weights and adapters with llama.cpp
(:mod:`heart.runtime.llamacpp`): one call at a time, 8 clients through the scheduler, all
16 calls in one ``generate_batch``; the episodes run concurrently on it too. Those sides use
the engine's default speculative drafts from each call's context (exact under greedy
decoding); ``*_no_drafts`` are the same f16 sides without them.

    OMP_NUM_THREADS=1 python bench/runtime.py [--calls 16] [--new-tokens N] [--batch 8]
        [--episodes 2]     # also: BFCL dev episodes, sequential vs concurrent with continuous batching
        [--sides llamacpp_f16_all_at_once,...]   # only these sides besides the baseline (SIDES)

``--calls 64 --batch 16`` serves 16 calls per role context at once, the shape ``heart eval
roles`` hands a role's inputs in; the prompts then come from more dev tasks (every one distinct).

Prints a JSON report, also written under its provenance stamp (command, commit, date, machine) to
--out (default runs/bench/runtime.json; curated results live in bench/results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heart import ROLES  # noqa: E402  (after the path insert)
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = REPO / "runs" / "bench" / "runtime.json"
"""Where a run's report goes by default (runs/ is not tracked)."""

SIDES = ("fp32_sequential", "int8_sequential", "fp32_batched_whole_batches", "fp32_batched", "fp32_all_at_once",
         "int8_batched", *(f"{engine}_{how}" for engine in ("llamacpp", "llamacpp_f16")
                           for how in ("sequential", "batched", "all_at_once")),
         "llamacpp_f16_sequential_no_drafts", "llamacpp_f16_all_at_once_no_drafts")
"""What ``--sides`` may name: every side measured against the baseline, one call at a time."""


def harvest_requests(calls: int, new_tokens: int | None):
    """Real role prompts, round-robin over roles, from gold-teacher episodes on BFCL dev tasks.

    ``new_tokens`` caps every answer; None gives each call the length of the answer the gold
    teacher wrote for that very prompt (plus its end token), so the calls decode as much as
    the roles do in the loop (median 160 Planner, 168 Router, 28 Primitive, 59 Verifier tokens).
    """
    from transformers import AutoTokenizer

    from heart_distill.data.gold_teacher import GoldTeacher
    from heart.environments import load_environment
    from heart.episode import run_episode
    from heart.models import prepare_smollm2
    from heart.runtime.base import GenerationRequest, SamplingConfig
    from heart.traces import TraceWriter, read_trace

    env = load_environment("bfcl")
    per_role = -(-calls // len(ROLES))
    by_role: dict[str, list] = {r: [] for r in ROLES}
    with tempfile.TemporaryDirectory() as tmp:
        # The first 4 dev tasks, and more until every role has a distinct prompt per call
        # (a repeated prompt would find itself cached in a slot).
        for n, task_id in enumerate(env.task_ids("dev")):
            if n >= 4 and min(map(len, by_role.values())) >= per_role:
                break
            path = Path(tmp) / f"gold-{n}.jsonl"
            task = env.load_task(task_id)
            with TraceWriter(path) as writer:
                run_episode(env, task, GoldTeacher(task, env.catalog()), trace=writer)
            for row in read_trace(path):
                if row["kind"] == "event" and row["role"] in by_role:
                    by_role[row["role"]].append((row["messages"], row["raw_output"]))
    tokenizer = AutoTokenizer.from_pretrained(str(prepare_smollm2()))
    requests = []
    for i in range(calls):
        role = ROLES[i % 4]
        messages, answer = by_role[role][i // 4 % len(by_role[role])]
        budget = new_tokens or len(tokenizer(answer)["input_ids"]) + 1
        requests.append(GenerationRequest(role, messages, SamplingConfig(max_new_tokens=budget)))
    return requests


def make_adapters(base_path: str, out: Path, top_layers: int | None = 8) -> dict[str, str]:
    """Four adapters shaped as ``recipes/smollm2-135m`` trains them: r=8 on every linear layer
    of the top ``top_layers`` decoder layers (None: of all 30)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from heart_distill.train.adapter import linear_module_names, lora_placement

    base = AutoModelForCausalLM.from_pretrained(base_path)
    placement = lora_placement(SimpleNamespace(target_modules="all-linear", top_layers=top_layers), base,
                               linear_module_names(base))
    config = LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", **placement)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        model = get_peft_model(base, config, adapter_name=ROLES[0])
        for role in ROLES[1:]:
            model.add_adapter(role, config)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape) * 0.02)
    model.save_pretrained(out)
    return {role: str(out / role) for role in ROLES}


def sequential(backend, requests):
    """The baseline: one role call at a time."""
    start = time.perf_counter()
    outs = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    return outs, time.perf_counter() - start


def batched(backend, requests, batch: int):
    """``batch`` concurrent clients (episodes) through the scheduler, each with its share of calls."""
    from heart.runtime.scheduler import BatchingBackend

    scheduler = BatchingBackend(backend, max_batch_size=batch, max_wait_s=0.5)
    outs = [None] * len(requests)
    everyone = threading.Barrier(batch)

    def client(k):
        with scheduler.client():
            everyone.wait()
            for i in range(k, len(requests), batch):
                r = requests[i]
                outs[i] = scheduler.generate(r.role, r.messages, r.sampling)

    start = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        list(pool.map(client, range(batch)))
    wall = time.perf_counter() - start
    stats = scheduler.stats()
    scheduler.close()
    return outs, wall, stats.mean_batch_size


def all_at_once(backend, requests):
    """Every call in one ``generate_batch`` with room for all of them: continuous batching's best case."""
    limit, backend.max_batch_size = backend.max_batch_size, len(requests)
    start = time.perf_counter()
    outs = backend.generate_batch(requests)
    wall = time.perf_counter() - start
    backend.max_batch_size = limit
    stats = getattr(backend, "last_decode_stats", None)
    return (outs, wall, float(stats.mean_running)) if stats is not None else (outs, wall)


def fresh_llama(adapters: dict[str, str], weights: str, batch: int, drafts: bool = True):
    """A llama.cpp backend whose role contexts exist (graphs built) but hold no bench prompt;
    ``drafts``: the engine's default speculative drafts from the context, or none."""
    from heart.runtime.base import SamplingConfig
    from heart.runtime.llamacpp import DRAFT_TOKENS, LlamaCppBackend

    backend = LlamaCppBackend("smollm2-135m", adapters=adapters, weights=weights, max_batch_size=batch,
                              draft_tokens=DRAFT_TOKENS if drafts else 0)
    for role in ROLES:
        backend.generate(role, [{"role": "user", "content": "hi"}], SamplingConfig(max_new_tokens=2))
    return backend


def timed_batch(backend, requests):
    """Every call in one ``generate_batch`` call."""
    start = time.perf_counter()
    outs = backend.generate_batch(requests)
    return outs, time.perf_counter() - start


def agreement(reference, other, tokenizer) -> dict:
    """Exact-match rate of whole answers and mean share of matching leading tokens."""
    exact, prefix = 0, []
    for a, b in zip(reference, other):
        ta, tb = tokenizer(a.text)["input_ids"], tokenizer(b.text)["input_ids"]
        exact += a.text == b.text
        same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        prefix.append(same / max(len(ta), 1))
    return {"exact_match": round(exact / len(reference), 3),
            "token_prefix_agreement": round(sum(prefix) / len(prefix), 3), "n": len(reference)}


def tok_s(outs, wall: float) -> float:
    return sum(g.completion_tokens for g in outs) / wall


def switch_cost(backend, request) -> dict:
    """set_adapter ÷ one decoding step (batch 1, after the prompt's prefill)."""
    import torch

    model, tok = backend.model, backend.tokenizer
    ids = tok(backend.render(request.messages), return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model(**ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(8):
            t = time.perf_counter()
            # Same position each time (crop the cache back): a steady single decode step.
            model(input_ids=nxt, past_key_values=past, use_cache=True)
            past.crop(-1)
            times.append(time.perf_counter() - t)
        step = sorted(times)[len(times) // 2]
    switches = []
    for i in range(20):
        t = time.perf_counter()
        model.set_adapter(ROLES[i % 4])
        switches.append(time.perf_counter() - t)
    backend._active_adapter = ROLES[19 % 4]
    switch = sorted(switches)[len(switches) // 2]
    return {"set_adapter_ms": round(switch * 1e3, 2), "decode_step_ms": round(step * 1e3, 2),
            "switch_over_step": round(switch / step, 3)}


def mixed_vs_single(backend, requests, batch: int) -> dict:
    """Same prompts, one batch: rows served by four different adapters vs all by one."""
    import dataclasses

    rows = requests[:batch]
    single = [dataclasses.replace(r, role="planner") for r in rows]
    backend.generate_batch(rows[:2])  # warm-up
    t = time.perf_counter(); outs_single = backend.generate_batch(single); t_single = time.perf_counter() - t
    t = time.perf_counter(); outs_mixed = backend.generate_batch(rows); t_mixed = time.perf_counter() - t
    return {"mixed_tok_s": round(tok_s(outs_mixed, t_mixed), 2), "single_tok_s": round(tok_s(outs_single, t_single), 2),
            "mixed_over_single": round(tok_s(outs_mixed, t_mixed) / tok_s(outs_single, t_single), 3)}


def memory(backend_fp32, backend_int8, base_path: str) -> dict:
    """Parameter + buffer bytes resident for serving (what the weights occupy)."""
    import torch
    from transformers import AutoModelForCausalLM

    def state_bytes(model) -> int:
        total = 0
        for value in model.state_dict().values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
            elif isinstance(value, tuple):  # packed int8 weights: (weight, bias)
                total += sum(v.numel() * v.element_size() for v in value if isinstance(v, torch.Tensor))
        return total

    base = state_bytes(AutoModelForCausalLM.from_pretrained(base_path))
    with_adapters = state_bytes(backend_fp32.model)
    int8 = state_bytes(backend_int8.model)
    mib = 2**20
    return {"base_MiB": round(base / mib, 1), "base_plus_4_adapters_MiB": round(with_adapters / mib, 1),
            "four_merged_MiB": round(4 * base / mib, 1), "int8_base_plus_4_adapters_MiB": round(int8 / mib, 1),
            "plus_adapters_over_base": round(with_adapters / base, 3),
            "plus_adapters_over_four_merged": round(with_adapters / (4 * base), 3),
            "int8_plus_adapters_over_four_merged": round(int8 / (4 * base), 3)}


def concurrent_episodes(env, tasks, backend, config, sampling) -> tuple[float, float]:
    """Every task's episode at once, each a client of one scheduler over ``backend``:
    (wall seconds, the scheduler's mean calls per batch)."""
    from heart.episode import run_episode
    from heart.runtime.scheduler import BatchingBackend

    scheduler = BatchingBackend(backend, max_batch_size=backend.max_batch_size)

    def one(task):
        with scheduler.client():
            run_episode(env, task, scheduler, config=config, sampling=sampling)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(tasks)) as pool:
        list(pool.map(one, tasks))
    wall = time.perf_counter() - start
    mean_batch = scheduler.stats().mean_batch_size
    scheduler.close()
    return wall, mean_batch


def episodes(adapters: dict[str, str], n: int, batch: int, max_new_tokens: int) -> dict:
    """BFCL dev episodes: sequential fp32 episodes (whole-batch ``generate``, the plain
    transformers path) vs the same episodes concurrently, with continuous batching in torch and in
    llama.cpp (fp32 and f16 weights)."""
    from heart.environments import load_environment
    from heart.episode import run_episode
    from heart.loop import LoopConfig
    from heart.runtime.base import SamplingConfig
    from heart.runtime.hf import TransformersBackend

    env = load_environment("bfcl")
    tasks = [env.load_task(t) for t in env.task_ids("dev")[:n]]
    config = LoopConfig(replan_budget=0, max_clarifications=0, max_plan_steps=2, constrained=True)
    sampling = {r: SamplingConfig(max_new_tokens=max_new_tokens) for r in ROLES}
    today = TransformersBackend("smollm2-135m", adapters=adapters, decoding="generate", kv_cache="dynamic")
    t = time.perf_counter()
    for task in tasks:
        run_episode(env, task, today, config=config, sampling=sampling)
    t_today = time.perf_counter() - t
    del today
    torch_backend = TransformersBackend("smollm2-135m", adapters=adapters, max_batch_size=batch)
    t_fast, fast_mean = concurrent_episodes(env, tasks, torch_backend, config, sampling)
    del torch_backend
    llama_s = {weights: concurrent_episodes(env, tasks, fresh_llama(adapters, weights, batch), config, sampling)[0]
               for weights in ("f32", "f16")}
    llama_s["f16_no_drafts"] = concurrent_episodes(env, tasks, fresh_llama(adapters, "f16", batch, drafts=False),
                                                   config, sampling)[0]
    return {"n_tasks": n, "settings": "budget 0, plans <= 2 steps, constrained, "
            f"max_new_tokens {max_new_tokens}", "today_s": round(t_today, 1), "continuous_s": round(t_fast, 1),
            "mean_batch": round(fast_mean, 2), "ratio": round(t_fast / t_today, 3),
            **{f"llamacpp_{w}_continuous_s": round(t, 1) for w, t in llama_s.items()},
            **{f"llamacpp_{w}_ratio": round(t / t_today, 3) for w, t in llama_s.items()}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=16, help="role calls per measurement (round-robin roles)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="max new tokens per call (default: the length of the gold teacher's answer to it)")
    parser.add_argument("--batch", type=int, default=8, help="concurrent clients / batch size")
    parser.add_argument("--episodes", type=int, default=0, help="BFCL dev episodes to time (0: skip)")
    parser.add_argument("--episode-new-tokens", type=int, default=64, help="max new tokens per role call in episodes")
    parser.add_argument("--only-episodes", action="store_true", help="skip the call-level measurements")
    parser.add_argument("--skip-torch-variants", action="store_true",
                        help="of the torch sides, run only the baseline and continuous batching (not int8, whole "
                             "generate batches, all at once, the static-cache sequential); no memory figures")
    parser.add_argument("--sides", default=None,
                        help="comma-separated sides to run besides the baseline (default: every side), e.g. "
                             "llamacpp_f16_all_at_once,llamacpp_f16_sequential; no memory or switch figures")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON report (default: %(default)s)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    run_stamp = stamp(script=__file__)
    unknown = set((args.sides or "").split(",")) - set(SIDES) - {""}
    if unknown:
        parser.error(f"unknown --sides {sorted(unknown)}; choose from {', '.join(SIDES)}")

    import torch

    from heart.models import prepare_smollm2
    from heart.runtime.hf import TransformersBackend

    base_path = str(prepare_smollm2())
    report: dict = {"cpus": os.cpu_count(), "load_average_start": os.getloadavg(), "torch_threads": torch.get_num_threads(),
                    "calls": args.calls, "new_tokens": args.new_tokens, "batch": args.batch}
    requests = harvest_requests(args.calls, args.new_tokens)
    report["max_new_tokens_per_call"] = [r.sampling.max_new_tokens for r in requests]
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(base_path, Path(tmp))
        if args.only_episodes:
            report["episodes"] = episodes(adapters, args.episodes, args.batch, args.episode_new_tokens)
            write_stamped_json(args.out, report, run_stamp, indent=2)
            print(json.dumps(report, indent=2))
            return 0
        # the baseline every ratio divides by: fp32, one call at a time, transformers'
        # dynamic KV cache (the CPU default is a static cache: see heart.runtime.hf)
        dynamic = TransformersBackend("smollm2-135m", adapters=adapters, max_batch_size=args.batch,
                                      kv_cache="dynamic")
        fp32 = TransformersBackend("smollm2-135m", adapters=adapters, max_batch_size=args.batch)
        # the scheduler before continuous batching: whole batches through transformers' generate
        whole = TransformersBackend("smollm2-135m", adapters=adapters, max_batch_size=args.batch,
                                    decoding="generate")
        int8 = TransformersBackend("smollm2-135m", adapters=adapters, quantize="int8", max_batch_size=args.batch)
        report["prompt_tokens_mean"] = round(sum(len(fp32.tokenizer(fp32.render(r.messages))["input_ids"])
                                                 for r in requests) / len(requests))
        for backend in (dynamic, fp32, whole, int8):  # warm-up
            backend.generate("planner", requests[0].messages, requests[0].sampling)
        runs = {}
        chosen = None if args.sides is None else set(args.sides.split(","))
        every = not args.skip_torch_variants and chosen is None

        def want(side: str, torch_variant: bool = False) -> bool:
            return side in chosen if chosen is not None else every or not torch_variant

        runs["fp32_sequential_dynamic_cache"] = sequential(dynamic, requests)
        del dynamic
        if want("fp32_sequential", torch_variant=True):
            runs["fp32_sequential"] = sequential(fp32, requests)
        if want("int8_sequential", torch_variant=True):
            runs["int8_sequential"] = sequential(int8, requests)
        if want("fp32_batched_whole_batches", torch_variant=True):
            runs["fp32_batched_whole_batches"] = batched(whole, requests, args.batch)
        del whole
        if want("fp32_batched"):
            runs["fp32_batched"] = batched(fp32, requests, args.batch)  # continuous batching
        if want("fp32_all_at_once", torch_variant=True):
            runs["fp32_all_at_once"] = all_at_once(fp32, requests)  # how `heart eval roles` hands them
        if want("int8_batched", torch_variant=True):
            runs["int8_batched"] = batched(int8, requests, args.batch)
        # llama.cpp on the same fp32 weights (and on f16 weights): one call at a time, `batch`
        # clients through the scheduler, every call in one generate_batch (a quarter per role
        # context, up to `batch` at once in each). A fresh backend each time: a slot keeps its
        # last prompt, so a second run of the same prompts would find them cached.
        for weights in ("f32", "f16"):
            prefix = "llamacpp" if weights == "f32" else "llamacpp_f16"
            if want(f"{prefix}_sequential"):
                runs[f"{prefix}_sequential"] = sequential(fresh_llama(adapters, weights, args.batch), requests)
            if want(f"{prefix}_batched"):
                runs[f"{prefix}_batched"] = batched(fresh_llama(adapters, weights, args.batch), requests, args.batch)
            if want(f"{prefix}_all_at_once"):
                llama = fresh_llama(adapters, weights, args.batch)
                runs[f"{prefix}_all_at_once"] = timed_batch(llama, requests)
                report[f"{prefix}_all_at_once_stats"] = dataclasses.asdict(llama.stats)
        # the same f16 sides without speculative drafts (heart.runtime.lookup): what drafting buys
        if want("llamacpp_f16_sequential_no_drafts"):
            runs["llamacpp_f16_sequential_no_drafts"] = sequential(
                fresh_llama(adapters, "f16", args.batch, drafts=False), requests)
        if want("llamacpp_f16_all_at_once_no_drafts"):
            runs["llamacpp_f16_all_at_once_no_drafts"] = timed_batch(
                fresh_llama(adapters, "f16", args.batch, drafts=False), requests)
        base_outs, base_wall = runs["fp32_sequential_dynamic_cache"]
        base_rate = tok_s(base_outs, base_wall)
        report["throughput"] = {}
        for name, (outs, wall, *rest) in runs.items():
            report["throughput"][name] = {"tok_s": round(tok_s(outs, wall), 2), "wall_s": round(wall, 1),
                                          "over_today": round(tok_s(outs, wall) / base_rate, 2),
                                          **({"mean_batch": round(rest[0], 2)} if rest else {}),
                                          "agreement_with_today": agreement(base_outs, outs, fp32.tokenizer)}
        print(json.dumps(report["throughput"], indent=1), flush=True)
        if every:
            report["switch_cost"] = switch_cost(fp32, requests[0])
            report["mixed_vs_single_adapter_batch"] = mixed_vs_single(fp32, requests, args.batch)
            report["memory"] = memory(fp32, int8, base_path)
        del fp32, int8
        if args.episodes:
            report["episodes"] = episodes(adapters, args.episodes, args.batch, args.episode_new_tokens)
    report["load_average_end"] = os.getloadavg()
    write_stamped_json(args.out, report, run_stamp, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
