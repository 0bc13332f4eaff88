"""The loss-mask lint accepts the marked templates and rejects misplaced markers loudly."""

import pytest
from transformers import AutoTokenizer

from heart_distill.data.loss_mask import LossMaskError, lint_loss_mask
from heart_distill.train.synthetic import synthetic_rows
from heart_distill.train.templates import template_for


@pytest.fixture(scope="module", params=["smollm2", "qwen3"])
def tokenizer(request, smollm2_path, tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(smollm2_path if request.param == "smollm2" else tiny_qwen3_path)


@pytest.mark.parametrize("role", ["planner", "router", "primitive", "verifier"])
def test_marked_templates_pass(tokenizer, role):
    rows = synthetic_rows(role, 3, 0, 0)
    report = lint_loss_mask(tokenizer, template_for(tokenizer), rows)
    assert report.examples == 3 and 0 < report.masked_tokens < report.tokens
    # SmolLM2's markers end at <|im_end|>; TRL's Qwen3 template also takes the "\n" after it.
    assert report.trailing_tokens == (0 if "SmolLM" in tokenizer.chat_template else 3)


def test_multi_turn_passes(tokenizer):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
                {"role": "assistant", "content": "a2"}]
    assert lint_loss_mask(tokenizer, template_for(tokenizer), [{"messages": messages}]).examples == 1


def test_user_turn_marked_fails(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    wrong = template_for(tokenizer).replace(
        "{% else %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}",
        "{% else %}{{'<|im_start|>' + message['role'] + '\\n'}}{% generation %}{{ message['content'] + "
        "'<|im_end|>' + '\\n'}}{% endgeneration %}")
    assert wrong != template_for(tokenizer)
    rows = synthetic_rows("planner", 2, 0, 0)
    rows[0]["episode_id"] = "ep-42"
    with pytest.raises(LossMaskError, match=r"example #0 \(episode ep-42\).*masked in.*in the system turn"):
        lint_loss_mask(tokenizer, wrong, rows)


def test_header_marked_fails(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    wrong = template_for(tokenizer).replace("{{ '<|im_start|>assistant\\n' }}{% generation %}",
                                            "{% generation %}{{ '<|im_start|>assistant\\n' }}")
    with pytest.raises(LossMaskError, match="assistant header"):
        lint_loss_mask(tokenizer, wrong, synthetic_rows("router", 1, 0, 0))


def test_end_of_turn_left_out_fails(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    wrong = template_for(tokenizer).replace("{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
                                            "{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>' }}")
    with pytest.raises(LossMaskError, match="end-of-turn token are not masked in"):
        lint_loss_mask(tokenizer, wrong, synthetic_rows("verifier", 1, 0, 0))


def test_unmarked_template_fails(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    with pytest.raises(LossMaskError, match="assistant output are not masked in"):
        lint_loss_mask(tokenizer, tokenizer.chat_template, synthetic_rows("planner", 1, 0, 0))
