"""The llama.cpp engine against the peft reference, on the embedded SmolLM2 (its GGUF).

Four seeded random LoRA adapters (q/k/v/o, lora_B scaled so each visibly changes the
answers) are converted by llama.cpp's own converter and served from one GGUF base; greedy
answers must equal transformers + peft token for token at fp32 weights, one call at a time,
in mixed-role continuous batches, through the scheduler, with shared system prompts, and
with drafts from the context verified in one call (speculative decoding).
"""

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from heart import ROLES
from heart.runtime.base import GenerationRequest, SamplingConfig

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by scripts/setup.sh")
# Under pytest-xdist each worker has one core (tests/conftest.py sets OMP_NUM_THREADS=1): llama.cpp's
# threads spin while they wait, so two of them beside the other worker's job stall (measured: a
# 1.6 s test took 112 s). Same answers on any thread count; None is the engine's default (every CPU).
THREADS = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS") else None

SYSTEM = "You are the Planner of a tool-using agent. Answer with one JSON object and nothing else. " * 3
VERDICT = json.dumps({"type": "object", "properties": {"status": {"enum": ["PASS", "FAIL"]}, "step": {"enum": [1, 2]}},
                      "required": ["status", "step"], "additionalProperties": False})


def _requests():
    ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files, then open the largest."}]
    other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Book a table for two tonight."}]
    return [GenerationRequest("verifier", ask, SamplingConfig(max_new_tokens=40, guided_json=VERDICT)),
            GenerationRequest("planner", ask, SamplingConfig(max_new_tokens=10)),
            GenerationRequest("planner", other, SamplingConfig(max_new_tokens=14)),
            GenerationRequest("router", other, SamplingConfig(max_new_tokens=6)),
            GenerationRequest("base", ask, SamplingConfig(max_new_tokens=8))]


@pytest.fixture(scope="module")
def adapters(smollm2_path, tmp_path_factory):
    from test_hf_backend import make_lora_adapters

    return make_lora_adapters(smollm2_path, tmp_path_factory.mktemp("adapters"), ROLES, scale=0.3)


@pytest.fixture(scope="module")
def reference(adapters):
    """peft's greedy answers, one call at a time."""
    from heart.runtime.hf import TransformersBackend

    peft = TransformersBackend("smollm2-135m", adapters=adapters)
    requests = _requests()
    answers = [peft.generate(r.role, r.messages, r.sampling) for r in requests]
    bare = [peft.generate("base", r.messages, r.sampling).text for r in requests[:4]]
    # The adapters must change the answers, or agreeing with peft proves nothing about them.
    assert sum(a.text != b for a, b in zip(answers, bare)) >= 3
    return answers


@pytest.fixture(scope="module")
def backend(adapters):
    from heart.runtime.llamacpp import LlamaCppBackend

    return LlamaCppBackend("smollm2-135m", adapters=adapters, max_batch_size=4, threads=THREADS)


@pytest.mark.slow
def test_one_call_at_a_time_equals_peft_token_for_token(backend, reference):
    requests = _requests()
    got = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
    assert [g.text for g in got] == [g.text for g in reference]
    assert [g.adapter for g in got] == ["verifier", "planner", "planner", "router", None]
    assert [g.completion_tokens for g in got] == [g.completion_tokens for g in reference]
    assert json.loads(got[0].text)["status"] in ("PASS", "FAIL")  # the grammar held
    assert got[0].backend == "llamacpp:smollm2-135m+f32"


@pytest.mark.slow
def test_mixed_roles_in_one_continuous_batch_equal_peft(backend, reference):
    before = backend.stats.prefix_tokens_reused
    got = backend.generate_batch(_requests())
    assert [g.text for g in got] == [g.text for g in reference]
    # Every call starts with the same system prompt: after the first calls of each role it
    # is never computed again.
    assert backend.stats.prefix_tokens_reused - before >= 5 * 20


@pytest.mark.slow
def test_calls_prefilled_together_compute_their_common_prefix_once(adapters, reference):
    from heart.runtime.llamacpp import LlamaCppBackend

    fresh = LlamaCppBackend("smollm2-135m", adapters=adapters, max_batch_size=2, threads=THREADS)
    first, second = _requests()[1:3]  # two planner calls, same system prompt, different requests
    got = fresh.generate_batch([first, second])  # prefilled together
    a, b = fresh.chat.encode(first.messages), fresh.chat.encode(second.messages)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    # the system prompt and the user turn's opening tokens, computed for the first call only
    assert common > fresh.chat.system_prefix_len(first.messages, a) > 20
    assert fresh.stats.prefix_tokens_reused == common
    assert [g.text for g in got] == [g.text for g in reference[1:3]]


@pytest.mark.slow
def test_rows_joining_freed_slots_decode_in_slot_order_to_peft_answers(adapters, reference, monkeypatch):
    """Six planner calls through three slots: rows leave at different steps and waiting ones take
    the freed slots (copying their prefix from wherever it is cached); every decoding call feeds
    its rows by increasing slot (llama.cpp's one micro-batch per run), one token each, and the
    answers stay peft's."""
    from heart.runtime.llamacpp import LlamaCppBackend, RoleContext

    fed: list[list[int]] = []
    decode = RoleContext.decode

    def recording(self, entries):
        fed.append([slot for _, slot, _ in entries])
        decode(self, entries)

    monkeypatch.setattr(RoleContext, "decode", recording)
    fresh = LlamaCppBackend("smollm2-135m", adapters=adapters, max_batch_size=3, threads=THREADS)
    long_, short = _requests()[2], _requests()[1]  # 14 and 10 new tokens
    got = fresh.generate_batch([long_, short, long_, short, long_, short])
    assert [g.text for g in got] == [reference[2].text, reference[1].text] * 3
    steps = [slots for slots in fed if len(set(slots)) > 1]  # calls with several rows (prefill: one row a call)
    assert steps and all(slots == sorted(slots) for slots in steps)
    assert all(len(slots) == len(set(slots)) for slots in steps)  # no row drafts beside others (DRAFT_ROWS)
    assert fresh.stats.prefix_tokens_reused > 0


@pytest.mark.slow
def test_concurrent_clients_through_the_scheduler_get_peft_answers(backend, reference):
    from heart.runtime.scheduler import BatchingBackend

    scheduler = BatchingBackend(backend, max_batch_size=5, max_wait_s=5.0)
    everyone = threading.Barrier(5)

    def client(r):
        with scheduler.client():
            everyone.wait()
            return scheduler.generate(r.role, r.messages, r.sampling).text

    with ThreadPoolExecutor(5) as pool:
        assert list(pool.map(client, _requests())) == [g.text for g in reference]
    scheduler.close()


@pytest.mark.slow
def test_drafting_from_the_context_keeps_every_greedy_answer(adapters, reference):
    from heart.runtime.llamacpp import LlamaCppBackend

    copy = [{"role": "system", "content": "Repeat the user's message exactly."},
            {"role": "user", "content": "alpha beta gamma delta, alpha beta gamma delta, alpha beta gamma delta"}]
    requests = _requests() + [GenerationRequest("base", copy, SamplingConfig(max_new_tokens=24))]
    plain = LlamaCppBackend("smollm2-135m", adapters=adapters, max_batch_size=1, draft_tokens=0, threads=THREADS)
    drafting = LlamaCppBackend("smollm2-135m", adapters=adapters, max_batch_size=1, draft_tokens=4,
                               threads=THREADS)
    want = [plain.generate(r.role, r.messages, r.sampling).text for r in requests]
    got = [drafting.generate(r.role, r.messages, r.sampling).text for r in requests]
    assert got == want
    assert got[:5] == [r.text for r in reference]
    assert plain.stats.drafted == 0
    # drafts were fed and some kept: the same answers in fewer decoding calls
    assert 0 < drafting.stats.accepted <= drafting.stats.drafted
    assert drafting.stats.steps < plain.stats.steps


@pytest.mark.slow
def test_an_over_long_prompt_is_a_recorded_failure_not_a_crash(adapters):
    from heart.runtime.llamacpp import LlamaCppBackend

    small = LlamaCppBackend("smollm2-135m", adapters=adapters, slot_tokens=64, threads=THREADS)
    long, short = (GenerationRequest("planner", [{"role": "user", "content": "word " * n}], SamplingConfig(max_new_tokens=4))
                   for n in (200, 5))
    got = small.generate_batch([long, short])
    assert got[0].text == "" and "does not fit a slot of 64 tokens" in got[0].meta["error"]
    assert got[1].completion_tokens > 0 and "error" not in got[1].meta


@pytest.mark.slow
def test_sampling_is_seeded(backend):
    ask = [{"role": "user", "content": "Name a colour."}]
    sampled = [backend.generate("planner", ask, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=s)).text
               for s in (7, 7, 8, 9)]
    assert sampled[0] == sampled[1]  # the same seed, the same answer
    assert len(set(sampled[1:])) >= 2  # other seeds, other answers: it does sample


def test_a_model_without_a_gguf_is_refused_with_its_name():
    from heart.runtime.gguf_files import base_gguf

    with pytest.raises(ValueError, match="'tiny-qwen3' is neither the embedded smollm2-135m"):
        base_gguf("tiny-qwen3")
    with pytest.raises(ValueError, match="weights must be one of"):
        base_gguf("smollm2-135m", "int3")


def test_an_adapter_for_another_base_is_refused_before_anything_loads(tiny_qwen3_path, tmp_path):
    from test_hf_backend import make_lora_adapters

    from heart.models import model_content_hash
    from heart.runtime.adapters import AdapterRefused
    from heart.runtime.llamacpp import LlamaCppBackend

    other = make_lora_adapters(tiny_qwen3_path, tmp_path, ["planner"])
    manifest = {"role": "planner", "base_model": {"name": "tiny-qwen3", "content_hash": model_content_hash(tiny_qwen3_path)}}
    (tmp_path / "planner" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AdapterRefused, match="trained on base 'tiny-qwen3'.*serving base is 'smollm2-135m'"):
        LlamaCppBackend("smollm2-135m", adapters=other)


def test_first_token_logprobs_match_peft_and_need_single_tokens(adapters, backend):
    """A yes/no judge's confidence without a second pass: the log-probabilities of named tokens at
    the answer's first position, as peft computes them (fp32 on both sides), the generate path too."""
    from heart.runtime.hf import TransformersBackend

    ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is the sky green? Answer true or false."},
           {"role": "assistant", "content": '{"answer":'}]
    tokens = (" true", " false", "true", "false")
    scored = SamplingConfig(max_new_tokens=3, first_token_logprobs=tokens)
    llama = backend.generate("verifier", ask, scored).meta["first_token_logprobs"]
    peft = TransformersBackend("smollm2-135m", adapters=adapters)
    continuous = peft.generate("verifier", ask, scored).meta["first_token_logprobs"]
    peft.decoding = "generate"
    generated = peft.generate("verifier", ask, scored).meta["first_token_logprobs"]
    assert set(llama) == set(continuous) == set(generated) == set(tokens)
    for text in tokens:
        assert llama[text] < 0 and abs(llama[text] - continuous[text]) < 1e-2 and abs(generated[text] - continuous[text]) < 1e-4
    assert "first_token_logprobs" not in backend.generate("verifier", ask, SamplingConfig(max_new_tokens=3)).meta
    with pytest.raises(ValueError, match="'not one token' is"):
        backend.generate("verifier", ask, SamplingConfig(max_new_tokens=3, first_token_logprobs=("not one token",)))
