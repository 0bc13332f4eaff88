"""The GPU check: train, serve and compare role adapters on a Qwen3-8B-shaped model.

    bash scripts/gpu_check.sh                   # a bare GPU machine: setup, then this script
    python bench/gpu_check.py --cpu-smoke       # the same steps on the tiny Qwen3, on CPU

Qwen3-8B's weights cannot be downloaded here, so the model is its published config
(train/known_configs.py) with random bf16 weights and the real Qwen3 tokenizer: the
arithmetic, and so throughput and memory, do not depend on the weights; quality does, and
nothing here measures it. Steps, each timed and recorded even when it fails:

1. ``model``: that model saved to a folder, with four random role adapters beside it (LoRA
   r=16 on every linear layer, as recipes/qwen3-8b/, non-zero so they change the answers);
2. ``data``: a gold collection over BFCL train tasks, built into role datasets;
3. ``train_single_gpu`` and ``train_fsdp``: the Planner adapter for ``--steps`` optimizer steps
   (the recipe's micro-batch of 4, no gradient accumulation) with recipes/qwen3-8b/planner.yaml
   through ``accelerate launch`` with
   recipes/accelerate/single_gpu.yaml, then fsdp.yaml over every GPU: the trainer's tokens/s,
   MFU (model FLOPs 4·N per token — forward and input gradients through the frozen linear
   layers, recompute not counted — over the GPU's dense bf16 peak), peak GPU memory;
4. ``serve``: ``vllm serve`` (.venv-vllm) of the base with the four adapters; ``--requests``
   streamed completions at ``--concurrency``, their model names cycling over the four roles,
   then the same requests to the base alone: output tokens/s and time to first token;
5. ``parity``: ``heart check parity --engines vllm``: greedy answers of peft and vLLM on the
   GPU, token for token, per role.

``--cpu-smoke`` runs steps 1-3 with the tiny Qwen3 and a handful of steps (training through
recipes/accelerate/cpu.yaml, fp32) and says of each step that needs CUDA that it was skipped
and why. Written to ``--out`` (default ``runs/bench/gpu_check.json``; scripts/gpu_check.sh
writes bench/results/gpu_check.json) under the run's provenance stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heart import ROLES  # noqa: E402  (after the path insert)
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402
from heart_distill.train.known_configs import QWEN3_8B  # noqa: E402

OUT = REPO / "runs" / "bench" / "gpu_check.json"
"""Where a run's result goes by default (runs/ is not tracked)."""
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
"""Dense bf16 tensor-core peak by GPU name (the vendors' datasheets, without sparsity)."""
LORA_RANK = 16
"""As recipes/qwen3-8b/ (``lora.r``)."""
CUDA_NEEDED = "needs CUDA: no GPU on this machine"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny Qwen3 on CPU, a handful of steps; steps that need CUDA are skipped and named")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per training run (default 24; smoke 2)")
    parser.add_argument("--tasks", type=int, default=None, help="BFCL train tasks collected (default 24; smoke 4)")
    parser.add_argument("--requests", type=int, default=64, help="serving: requests per load phase")
    parser.add_argument("--concurrency", type=int, default=16, help="serving: requests in flight")
    parser.add_argument("--max-tokens", type=int, default=128, help="serving: output tokens per request")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def linear_parameters(config: dict) -> int:
    """Parameters of a Qwen3 decoder's linear layers and LM head: N of the 4·N FLOPs per token."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    return layers * (h * q + 2 * h * kv + q * h + 3 * h * i) + config["vocab_size"] * h


def mfu(tokens_per_s: float, linear_params: int, peak_flops: float | None, gpus: int = 1) -> float | None:
    """Model FLOPs utilisation of LoRA training on a frozen base: 4·N FLOPs per token."""
    if not peak_flops or not tokens_per_s:
        return None
    return 4 * linear_params * tokens_per_s / (peak_flops * gpus)


def latency_summary(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {"n": len(ordered), "median_s": round(statistics.median(ordered), 4),
            "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
            "max_s": round(ordered[-1], 4)}


def run(command: list[str], log: Path, timeout: float, env: dict | None = None) -> None:
    """Run a command, its output appended to ``log``; RuntimeError with the log's tail if it fails."""
    with open(log, "a") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO,
                              env={**os.environ, **(env or {})})
    if done.returncode != 0:
        tail = log.read_text()[-1500:]
        raise RuntimeError(f"{command[0]} {command[1] if len(command) > 1 else ''} exited {done.returncode}: {tail}")


# -- the steps ----------------------------------------------------------------------------

def prepare_model(work: Path, smoke: bool) -> dict:
    """The base model folder and four random role adapters under ``work/adapters``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from heart.models import build_tiny_qwen3, qwen3_tokenizer_dir

    if smoke:
        folder = build_tiny_qwen3()
        model = AutoModelForCausalLM.from_pretrained(folder)
    else:
        from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

        folder = work / "qwen3-8b-random"
        tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
        config = Qwen3Config(**{k: v for k, v in QWEN3_8B.items() if k not in ("architectures", "model_type")})
        torch.manual_seed(0)
        with torch.device("cuda"):
            torch.set_default_dtype(torch.bfloat16)
            model = Qwen3ForCausalLM(config)
            torch.set_default_dtype(torch.float32)
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.generation_config = GenerationConfig(eos_token_id=[im_end, config.bos_token_id],
                                                   pad_token_id=config.bos_token_id)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    adapters = work / "adapters"
    for index, role in enumerate(ROLES):
        torch.manual_seed(index + 1)
        peft_model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules="all-linear",
                                                      init_lora_weights=False, task_type="CAUSAL_LM"))
        peft_model.save_pretrained(adapters / role)
        model = peft_model.unload()
    parameters = sum(p.numel() for p in model.parameters())
    del model
    return {"folder": str(folder), "parameters": parameters, "adapters": str(adapters), "lora_rank": LORA_RANK}


def collect_data(work: Path, tasks: int, log: Path) -> dict:
    heart = [sys.executable, "-m", "heart_distill.cli"]
    seeded = {"PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1"}
    run([*heart, "collect", "--env", "bfcl", "--split", "train", "--teacher", "gold", "--fault-rate", "0.3",
         "--limit", str(tasks), "--out", str(work / "collect")], log, 600, seeded)
    run([*heart, "datasets", "build", str(work / "collect"), "--out", str(work / "datasets"),
         "--tokenizer", "whitespace"], log, 600, seeded)
    report = json.loads((work / "datasets" / "build_report.json").read_text())
    return {"tasks": tasks, "planner_rows": report["roles"]["planner"]["splits"]}


def train(work: Path, model: dict, config: str, steps: int, log: Path, smoke: bool, gpus: int) -> dict:
    """One Planner training run through ``accelerate launch``; figures from its adapter manifest."""
    name = Path(config).stem
    out = work / f"train-{name}"
    overrides = [f"model.name={model['folder']}", f"data.dataset_dir={work / 'datasets' / 'planner'}",
                 f"output.dir={out}", "output.overwrite=true", f"sft.max_steps={steps}", "sft.eval_steps=0",
                 f"sft.save_steps={10 * steps}", "sft.logging_steps=1"]
    if smoke:  # the GPU recipe as it runs on a CPU: fp32, no bf16 autocast
        overrides += ["model.dtype=float32", "sft.bf16=false", "sft.use_cpu=true", "sft.gradient_checkpointing=false",
                      "sft.batch_size=1", "sft.grad_accum=1"]
    else:  # the recipe's micro-batch, without accumulation: more steps measured in the same time
        overrides.append("sft.grad_accum=1")
    if name == "fsdp":  # checkpointing belongs to the FSDP wrapper (the config's header says why)
        overrides.append("sft.gradient_checkpointing=false")
    processes = ["--num_processes", str(gpus)] if name == "fsdp" else []
    started = time.perf_counter()
    run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate/{config}",
         *processes, "-m", "heart_distill.train.sft", "--recipe", "recipes/qwen3-8b/planner.yaml", *overrides],
        log, 1800)
    metrics = json.loads((out / "manifest.json").read_text())["metrics"]
    peak = None if smoke else next((v for k, v in PEAK_BF16_FLOPS.items() if k in gpu_name()), None)
    n = linear_parameters(QWEN3_8B) if not smoke else None
    return {"config": f"recipes/accelerate/{config}", "gpus": gpus if name == "fsdp" else (0 if smoke else 1),
            "steps": metrics["steps"], "tokens_per_s": round(metrics["tokens_per_s"], 1),
            "train_runtime_s": round(metrics["train_runtime_s"], 2), "wall_s": round(time.perf_counter() - started, 1),
            "mfu": (round(mfu(metrics["tokens_per_s"], n, peak, gpus if name == "fsdp" else 1), 4)
                    if n and peak else None),
            "peak_gpu_memory_gb": metrics.get("peak_gpu_memory_gb"),
            "loss_first_last": [metrics["train_loss_first"], metrics["train_loss_last"]]}


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""


def serve(work: Path, model: dict, args: argparse.Namespace, log: Path) -> dict:
    """vllm serve the base with the four adapters; mixed-role load, then the base alone."""
    vllm = REPO / os.environ.get("HEART_VLLM_VENV", ".venv-vllm") / "bin" / "vllm"
    if not vllm.exists():
        raise RuntimeError(f"{vllm} is missing: run VLLM_PACKAGE=vllm bash scripts/setup_vllm.sh")
    port = 8765
    modules = [f"{role}={Path(model['adapters']) / role}" for role in ROLES]
    command = [str(vllm), "serve", model["folder"], "--served-model-name", "base", "--port", str(port),
               "--enable-lora", "--max-loras", "4", "--max-lora-rank", str(LORA_RANK), "--lora-modules", *modules,
               "--max-model-len", "4096", "--gpu-memory-utilization", "0.85", "--seed", "0"]
    with open(log, "a") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        started = time.perf_counter()
        url = f"http://127.0.0.1:{port}/v1"
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited {server.returncode}: {log.read_text()[-1500:]}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2)
                break
            except OSError:
                if time.perf_counter() - started > 600:
                    raise RuntimeError("vllm serve did not answer within 600 s") from None
                time.sleep(1)
        ready_s = time.perf_counter() - started
        mixed = load(url, [ROLES[i % len(ROLES)] for i in range(args.requests)], args)
        base = load(url, ["base"] * args.requests, args)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"server_ready_s": round(ready_s, 1), "mixed_roles": mixed, "base_alone": base,
            "tokens_per_s_mixed_over_base": round(mixed["output_tokens_per_s"] / base["output_tokens_per_s"], 3)}


PROMPT = ("You are the Planner of a tool-use harness. Tools: ls, cd, cat, grep, mv, cp, touch, mkdir, sort, wc. "
          "Write a JSON plan for: list the files of the current folder, then count the lines of the longest one. "
          * 8)
"""A role-sized prompt (~500 tokens), the same for every request."""


def load(url: str, models: list[str], args: argparse.Namespace) -> dict:
    """Stream ``len(models)`` completions at ``args.concurrency``; tokens/s over the phase and TTFTs."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    first_token: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def one(model: str) -> None:
        sent = time.perf_counter()
        stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=args.max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        seen = False
        for chunk in stream:
            if not seen and chunk.choices and chunk.choices[0].text:
                seen = True
                with lock:
                    first_token.append(time.perf_counter() - sent)
            if chunk.usage is not None:
                with lock:
                    tokens[0] += chunk.usage.completion_tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(one, models))
    wall = time.perf_counter() - started
    return {"requests": len(models), "concurrency": args.concurrency, "output_tokens": tokens[0],
            "wall_s": round(wall, 2), "output_tokens_per_s": round(tokens[0] / wall, 1),
            "time_to_first_token": latency_summary(first_token)}


def parity(work: Path, model: dict, log: Path) -> dict:
    report = work / "parity.json"
    done = subprocess.run([sys.executable, "-m", "heart_distill.cli", "check", "parity", "--adapters", model["adapters"],
                           "--model", model["folder"], "--engines", "vllm", "--vllm-log", str(log),
                           "--out", str(report)], capture_output=True, text=True, timeout=1200, cwd=REPO)
    if not report.exists():
        raise RuntimeError(f"heart check parity exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(report.read_text())


# -- the run ------------------------------------------------------------------------------

def step(results: dict, name: str, function, *args) -> object:
    """Run one step, recording its figures or its error and its wall time; never raises."""
    started = time.perf_counter()
    print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
    try:
        value = function(*args)
        results[name] = {"status": "ok", **value}
    except Exception as err:  # a failed step is a finding: record it, go on with the others
        value = None
        results[name] = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
    results[name]["step_s"] = round(time.perf_counter() - started, 1)
    print(f"gpu_check: {name}: {results[name]['status']} ({results[name]['step_s']} s)", file=sys.stderr, flush=True)
    return value


def skip(results: dict, name: str, why: str) -> None:
    results[name] = {"status": "skipped", "why": why}
    print(f"gpu_check: {name}: skipped: {why}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    smoke = args.cpu_smoke
    gpus = torch.cuda.device_count()
    if not smoke and not gpus:
        print("error: no CUDA device; run with --cpu-smoke to check the steps on CPU", file=sys.stderr)
        return 2
    steps = args.steps or (2 if smoke else 24)
    tasks = args.tasks or (4 if smoke else 24)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    results: dict = {"mode": "cpu-smoke" if smoke else "gpu", "gpu": gpu_name() or None, "gpus": gpus,
                     "model": "tiny-qwen3 (random)" if smoke else "Qwen3-8B config, random bf16 weights",
                     "settings": {"steps": steps, "tasks": tasks, "requests": args.requests,
                                  "concurrency": args.concurrency, "max_tokens": args.max_tokens}}
    started = time.perf_counter()
    model = step(results, "model", prepare_model, work, smoke)
    data = model and step(results, "data", collect_data, work, tasks, log)
    if smoke:
        if data:
            step(results, "train_cpu", train, work, model, "cpu.yaml", steps, log, True, 0)
        for name in ("train_single_gpu", "train_fsdp"):
            skip(results, name, CUDA_NEEDED)
        skip(results, "serve", CUDA_NEEDED + " (vLLM)")
        skip(results, "parity", CUDA_NEEDED + " (vLLM; on a CPU: heart check parity --engines vllm,int8 with "
                                              "scripts/setup_vllm.sh, docs/serving.md)")
    else:
        if data:
            step(results, "train_single_gpu", train, work, model, "single_gpu.yaml", steps, log, False, gpus)
            step(results, "train_fsdp", train, work, model, "fsdp.yaml", steps, log, False, gpus)
        if model:
            torch.cuda.empty_cache()
            step(results, "serve", serve, work, model, args, log)
            step(results, "parity", parity, work, model, log)
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["failed"] = [name for name, value in results.items() if isinstance(value, dict)
                         and value.get("status") == "failed"]
    path = write_stamped_json(args.out, results, stamp(argv))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"gpu_check: {len(results['failed'])} step(s) failed; wrote {path}", file=sys.stderr)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
