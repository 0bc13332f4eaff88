"""The role runtime with real models: batched role calls through the scheduler, per-row
grammars in mixed batches, the int8 path with LoRA on top, and peft vs vLLM parity.

tiny-qwen3 for what any model shows (seconds); SmolLM2 for vLLM parity, because vLLM's CPU
attention has no kernel for tiny-qwen3's head_dim of 16. Parity is skipped without
``.venv-vllm`` (scripts/setup_vllm.sh).
"""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from heart import ROLES
from heart.runtime.base import GenerationRequest, SamplingConfig

VERDICT = json.dumps({"type": "object", "properties": {"status": {"enum": ["PASS", "FAIL"]}, "step": {"enum": [1, 2]}},
                      "required": ["status", "step"], "additionalProperties": False})
CALL = json.dumps({"type": "object", "properties": {"tool": {"const": "ls"}}, "required": ["tool"],
                   "additionalProperties": False})


def _requests():
    ask = [{"role": "user", "content": "List the files, then open the largest."}]
    return [GenerationRequest("verifier", ask, SamplingConfig(max_new_tokens=20, guided_json=VERDICT)),
            GenerationRequest("planner", ask, SamplingConfig(max_new_tokens=8)),
            GenerationRequest("primitive", [{"role": "user", "content": "ls"}],
                              SamplingConfig(max_new_tokens=20, guided_json=CALL)),
            GenerationRequest("router", ask, SamplingConfig(max_new_tokens=12))]


@pytest.fixture(scope="module")
def tiny_adapters(tiny_qwen3_path, tmp_path_factory):
    from test_hf_backend import make_lora_adapters

    return make_lora_adapters(tiny_qwen3_path, tmp_path_factory.mktemp("adapters"), ROLES)


@pytest.mark.slow
def test_a_mixed_batch_with_per_row_grammars_equals_single_calls(tiny_adapters):
    from heart.runtime.hf import TransformersBackend

    backend = TransformersBackend("tiny-qwen3", adapters=tiny_adapters)
    requests = _requests()
    batch = backend.generate_batch(requests)
    single = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    assert [g.text for g in batch] == [g.text for g in single]
    assert [g.adapter for g in batch] == [r.role for r in requests]
    assert json.loads(batch[0].text)["status"] in ("PASS", "FAIL")  # the grammar held in the batch
    assert json.loads(batch[2].text) == {"tool": "ls"}
    assert all(g.meta.get("batch_size") == 4 for g in batch)


@pytest.mark.slow
def test_concurrent_episodes_through_the_scheduler_get_their_own_answers(tiny_adapters):
    from heart.runtime.hf import TransformersBackend
    from heart.runtime.scheduler import BatchingBackend

    inner = TransformersBackend("tiny-qwen3", adapters=tiny_adapters)
    requests = _requests()
    expected = [inner.generate(r.role, r.messages, r.sampling).text for r in requests]
    backend = BatchingBackend(inner, max_batch_size=4, max_wait_s=5.0)
    everyone = threading.Barrier(4)

    def client(r):
        with backend.client():
            everyone.wait()
            return backend.generate(r.role, r.messages, r.sampling).text

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(client, requests)) == expected
    assert backend.stats().batch_sizes == {4: 1}
    backend.close()


@pytest.mark.slow
def test_int8_base_keeps_the_lora_exact_and_serves_mixed_batches(tiny_adapters):
    import torch

    from heart.runtime.hf import TransformersBackend

    backend = TransformersBackend("tiny-qwen3", adapters=tiny_adapters, quantize="int8")
    assert backend.name.endswith("+int8")
    lora_layer = backend.model.base_model.model.model.layers[0].self_attn.q_proj
    assert not isinstance(lora_layer.base_layer, torch.nn.Linear)  # the base weight is int8
    assert lora_layer.lora_A["planner"].weight.dtype == torch.float32  # the role's LoRA is not
    batch = backend.generate_batch(_requests())
    assert [g.adapter for g in batch] == [r.role for r in _requests()]
    assert json.loads(batch[2].text) == {"tool": "ls"}


VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_VENV.is_file(), reason="no .venv-vllm (scripts/setup_vllm.sh)")
def test_parity_peft_vs_vllm_for_all_four_roles(smollm2_path, tmp_path):
    from test_hf_backend import make_lora_adapters

    from heart.runtime.parity import check_parity

    # lora_B large enough that every adapter changes the answers: parity is then a real test
    # of vLLM applying each role's LoRA, not of the base agreeing with itself.
    make_lora_adapters(smollm2_path, tmp_path, ROLES, scale=0.3)
    report = check_parity("smollm2-135m", str(tmp_path), ["vllm"], max_new_tokens=8)
    roles = report["engines"]["vllm"]["roles"]
    assert sorted(roles) == sorted(ROLES)
    assert not report["adapter_answers_differing_from_base"].startswith("0/")
    assert report["passed"], json.dumps(roles, indent=1)


@pytest.mark.slow
def test_the_unadapted_view_shares_the_model_and_answers_as_the_bare_base(tiny_adapters):
    """eval e2e --base-out: the base side's calls batch with the distilled side's on one model,
    and each is answered as if the other side did not exist."""
    from heart_distill.eval.models import UnadaptedView
    from heart.runtime.hf import TransformersBackend
    from heart.runtime.scheduler import BatchingBackend

    requests = _requests()
    bare = TransformersBackend("tiny-qwen3")
    base_expected = [bare.generate(r.role, r.messages, r.sampling).text for r in requests]
    inner = TransformersBackend("tiny-qwen3", adapters=tiny_adapters)
    adapted_expected = [inner.generate(r.role, r.messages, r.sampling).text for r in requests]
    shared = BatchingBackend(inner, max_batch_size=8, max_wait_s=5.0)
    sides = [UnadaptedView(shared)] * 4 + [shared] * 4
    everyone = threading.Barrier(8)

    def client(i):
        backend, r = sides[i], requests[i % 4]
        with backend.client():
            everyone.wait()
            return backend.generate(r.role, r.messages, r.sampling)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(client, range(8)))
    assert [g.text for g in answers[:4]] == base_expected
    assert [g.adapter for g in answers[:4]] == [None] * 4
    assert [g.text for g in answers[4:]] == adapted_expected
    assert [g.adapter for g in answers[4:]] == [r.role for r in requests]
    assert shared.stats().batch_sizes == {8: 1}  # one mixed batch served both sides
    shared.close()


@pytest.mark.slow
def test_continuous_decoding_equals_generate_while_rows_join_and_leave(tiny_adapters):
    """Rows of different budgets, adapters and grammars through a batch of 2: each row joins as
    another leaves, and every answer is token for token what ``generate`` gives."""
    from heart.runtime.hf import TransformersBackend

    backend = TransformersBackend("tiny-qwen3", adapters=tiny_adapters, max_batch_size=2)
    requests = _requests() + _requests()[::-1]
    continuous = backend.generate_batch(requests)
    stats = backend.last_decode_stats
    backend.decoding = "generate"
    reference = backend.generate_batch(requests)
    assert [g.text for g in continuous] == [g.text for g in reference]
    assert [g.completion_tokens for g in continuous] == [g.completion_tokens for g in reference]
    assert [g.adapter for g in continuous] == [r.role for r in requests]
    assert stats.max_running == 2 and stats.prefills >= 4  # later rows joined a running batch
    # The decoder never ran a finished row: its work is the rows' own tokens, not 2 x the longest.
    assert stats.row_steps <= sum(g.completion_tokens for g in continuous)


@pytest.mark.slow
def test_a_call_joins_the_running_batch_without_waiting_for_its_longest_answer(tiny_adapters):
    """Through the scheduler, an episode whose answer is short sends its next call and gets
    it answered while another episode's long answer is still decoding."""
    from heart.runtime.hf import TransformersBackend
    from heart.runtime.scheduler import BatchingBackend

    inner = TransformersBackend("tiny-qwen3", adapters=tiny_adapters)
    ask = [{"role": "user", "content": "List the files, then open the largest."}]
    long_call = GenerationRequest("planner", ask, SamplingConfig(max_new_tokens=48))
    short_calls = [GenerationRequest("primitive", [{"role": "user", "content": "ls"}],
                                     SamplingConfig(max_new_tokens=20, guided_json=CALL))] * 3
    expected_long = inner.generate(long_call.role, long_call.messages, long_call.sampling)
    assert expected_long.completion_tokens == 48  # long enough to outlast the short calls
    backend = BatchingBackend(inner, max_batch_size=4, max_wait_s=5.0)
    finished: dict[str, float] = {}
    everyone = threading.Barrier(2)

    def long_episode():
        with backend.client():
            everyone.wait()
            text = backend.generate(long_call.role, long_call.messages, long_call.sampling).text
            finished["long"] = time.monotonic()
            return [text]

    def short_episode():
        with backend.client():
            everyone.wait()
            texts = [backend.generate(r.role, r.messages, r.sampling).text for r in short_calls]
            finished["short"] = time.monotonic()
            return texts

    with ThreadPoolExecutor(2) as pool:
        long_texts, short_texts = pool.submit(long_episode), pool.submit(short_episode)
        assert long_texts.result() == [expected_long.text]
        assert [json.loads(t) for t in short_texts.result()] == [{"tool": "ls"}] * 3
    assert finished["short"] < finished["long"]  # three calls in sequence, inside one long answer
    backend.close()


@pytest.mark.slow
def test_a_shared_system_prompt_is_prefilled_once_per_adapter_and_answers_do_not_change(tiny_adapters):
    from heart.runtime.hf import TransformersBackend

    system = {"role": "system", "content": "You are the HEART harness's role model. " * 8}
    requests = [GenerationRequest(role, [system, {"role": "user", "content": f"Task {i}: list the files."}],
                                  SamplingConfig(max_new_tokens=10 + 3 * i))
                for i, role in enumerate(["planner", "router", "planner", "base", "router", "base"])]
    backend = TransformersBackend("tiny-qwen3", adapters=tiny_adapters, max_batch_size=3)
    reused = backend.generate_batch(requests)
    stats = backend.last_decode_stats
    assert len(backend._prefix_cache) == 3  # planner, router and the bare base: one prefix each
    prefix = next(iter(backend._prefix_cache.values()))[0][0].shape[-2]
    assert stats.prefix_tokens_reused == prefix * len(requests)
    backend.reuse_prefixes = False
    assert [g.text for g in backend.generate_batch(requests)] == [g.text for g in reused]
    assert backend.last_decode_stats.prefix_tokens_reused == 0
    backend.decoding = "generate"
    assert [g.text for g in backend.generate_batch(requests)] == [g.text for g in reused]
