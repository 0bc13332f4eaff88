"""The whole pipeline on real data, as a user runs it, at toy scale:

    heart collect (gold teacher, BFCL train tasks) → heart datasets build → heart train (all
    four SmolLM2 role recipes through accelerate) → heart run with the four adapters.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heart import ROLES
from heart.roles import ROLE_MODULES
from heart.traces import read_trace

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def heart(*args, cwd):
    return subprocess.run([sys.executable, "-m", "heart_distill.cli", *args], capture_output=True, text=True,
                          timeout=1500, cwd=cwd)


def test_collect_build_train_and_serve_four_role_adapters(tmp_path, smollm2_path):
    run = "runs/smollm2-demo"  # the CPU recipes' default data and adapter folders
    done = heart("collect", "--env", "bfcl", "--split", "train", "--teacher", "gold", "--fault-rate", "0.3",
                 "--limit", "12", "--out", run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    done = heart("datasets", "build", run, "--out", f"{run}/datasets", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]

    done = heart("train", "--recipe", str(REPO / "recipes/smollm2-135m/roles.yaml"), "sft.max_steps=1",
                 "sft.batch_size=1", "data.max_eval_examples=2", "data.system_prompt=short", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    adapters = {role: tmp_path / run / "adapters" / role for role in ROLES}
    for role, folder in adapters.items():
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["role"] == role and manifest["system_prompt"] == "short"
        assert manifest["dataset"]["fingerprint"].startswith("sha256:")
        assert manifest["base_model"]["content_hash"] == json.loads((Path(smollm2_path) / "heart_model.json")
                                                               .read_text())["content_hash"]

    trace = tmp_path / "trace.jsonl"
    args = [f"--adapter={role}={folder}" for role, folder in adapters.items()]
    args += [f"--short-prompt={role}" for role in ROLES]
    # Every turn calls all four roles, so a two-turn task with one-step plans checks the serving
    # (each role's adapter and short prompt) at a third of the decoding of multi_turn_base_1's
    # four turns of three-step plans (~85 s, not ~250 s on 2 cores).
    done = heart("run", "--env", "bfcl", "--task", "multi_turn_base_3", "--trace", str(trace), "--budget", "0",
                 "--max-clarifications", "0", "--max-plan-steps", "1", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [r for r in read_trace(trace) if r["kind"] == "event"]
    assert {e["role"] for e in events} == set(ROLES)
    assert all(e["adapter"] == e["role"] for e in events)  # each role served by its own adapter
    # each role was sent the short system prompt its adapter was trained on
    assert all(e["messages"][0]["content"] == ROLE_MODULES[e["role"]].SHORT_SYSTEM_PROMPT for e in events)


def test_heart_pipeline_until_train_then_everything_is_skipped(tmp_path, smollm2_path):
    """`heart pipeline --until train` on real data and real training, at toy scale, killed
    (SIGKILL, every process of it) once the first role's adapter is published; a rerun continues
    the train stage with the other role alone; then a rerun skips every stage (content-addressed)
    and `--stage train --force` retrains alone."""
    import os
    import signal
    import time

    import yaml

    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({
        "run_dir": "run", "collect": {"envs": ["bfcl"], "limit": 6},
        "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml"), "roles": ["primitive", "verifier"],
                  "overrides": ["sft.max_steps=1", "sft.batch_size=2", "data.max_train_examples=4",
                                "data.max_eval_examples=1", "sft.max_length=4096"]}}))
    adapters = tmp_path / "run/adapters"
    log = tmp_path / "killed.log"
    with log.open("w") as sink:
        killed = subprocess.Popen([sys.executable, "-m", "heart_distill.cli", "pipeline", "--recipe", str(recipe),
                                   "--until", "train"], cwd=tmp_path, start_new_session=True, stdout=sink,
                                  stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 1200
    while not (first := sorted(adapters.glob("*/manifest.json"))) and killed.poll() is None:
        assert time.monotonic() < deadline, "no adapter was published"
        time.sleep(0.05)
    assert killed.poll() is None, log.read_text()[-3000:]  # still training the other role
    os.killpg(killed.pid, signal.SIGKILL)  # the pipeline, heart train and the training process under it
    assert killed.wait() == -signal.SIGKILL and len(first) == 1
    finished, left = first[0].parent.name, ({"primitive", "verifier"} - {first[0].parent.name}).pop()
    weights = (adapters / finished / "adapter_model.safetensors").stat().st_mtime_ns

    done = heart("pipeline", "--recipe", str(recipe), "--until", "train", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[3/3] train: continuing an interrupted run" in done.stderr and done.stderr.count("up to date") == 2
    train_line = next(line for line in done.stderr.splitlines() if "train: $ heart train" in line)
    assert f"--roles {left} " in train_line and "output.overwrite" not in train_line
    assert (adapters / finished / "adapter_model.safetensors").stat().st_mtime_ns == weights  # kept, not retrained
    for role in ("primitive", "verifier"):
        manifest = json.loads((tmp_path / "run/adapters" / role / "manifest.json").read_text())
        assert manifest["role"] == role and manifest["system_prompt"] == "short"
        assert manifest["lora"]["layers"] == list(range(22, 30))  # the recipe's top_layers: 8 of 30
        assert manifest["dataset"]["sizes"]["train"] == 4 and "dropped_overlong" in manifest["dataset"]
    timings = json.loads((tmp_path / "run/pipeline.json").read_text())["stages"]
    assert list(timings) == ["collect", "datasets", "train"] and timings["train"]["continued"]
    assert all(t["last_run_wall_s"] > 0 for t in timings.values())

    again = heart("pipeline", "--recipe", str(recipe), "--until", "train", cwd=tmp_path)
    assert again.returncode == 0 and again.stderr.count("up to date") == 3, again.stderr[-2000:]
    weights = (tmp_path / "run/adapters/verifier/adapter_model.safetensors").stat().st_mtime_ns

    retrain = heart("pipeline", "--recipe", str(recipe), "--stage", "train", "--force", cwd=tmp_path)
    assert retrain.returncode == 0, retrain.stderr[-3000:]
    assert "collect" not in retrain.stderr.split("pipeline: [1/1]")[0]
    assert (tmp_path / "run/adapters/verifier/adapter_model.safetensors").stat().st_mtime_ns != weights

    # the library stage: the retrained Verifier goes before the run's library, validated on real
    # gate rows with the real model, and the decision is recorded with its evidence
    recipe.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "eval": {"engine": "llamacpp:f16"},
                                      "library": {"roles": ["verifier"], "rows": 2}}))
    admitted = heart("pipeline", "--recipe", str(recipe), "--stage", "library", cwd=tmp_path)
    assert admitted.returncode == 0, admitted.stderr[-3000:]
    library = json.loads((tmp_path / "run/library/library.json").read_text())
    (decision,) = library["history"]
    assert decision["name"] == "verifier" and decision["decision"] in ("admitted", "rejected")
    assert 1 <= decision["lift"]["n"] <= 2 and decision["source"] == "run/adapters/verifier"
    assert ("verifier" in library["adapters"]) == (decision["decision"] == "admitted")
