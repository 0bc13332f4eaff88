"""TransformersBackend with real models: the converted SmolLM2 and the tiny random Qwen3.

What only a real model shows: the converted folder loads with the right size and hash, the
chat template reaches the model, greedy decoding is deterministic, left-padded batches equal
single calls, and per-role LoRA adapters (made here by peft, with perturbed lora_B so they
change the output) serve their role alone and in mixed batches.
"""

import json
from pathlib import Path

import pytest

from heart.models import MANIFEST_NAME, weights_hash
from heart.runtime.base import Backend, GenerationRequest, SamplingConfig

GREEDY = SamplingConfig(max_new_tokens=16)

PLAN = [
    {"role": "system", "content": "You are the Planner. Answer with a JSON plan."},
    {"role": "user", "content": "Find the cheapest flight from Paris to Rome tomorrow."},
]
ARITHMETIC = [{"role": "user", "content": "What is 2+2?"}]
VERIFY = [
    {"role": "system", "content": "You are the Verifier. Answer PASS or FAIL."},
    {"role": "user", "content": "Task: add 2 and 3. Result: 5."},
]


def make_lora_adapters(
    base_path, out_dir: Path, roles: list[str], seed: int = 0, scale: float = 0.05
):
    """Save one LoRA adapter per role; lora_B is perturbed so each adapter changes outputs.

    peft initialises lora_B to zero (an adapter that does nothing); random values make an
    adapter whose effect is visible, as a trained one's would be. Everything random is
    seeded here (peft draws lora_A from the global RNG), so the adapters do not depend on
    which tests ran before.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = get_peft_model(base, config, adapter_name=roles[0])
        for role in roles[1:]:
            model.add_adapter(role, config)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape) * scale)
    model.save_pretrained(out_dir)  # adapters not named "default" go to out_dir/<name>
    paths = {role: str(out_dir / role) for role in roles}
    for path in paths.values():
        config_file = Path(path) / "adapter_config.json"
        assert config_file.is_file()
        # peft writes target_modules from a set, in this process's hash-seed order; sorted, the
        # same seeded adapters are the same bytes in every run, so their llama.cpp conversion
        # (cached by content hash, heart/runtime/gguf_files.py) is done once per machine (~11 s).
        config = json.loads(config_file.read_text())
        config["target_modules"] = sorted(config["target_modules"])
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    return paths


def texts(generations):
    return [g.text for g in generations]


# --- the converted SmolLM2 folder ---------------------------------------------------------


@pytest.mark.slow
def test_smollm2_folder_loads_with_its_recorded_hash(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from heart.models import sha256_file, smollm2_gguf_path

    manifest = json.loads((smollm2_path / MANIFEST_NAME).read_text())
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    n_params = sum(p.numel() for p in model.parameters())
    assert 134.4e6 < n_params < 134.6e6
    assert manifest["parameters"] == n_params
    assert manifest["dtype"] == "float32"
    assert manifest["content_hash"] == weights_hash(smollm2_path)
    assert manifest["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert manifest["source"]["sha256"] == sha256_file(smollm2_gguf_path())
    # Without remove_quantization_config the folder would carry it, and training refuses.
    assert "quantization_config" not in json.loads((smollm2_path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert tokenizer.eos_token == "<|im_end|>"


# --- SmolLM2 base, no adapters --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_backend(smollm2_path):
    from heart.runtime.hf import TransformersBackend

    return TransformersBackend("smollm2-135m")


@pytest.mark.slow
def test_greedy_generation_is_deterministic(smollm2_backend):
    backend = smollm2_backend
    assert isinstance(backend, Backend)
    first = backend.generate("planner", PLAN, GREEDY)
    second = backend.generate("planner", PLAN, GREEDY)
    assert first.text.strip()
    assert first.text == second.text
    assert first.backend == "hf:smollm2-135m" == backend.name
    assert first.adapter is None
    prompt_ids = backend.tokenizer(backend.render(PLAN), add_special_tokens=False)["input_ids"]
    assert first.prompt_tokens == len(prompt_ids)
    assert 0 < first.completion_tokens <= GREEDY.max_new_tokens
    assert first.latency_s > 0


@pytest.mark.slow
def test_generation_stops_at_end_of_turn(smollm2_backend):
    answer = smollm2_backend.generate("router", ARITHMETIC, SamplingConfig(max_new_tokens=64))
    assert answer.completion_tokens < 64, answer.text  # stopped by <|im_end|>, not the cap
    assert "<|im_end|>" not in answer.text and answer.text.strip()


@pytest.mark.slow
def test_batch_equals_single_calls(smollm2_backend):
    backend = smollm2_backend
    requests = [
        GenerationRequest("planner", PLAN, GREEDY),
        GenerationRequest("router", ARITHMETIC, GREEDY),
    ]
    singles = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    batch = backend.generate_batch(requests)
    assert texts(batch) == texts(singles)
    assert [g.prompt_tokens for g in batch] == [g.prompt_tokens for g in singles]
    assert [g.completion_tokens for g in batch] == [g.completion_tokens for g in singles]


@pytest.mark.slow
def test_batch_groups_by_sampling_config_and_keeps_order(smollm2_backend):
    backend = smollm2_backend
    short = SamplingConfig(max_new_tokens=4)
    requests = [
        GenerationRequest("planner", PLAN, GREEDY),
        GenerationRequest("router", ARITHMETIC, short),
        GenerationRequest("verifier", VERIFY, GREEDY),
    ]
    batch = backend.generate_batch(requests)
    assert batch[1].completion_tokens <= 4
    singles = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    assert texts(batch) == texts(singles)


# --- SmolLM2 with per-role LoRA adapters ----------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_adapters(smollm2_path, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("lora")
    return make_lora_adapters(smollm2_path, out_dir, ["planner", "verifier"])


@pytest.fixture(scope="module")
def adapter_backend(smollm2_adapters):
    from heart.runtime.hf import TransformersBackend

    return TransformersBackend("smollm2-135m", adapters=smollm2_adapters)


@pytest.mark.slow
def test_adapter_changes_the_role_output(adapter_backend, smollm2_backend):
    backend = adapter_backend
    assert backend.roles_with_adapters() == ["planner", "verifier"]
    adapted = backend.generate("planner", PLAN, GREEDY)
    base_role = backend.generate("router", PLAN, GREEDY)  # same prompt, no adapter
    assert adapted.adapter == "planner" and base_role.adapter is None
    assert adapted.text != base_role.text
    # A role without an adapter gets exactly the base model, adapters disabled.
    assert base_role.text == smollm2_backend.generate("router", PLAN, GREEDY).text
    # Switching back and forth keeps each role's answer.
    assert backend.generate("verifier", PLAN, GREEDY).text not in (adapted.text, base_role.text)
    assert backend.generate("planner", PLAN, GREEDY).text == adapted.text


@pytest.mark.slow
def test_mixed_role_batch_equals_single_calls(adapter_backend):
    backend = adapter_backend
    requests = [
        GenerationRequest("planner", PLAN, GREEDY),
        GenerationRequest("router", ARITHMETIC, GREEDY),
        GenerationRequest("verifier", VERIFY, GREEDY),
        GenerationRequest("router", PLAN, GREEDY),
    ]
    singles = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    batch = backend.generate_batch(requests)
    assert texts(batch) == texts(singles)
    assert [g.adapter for g in batch] == ["planner", None, "verifier", None]


def test_bad_adapter_folder_fails_before_loading_naming_the_role(tmp_path):
    from heart.runtime.hf import TransformersBackend

    with pytest.raises(FileNotFoundError, match="'planner'"):
        TransformersBackend("no-model-needed", adapters={"planner": str(tmp_path)})
    with pytest.raises(ValueError, match="reserved"):
        TransformersBackend("no-model-needed", adapters={"__base__": str(tmp_path)})


# --- tiny Qwen3: the Qwen3 template and code paths -----------------------------------------


@pytest.mark.slow
def test_tiny_qwen3_backend_thinking_off_and_mixed_adapters(tiny_qwen3_path, tmp_path):
    from heart.runtime.hf import TransformersBackend

    # A random two-layer model mostly copies its input embedding: only a strong adapter
    # moves its argmax.
    adapters = make_lora_adapters(tiny_qwen3_path, tmp_path, ["planner"], seed=1, scale=0.5)
    backend = TransformersBackend("tiny-qwen3", adapters=adapters)
    assert backend.base_model_id == "tiny-qwen3"
    assert backend.base_model_hash.startswith("sha256:")
    assert backend.render(PLAN).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    sampling = SamplingConfig(max_new_tokens=12)
    planner = backend.generate("planner", PLAN, sampling)
    router = backend.generate("router", PLAN, sampling)
    assert planner.text != router.text  # random weights: text is noise, but the adapter acts
    batch = backend.generate_batch(
        [GenerationRequest("planner", PLAN, sampling), GenerationRequest("router", PLAN, sampling)]
    )
    assert texts(batch) == [planner.text, router.text]


@pytest.mark.gpu
def test_tiny_qwen3_on_cuda_in_bfloat16(tiny_qwen3_path, tmp_path):
    import torch

    from heart.runtime.hf import TransformersBackend

    adapters = make_lora_adapters(tiny_qwen3_path, tmp_path, ["planner"], seed=1)
    backend = TransformersBackend("tiny-qwen3", adapters=adapters)
    assert backend.device.type == "cuda"
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    batch = backend.generate_batch(
        [GenerationRequest("planner", PLAN, GREEDY), GenerationRequest("router", PLAN, GREEDY)]
    )
    assert [g.adapter for g in batch] == ["planner", None]
    assert all(g.completion_tokens > 0 for g in batch)
