"""Loss-mask lint: the tokens a role adapter trains on are exactly what the assistant writes.

With ``assistant_only_loss=True`` TRL trains on the tokens the chat template's
``{% generation %}`` markers cover. A marker in the wrong place trains the model on the
system prompt or the user's input, or never teaches it to stop — and the loss still falls.
This lint renders examples with ``return_assistant_tokens_mask=True`` and compares the mask
with what it must be:

- masked in: each assistant turn's content and its end-of-turn token (what the model
  generates after the generation prompt, up to and including the EOS token);
- allowed but not required: whitespace after the end-of-turn token inside the same turn
  (TRL's Qwen3 training template marks the ``\\n`` after ``<|im_end|>``), counted in the report;
- masked out: everything else (system, user, the assistant header / generation prompt).

    report = lint_loss_mask(tokenizer, template, dataset["train"].select(range(16)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


class LossMaskError(ValueError):
    """The chat template's generation markers do not cover exactly the assistant's output."""


@dataclass
class LintReport:
    examples: int = 0
    tokens: int = 0
    """All tokens of the rendered examples."""
    masked_tokens: int = 0
    """Tokens the loss is computed on."""
    trailing_tokens: int = 0
    """Masked whitespace tokens after an end-of-turn token (allowed)."""

    def __str__(self) -> str:
        share = self.masked_tokens / self.tokens if self.tokens else 0.0
        return (f"loss mask ok: {self.examples} examples, {self.masked_tokens}/{self.tokens} tokens "
                f"trained ({share:.1%}), {self.trailing_tokens} trailing whitespace tokens")


def _render(tokenizer, template: str, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def _expected_spans(tokenizer, template: str, messages: list[dict[str, str]], full: str, name: str):
    """Char spans (required_start, required_end, allowed_end) of each assistant turn's output."""
    eot = tokenizer.eos_token
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, template, messages[:i], add_generation_prompt=True)
        upto = _render(tokenizer, template, messages[: i + 1])
        if not upto.startswith(prompt) or not full.startswith(upto):
            raise LossMaskError(
                f"example {name}: the template is not prefix-preserving at message {i} (rendering the "
                "conversation up to this turn is not a prefix of the whole), so the mask cannot be checked")
        body = upto[len(prompt):]
        end = body.rfind(eot)
        if end < 0 or body[end + len(eot):].strip():
            raise LossMaskError(f"example {name}: assistant turn {i} does not end with the end-of-turn "
                                f"token {eot!r}: {body[-40:]!r}")
        spans.append((len(prompt), len(prompt) + end + len(eot), len(upto)))
    return spans


def _region(tokenizer, template: str, messages: list[dict[str, str]], char: int) -> str:
    """Which message's rendering a character of the full text belongs to."""
    for i in range(len(messages)):
        if char < len(_render(tokenizer, template, messages[: i + 1])):
            role = messages[i]["role"]
            return f"{role} turn" if role != "assistant" else "assistant header (generation prompt)"
    return "text after the last message"


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


def lint_example(tokenizer, template: str, messages: list[dict[str, str]], name: str) -> tuple[int, int, int]:
    """Check one conversation; returns (tokens, masked tokens, trailing tokens) or raises LossMaskError."""
    out = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    full = _render(tokenizer, template, messages)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    if list(encoded["input_ids"]) != ids:
        raise LossMaskError(f"example {name}: the rendered text does not re-tokenize to the same ids")
    spans = _expected_spans(tokenizer, template, messages, full, name)
    offsets = encoded["offset_mapping"]
    wrong_in, missing, trailing = [], [], 0
    for index, ((start, end), masked) in enumerate(zip(offsets, mask)):
        required = any(s <= start and end <= e for s, e, _ in spans)
        allowed = any(s <= start and end <= a for s, _, a in spans)
        if masked and not allowed:
            wrong_in.append(index)
        elif masked and not required:
            trailing += 1
        elif required and not masked:
            missing.append(index)

    def describe(indices: list[int]) -> str:
        first, last = _runs(indices)[0]
        start, end = offsets[first][0], offsets[last][1]
        return (f"tokens {first}-{last} {full[start:end][:80]!r} "
                f"(in the {_region(tokenizer, template, messages, start)})")

    if wrong_in:
        raise LossMaskError(f"example {name}: {len(wrong_in)} token(s) outside the assistant's output are masked "
                            f"in (the model would be trained on them), first span: {describe(wrong_in)}")
    if missing:
        what = "the end-of-turn token" if all(ids[i] == tokenizer.eos_token_id for i in missing) else "assistant output"
        raise LossMaskError(f"example {name}: {len(missing)} token(s) of {what} are not masked in, first span: "
                            f"{describe(missing)}")
    return len(ids), sum(mask), trailing


def lint_loss_mask(tokenizer, template: str, examples: Iterable[dict[str, Any]]) -> LintReport:
    """Lint examples (rows with ``messages``, optionally ``episode_id``); raise LossMaskError on the first bad one."""
    report = LintReport()
    for index, example in enumerate(examples):
        name = f"#{index}" + (f" (episode {example['episode_id']})" if example.get("episode_id") else "")
        tokens, masked, trailing = lint_example(tokenizer, template, example["messages"], name)
        report.examples += 1
        report.tokens += tokens
        report.masked_tokens += masked
        report.trailing_tokens += trailing
    return report
