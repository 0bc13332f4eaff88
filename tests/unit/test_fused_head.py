"""train.sft.score_labelled_positions_only: TRL's fused LM head projects only labelled
positions on a CPU too, with the same loss and gradients as projecting every position."""

import pytest


@pytest.fixture
def restore_trl():
    from heart_distill.train.sft import score_labelled_positions_only

    yield
    score_labelled_positions_only(False)


def _loss_and_grad(model, input_ids, labels):
    model.zero_grad()
    out = model(input_ids=input_ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    grad = model.get_input_embeddings().weight.grad.clone()
    return out.loss.detach(), out.log_probs.detach(), grad


def test_labelled_positions_only_gives_the_same_loss_and_gradients(tiny_qwen3_path, restore_trl, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer import utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    from heart_distill.train.sft import score_labelled_positions_only

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32)
    add_fused_lm_head(model)
    input_ids = torch.randint(0, 1000, (1, 24))
    labels = input_ids.clone()
    labels[:, :16] = -100  # a prompt of 16 tokens, an assistant turn of 8

    projected = []  # rows of hidden states sent through the LM head
    apply = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                        lambda hidden, *rest: (projected.append(hidden.shape[0]), apply(hidden, *rest))[1])
    score_labelled_positions_only(False)
    assert not trl_utils._use_triton(torch.device("cpu"))  # TRL's own choice on a CPU: every position
    full = _loss_and_grad(model, input_ids, labels)
    score_labelled_positions_only(True)
    assert trl_utils._use_triton(torch.device("cpu"))
    compact = _loss_and_grad(model, input_ids, labels)
    torch.testing.assert_close(compact[0], full[0])
    torch.testing.assert_close(compact[1], full[1])
    torch.testing.assert_close(compact[2], full[2])
    assert projected == [23, 8]  # every shifted position, then only the 8 labelled ones
