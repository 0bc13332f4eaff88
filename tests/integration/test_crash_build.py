"""SIGKILL during `heart datasets build --overwrite`: a half-written dataset is never read as
complete. After every kill the output folder holds either the previous build or the new
one, whole (the build swaps a staging folder in atomically), and the next build cleans up.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from heart import ROLES

HEART = [sys.executable, "-m", "heart_distill.cli"]


def snapshot(out: Path) -> dict[str, bytes]:
    # The report holds timings; everything else of a build is deterministic.
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "build_report.json"}


def test_sigkill_during_overwrite_never_leaves_a_partial_dataset(tmp_path):
    run = tmp_path / "run"
    out = run / "datasets"
    collected = subprocess.run([*HEART, "collect", "--env", "bfcl", "--limit", "6", "--fault-rate", "0.3",
                                "--out", str(run)], capture_output=True, text=True, timeout=600)
    assert collected.returncode == 0, collected.stderr
    build = [*HEART, "datasets", "build", str(run), "--out", str(out), "--tokenizer", "whitespace"]
    first = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    assert {name.split("/")[0] for name in before} >= set(ROLES)

    rng = random.Random(0)
    started = time.perf_counter()
    full = subprocess.run([*build, "--overwrite"], capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr
    duration = time.perf_counter() - started
    before = snapshot(out)  # the cards record the options (--overwrite included)
    for _ in range(6):  # kills spread over the whole build, imports to swap
        proc = subprocess.Popen([*build, "--overwrite"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, duration))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert out.is_dir(), "the kill left no dataset folder"
        assert snapshot(out) == before, "the kill left a partial or mixed dataset"
        json.loads((out / "build_report.json").read_text())
    again = subprocess.run([*build, "--overwrite"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert snapshot(out) == before
    leftovers = [p.name for p in run.iterdir() if ".staging-" in p.name or ".old-" in p.name]
    assert not leftovers, leftovers
