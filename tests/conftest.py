"""Shared test setup: no model hub, embedded models prepared once per machine, GPU skips,
and the order in which ``pytest -n 2`` (scripts/test.sh) hands modules to its two workers.

HEART_CACHE is left as the user's (default ~/.cache/heart) unless already set, so the
517 MB SmolLM2 conversion happens once per machine, not once per test run (a file lock makes
two xdist workers that ask at once wait for one conversion).

Under pytest-xdist (``-n 2 --dist loadfile``, scripts/test.sh):

* each worker runs torch on one thread (``OMP_NUM_THREADS=1``, inherited by the ``heart``
  subprocesses the tests start). Greedy decoding of the 135M model is memory-bound: measured
  here, one thread decodes as fast as two (3.82 s vs 3.68 s for 48 tokens), while two workers
  with two threads each on 2 cores oversubscribe them (heart/runtime/hf.py: ~7x slower).
* the tests of a module run on one worker (``--dist loadfile``), so a module's fixtures (a
  loaded model, converted adapters) are built once, not once per worker. (``--dist loadgroup``
  would let a module's independent tests run side by side, but with pytest 9.2 it silently
  stops grouping: pytest-xdist issue #1386.)
* the modules in :data:`LONGEST_FIRST` start first, longest first, and everything else follows
  in collection order (``--no-loadscope-reorder``), so the short unit modules fill in at the
  end instead of one worker finishing a four-minute module alone.
"""

import os

# Before anything imports huggingface_hub: a stray download must fail fast, not hang.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # set by xdist before this import
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")

import pytest  # noqa: E402

LONGEST_FIRST = (  # wall time under `-n 2` on 2 cores, measured
    "tests/integration/test_pipeline.py",  # ~245 s: collect, build, train and serve; a pipeline twice
    "tests/integration/test_smollm2_loop.py",  # ~210 s: SmolLM2 runs a BFCL and an AgentDojo task
    "tests/integration/test_train_sft.py",  # ~130 s: five LoRA trainings
    "tests/integration/test_collect.py",  # ~65 s
    "tests/integration/test_ray_executor.py",  # ~50 s: a local Ray instance, collections on both executors
    "tests/integration/test_gpu_check.py",  # ~45 s: the GPU check's CPU smoke (one accelerate launch)
    "tests/integration/test_llamacpp.py",  # ~55 s
    "tests/integration/test_hf_backend.py",  # ~45 s
)


def pytest_collection_modifyitems(config, items):
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # every worker sorts alike
        def rank(item):
            module = item.nodeid.split("::")[0]
            return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

        items.sort(key=rank)  # stable: the rest keep their collection order
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # do not pay the torch import for CPU-only selections
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted SmolLM2-135M-Instruct folder (converted on first use, ~20 s)."""
    from heart.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def tiny_qwen3_path():
    """The tiny random Qwen3 folder on the real Qwen3 tokenizer (built on first use, ~5 s)."""
    from heart.models import build_tiny_qwen3

    return build_tiny_qwen3()
