"""Marked training templates render exactly what the models' own templates render."""

import pytest
from transformers import AutoTokenizer

from heart_distill.train.templates import UnknownChatTemplate, template_for, template_path

SYSTEM = {"role": "system", "content": "You are the Planner.\nAnswer with JSON."}
CONVERSATIONS = [
    [SYSTEM, {"role": "user", "content": "Plan: weather in Paris"},
     {"role": "assistant", "content": '{"status": "SUFFICIENT", "plan": [{"step": 1, "tool": "get_weather"}]}'}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c ünïcode ✓"}, {"role": "assistant", "content": '{"verdict": "PASS"}\n'}],
    [SYSTEM, {"role": "user", "content": "only a question"}],
    [{"role": "user", "content": "  spaces and\n\nnewlines  "}],
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def render(tokenizer, messages, template=None, **kwargs):
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_smollm2_marked_template_is_byte_identical(smollm2_tokenizer, messages, add_generation_prompt):
    marked = template_for(smollm2_tokenizer)
    assert "{% generation %}" in marked
    assert render(smollm2_tokenizer, messages, marked, add_generation_prompt=add_generation_prompt) == \
        render(smollm2_tokenizer, messages, add_generation_prompt=add_generation_prompt)


def test_qwen3_template_is_trls_training_template():
    import trl.chat_template_utils as ctu

    assert template_path("qwen3.jinja").read_text() == ctu.qwen3_training_chat_template


@pytest.mark.parametrize("messages", [c for c in CONVERSATIONS if sum(m["role"] == "user" for m in c) == 1])
@pytest.mark.parametrize("kwargs", [{}, {"add_generation_prompt": True}, {"add_generation_prompt": True,
                                                                          "enable_thinking": False}])
def test_qwen3_identical_for_single_query_conversations(qwen3_tokenizer, messages, kwargs):
    marked = template_for(qwen3_tokenizer)
    assert render(qwen3_tokenizer, messages, marked, **kwargs) == render(qwen3_tokenizer, messages, **kwargs)


def test_qwen3_documented_difference_earlier_assistant_turn_gets_empty_think(qwen3_tokenizer):
    """The one difference: an assistant turn before the last user query keeps an empty think block."""
    messages = CONVERSATIONS[2]
    original = render(qwen3_tokenizer, messages)
    marked = render(qwen3_tokenizer, messages, template_for(qwen3_tokenizer))
    assert marked == original.replace("<|im_start|>assistant\nb", "<|im_start|>assistant\n<think>\n\n</think>\n\nb")


def test_qwen3_recognises_trls_stored_revision(qwen3_tokenizer):
    import trl.chat_template_utils as ctu

    qwen3_tokenizer.chat_template, original = ctu.qwen3_chat_template, qwen3_tokenizer.chat_template
    try:
        assert template_for(qwen3_tokenizer) == template_path("qwen3.jinja").read_text()
    finally:
        qwen3_tokenizer.chat_template = original


def test_unknown_template_is_refused(smollm2_tokenizer):
    original = smollm2_tokenizer.chat_template
    smollm2_tokenizer.chat_template = original.replace("helpful", "useful")
    try:
        with pytest.raises(UnknownChatTemplate, match="KNOWN_TEMPLATES"):
            template_for(smollm2_tokenizer)
    finally:
        smollm2_tokenizer.chat_template = original
