"""``heart serve`` under load: a real server, real role inputs, hostile requests beside them.

    python bench/serve_load.py                                        # base only
    python bench/serve_load.py --adapters runs/smollm2-pipeline/adapters  # four role adapters

Starts ``heart serve`` as its own process on a free loopback port (SmolLM2-135M, plus one
adapter per role folder found under ``--adapters``), waits until ``/v1/models`` answers,
then measures side by side in one run:

1. **sequential**: ``--sequential`` role calls one at a time (one client);
2. **concurrent**: ``--requests`` role calls from ``--clients`` client threads at once,
   cycling through the four roles, so every batch mixes adapters;
3. **hostile**: requests a server must refuse cleanly (unknown role, malformed JSON, an oversized
   prompt, bad sampling parameters, …), sent *during* the concurrent load.

Role inputs are real: the messages of the role calls in gold-teacher episodes of a few
BFCL train tasks. Every reply is checked: status
code, an OpenAI-shaped body, the model name echoed, the adapter that answered (the role's
own, or none for ``base``), and ``usage`` counts. A *lost* response is a request with no
reply, a reply that is not JSON, or one that answers another model. The table gives status
counts per phase, lost responses, latency p50 / p95 and aggregate completion tokens/s, and
the concurrent phase's throughput as a multiple of the sequential one. The figures go to
``--out`` (default ``runs/bench/serve_load.json``) under the run's provenance stamp; curated
results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from heart import ROLES  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = ROOT / "runs" / "bench" / "serve_load.json"
"""Where a run's figures go by default (runs/ is not tracked)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def role_inputs(tasks: int) -> dict[str, list[list[dict]]]:
    """Each role's input messages from gold-teacher episodes of ``tasks`` BFCL train tasks."""
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill.eval.e2e import EpisodeEvents
    from heart.environments import load_environment
    from heart.episode import run_episode

    env = load_environment("bfcl")
    by_role: dict[str, list[list[dict]]] = {role: [] for role in ROLES}
    for task_id in env.task_ids("train")[:tasks]:
        task = env.load_task(task_id)
        events = EpisodeEvents()  # in memory: only the messages are read back
        run_episode(env, task, GoldTeacher(task, env.catalog()), trace=events)
        for row in events.rows:
            if row["kind"] == "event" and row["role"] in by_role:
                by_role[row["role"]].append(row["messages"])
    missing = [role for role, rows in by_role.items() if not rows]
    if missing:
        raise SystemExit(f"serve_load: the gold episodes have no {missing} calls; raise --tasks")
    return by_role


class Server:
    """``heart serve`` in its own process group, stopped (and reaped) on exit."""

    def __init__(self, adapters: dict[str, Path], max_batch_size: int, max_prompt_tokens: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        command = [sys.executable, "-m", "heart_distill.cli", "serve", "--port", str(self.port),
                   "--max-batch-size", str(max_batch_size), "--max-prompt-tokens", str(max_prompt_tokens)]
        for role, path in adapters.items():
            command += ["--adapter", f"{role}={path}"]
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"serve_load: heart serve exited with {self.process.returncode}:\n"
                                 + Path(self.log.name).read_text()[-2000:])
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit("serve_load: heart serve did not answer /v1/models within 300 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        Path(self.log.name).unlink(missing_ok=True)


def role_call(url: str, model: str, messages: list[dict], max_tokens: int, adapters: set[str]) -> dict:
    """One chat completion; what came back, judged."""
    started = time.perf_counter()
    try:
        reply = httpx.post(f"{url}/chat/completions", timeout=600,
                           json={"model": model, "messages": messages, "max_tokens": max_tokens})
    except httpx.HTTPError as err:
        return {"status": None, "lost": f"no reply: {type(err).__name__}", "latency_s": time.perf_counter() - started}
    latency = time.perf_counter() - started
    try:
        body = reply.json()
    except ValueError:
        return {"status": reply.status_code, "lost": "body is not JSON", "latency_s": latency}
    if reply.status_code != 200:
        return {"status": reply.status_code, "lost": None, "latency_s": latency,
                "message": body.get("error", {}).get("message", "")}
    expected_adapter = model if model in adapters else None
    problems = []
    if body.get("model") != model:
        problems.append(f"answered as {body.get('model')!r}")
    if body.get("heart_adapter") != expected_adapter:
        problems.append(f"adapter {body.get('heart_adapter')!r}, expected {expected_adapter!r}")
    if not isinstance(body.get("choices", [{}])[0].get("message", {}).get("content"), str):
        problems.append("no message content")
    usage = body.get("usage", {})
    return {"status": 200, "lost": "; ".join(problems) or None, "latency_s": latency,
            "completion_tokens": usage.get("completion_tokens", 0)}


def hostile_requests(url: str, messages: list[dict]) -> list[tuple[str, httpx.Response | str]]:
    """Requests a server must refuse with a 4xx that names the problem."""
    cases = {
        "unknown role": {"model": "planer", "messages": messages},
        "oversized prompt": {"model": "planner", "messages": [{"role": "user", "content": "word " * 20_000}]},
        "temperature -1": {"model": "planner", "messages": messages, "temperature": -1},
        "max_tokens 10^6": {"model": "planner", "messages": messages, "max_tokens": 1_000_000},
        "no messages": {"model": "planner", "messages": []},
        "message without role": {"model": "planner", "messages": [{"content": "hi"}]},
        "n = 4": {"model": "planner", "messages": messages, "n": 4},
    }
    out = []
    for name, payload in cases.items():
        out.append((name, httpx.post(f"{url}/chat/completions", json=payload, timeout=60)))
    out.append(("malformed JSON", httpx.post(f"{url}/chat/completions", content=b'{"model": "planner", "mess',
                                             headers={"content-type": "application/json"}, timeout=60)))
    return out


def summarise(name: str, results: list[dict], wall_s: float) -> dict:
    statuses = Counter(str(r["status"]) for r in results)
    latencies = sorted(r["latency_s"] for r in results)
    tokens = sum(r.get("completion_tokens", 0) for r in results)
    return {"phase": name, "requests": len(results), "statuses": dict(statuses),
            "5xx": sum(n for s, n in statuses.items() if s.startswith("5")),
            "lost": sum(1 for r in results if r["lost"]),
            "lost_reasons": sorted({r["lost"] for r in results if r["lost"]}),
            "latency_p50_s": round(statistics.median(latencies), 2),
            "latency_p95_s": round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 2),
            "wall_s": round(wall_s, 1), "completion_tokens_per_s": round(tokens / wall_s, 2)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=Path, help="folder with one adapter folder per role (planner/, router/, …)")
    parser.add_argument("--tasks", type=int, default=3, help="BFCL train tasks whose role calls are the inputs")
    parser.add_argument("--sequential", type=int, default=8, help="requests sent one at a time")
    parser.add_argument("--requests", type=int, default=64, help="requests in the concurrent phase")
    parser.add_argument("--clients", type=int, default=16, help="client threads in the concurrent phase")
    parser.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each request")
    parser.add_argument("--max-batch-size", type=int, default=8, help="heart serve --max-batch-size")
    parser.add_argument("--out", type=Path, default=OUT, help="the figures as JSON (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)

    adapters = {}
    if args.adapters:
        adapters = {role: args.adapters / role for role in ROLES if (args.adapters / role / "adapter_config.json").exists()}
        if not adapters:
            raise SystemExit(f"serve_load: no role adapter folder under {args.adapters}")
    inputs = role_inputs(args.tasks)
    models = [*ROLES, "base"]
    plan = [(models[i % len(models)], inputs[ROLES[i % len(ROLES)]][i // len(ROLES) % len(inputs[ROLES[i % len(ROLES)]])])
            for i in range(max(args.requests, args.sequential))]

    with Server(adapters, args.max_batch_size, max_prompt_tokens=4096) as server:
        call = lambda job: role_call(server.url, job[0], job[1], args.max_tokens, set(adapters))  # noqa: E731
        call(plan[0])  # warm-up: first-call allocations are not the server's steady state
        started = time.perf_counter()
        sequential = [call(job) for job in plan[:args.sequential]]
        phases = [summarise("sequential", sequential, time.perf_counter() - started)]

        with ThreadPoolExecutor(args.clients + 1) as pool:
            started = time.perf_counter()
            load = pool.map(call, plan[:args.requests])
            hostile = pool.submit(hostile_requests, server.url, inputs["planner"][0])
            concurrent = list(load)
            phases.append(summarise(f"concurrent ({args.clients} clients)", concurrent, time.perf_counter() - started))
            hostile = hostile.result()
        alive = httpx.get(f"{server.url}/models", timeout=10).status_code == 200

    ratio = phases[1]["completion_tokens_per_s"] / max(phases[0]["completion_tokens_per_s"], 1e-9)
    print(f"heart serve: SmolLM2-135M, adapters {sorted(adapters) or 'none'}, max batch {args.max_batch_size}, "
          f"max_tokens {args.max_tokens}, inputs from {args.tasks} BFCL train tasks' gold role calls\n")
    print("| phase | requests | status codes | 5xx | lost | latency p50 / p95 | completion tokens/s |")
    print("|---|---:|---|---:|---:|---|---:|")
    for p in phases:
        codes = ", ".join(f"{s}×{n}" for s, n in sorted(p["statuses"].items()))
        print(f"| {p['phase']} | {p['requests']} | {codes} | {p['5xx']} | {p['lost']} | "
              f"{p['latency_p50_s']} s / {p['latency_p95_s']} s | {p['completion_tokens_per_s']} |")
    print(f"\nconcurrent / sequential throughput: {ratio:.2f}×; server answering after the load: {alive}")
    for p in phases:
        for reason in p["lost_reasons"]:
            print(f"  lost in {p['phase']}: {reason}")
    print("\n| hostile request (sent during the load) | status | message |")
    print("|---|---:|---|")
    hostile_rows = []
    for name, reply in hostile:
        try:
            message = reply.json().get("error", {}).get("message", "")
        except ValueError:
            message = reply.text
        message = message.replace("|", "\\|").replace("\n", " ")[:110]
        hostile_rows.append({"case": name, "status": reply.status_code, "message": message})
        print(f"| {name} | {reply.status_code} | {message} |")
    write_stamped_json(args.out, {"phases": phases, "throughput_ratio": round(ratio, 2), "alive_after": alive,
                                  "hostile": hostile_rows}, run_stamp)
    bad = sum(p["5xx"] + p["lost"] for p in phases) + sum(1 for r in hostile_rows if not 400 <= r["status"] < 500)
    return 1 if bad or not alive else 0


if __name__ == "__main__":
    sys.exit(main())
