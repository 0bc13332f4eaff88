"""eval.models: building the backend for ``--roles`` does each costly check once.

One backend build resolves its base once (an embedded name becomes its prepared folder),
validates the role adapters against that base once (the base's linear layers are read from
its config on the meta device: one model construction), and loads the chat format (the
tokenizer) once.
"""

from __future__ import annotations

from collections import Counter

import pytest


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory, tiny_qwen3_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("adapters")
    for role in ("planner", "router"):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_path),
                               LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], task_type="CAUSAL_LM"))
        model.save_pretrained(folder / role)
    return folder


def count_calls(monkeypatch) -> Counter:
    """Counts that do not depend on where an engine imported a function from: resolving an
    embedded name calls its builder in ``heart.models.EMBEDDED``; validating the adapters reads
    the base's linear layers once and checks each adapter; every chat format is constructed."""
    import heart.models
    import heart.runtime.adapters
    import heart.runtime.chat

    calls: Counter = Counter()

    def counted(original, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setitem(heart.models.EMBEDDED, "tiny-qwen3", counted(heart.models.EMBEDDED["tiny-qwen3"], "resolve"))
    for name in ("base_linear_modules", "validate_adapter"):
        monkeypatch.setattr(heart.runtime.adapters, name, counted(getattr(heart.runtime.adapters, name), name))
    original_init = heart.runtime.chat.ChatFormat.__init__

    def chat_init(self, *args, **kwargs):
        calls["chat_format"] += 1
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(heart.runtime.chat.ChatFormat, "__init__", chat_init)
    return calls


def test_one_backend_resolves_validates_and_loads_its_chat_format_once(adapters_dir, monkeypatch):
    from heart_distill.eval.models import resolve_role_models, shared_backend

    models = resolve_role_models(str(adapters_dir), "tiny-qwen3")
    assert models.model == "tiny-qwen3" and sorted(models.adapters) == ["planner", "router"]
    calls = count_calls(monkeypatch)
    backend = shared_backend(models)
    assert backend.roles_with_adapters() == ["planner", "router"]
    assert calls == Counter(resolve=1, base_linear_modules=1, validate_adapter=2, chat_format=1)


def test_sides_sharing_one_model_build_it_once(adapters_dir, monkeypatch):
    from heart_distill.eval.models import UnadaptedView, resolve_role_models, shared_backends

    sides = [resolve_role_models(str(adapters_dir), "tiny-qwen3"), resolve_role_models("base", "tiny-qwen3")]
    calls = count_calls(monkeypatch)
    distilled, base = shared_backends(sides, max_batch_size=4)
    assert isinstance(base, UnadaptedView) and base.backend is distilled
    assert calls == Counter(resolve=1, base_linear_modules=1, validate_adapter=2, chat_format=1)
    distilled.close()
