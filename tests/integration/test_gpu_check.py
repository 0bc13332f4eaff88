"""The prepared GPU check (scripts/gpu_check.sh, bench/gpu_check.py), tested on CPU up to
where a GPU is needed: the script parses and refuses a machine without a GPU before any setup;
``--cpu-smoke`` runs the same entry points with the tiny Qwen3 (the model and its four role
adapters, a gold collection built into role datasets, one optimizer step of the Qwen3-8B
Planner recipe through ``accelerate launch``) and names each step that needs CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.gpu_check import linear_parameters, mfu  # noqa: E402
from heart import ROLES  # noqa: E402
from heart_distill.train.known_configs import QWEN3_8B  # noqa: E402


def test_the_script_parses_and_refuses_a_machine_without_a_gpu(tmp_path):
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")]).returncode == 0
    # nvidia-smi as it answers on a machine without a GPU (driver tools present or not)
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    no_gpu = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          env=no_gpu, timeout=60)
    assert done.returncode == 2 and "no NVIDIA GPU here" in done.stderr and "--cpu-smoke" in done.stderr


def test_mfu_counts_four_flops_per_linear_parameter_and_token():
    n = linear_parameters(QWEN3_8B)
    h, layers, head = QWEN3_8B["hidden_size"], QWEN3_8B["num_hidden_layers"], QWEN3_8B["head_dim"]
    # with the input embedding and the RMSNorms, Qwen3-8B's 8,190,735,360 parameters
    assert n + QWEN3_8B["vocab_size"] * h + layers * (2 * h + 2 * head) + h == 8_190_735_360
    assert mfu(1000.0, n, 989e12) == 4 * n * 1000.0 / 989e12
    assert mfu(1000.0, n, None) is None


def test_cpu_smoke_runs_the_steps_and_names_what_needs_cuda(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--cpu-smoke", "--steps", "1",
                           "--tasks", "4", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["stamp"]["command"].startswith("python bench/gpu_check.py --cpu-smoke")
    assert result["mode"] == "cpu-smoke" and result["failed"] == []
    assert result["model"]["status"] == "ok" and result["model"]["lora_rank"] == 16
    for role in ROLES:
        config = json.loads((tmp_path / "work" / "adapters" / role / "adapter_config.json").read_text())
        assert config["r"] == 16
    assert result["data"]["status"] == "ok" and result["data"]["planner_rows"]["train"] > 0
    trained = result["train_cpu"]
    assert trained["status"] == "ok" and trained["steps"] == 1 and trained["tokens_per_s"] > 0
    assert (tmp_path / "work" / "train-cpu" / "adapter_model.safetensors").is_file()
    for name in ("train_single_gpu", "train_fsdp", "serve", "parity"):
        assert result[name]["status"] == "skipped" and "needs CUDA" in result[name]["why"]
