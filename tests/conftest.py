"""Shared test setup: no model hub, embedded models prepared once per machine, GPU skips.

HEART_CACHE is left as the user's (default ~/.cache/heart) unless already set, so the
517 MB SmolLM2 conversion happens once per machine, not once per test run.
"""

import os

# Before anything imports huggingface_hub: a stray download must fail fast, not hang.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
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
