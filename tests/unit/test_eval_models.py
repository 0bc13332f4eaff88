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


def _adapters_trained_on(folder, **modes):
    import json

    for role, counts in modes.items():
        (folder / role).mkdir(parents=True)
        (folder / role / "adapter_config.json").write_text("{}")
        (folder / role / "manifest.json").write_text(json.dumps({"role": role, "dataset": {"input_modes": counts}}))
    return folder


def test_an_adapter_trained_in_step_mode_and_served_in_plan_mode_is_refused(tmp_path, capsys):
    from heart_distill.eval.e2e import main
    from heart_distill.eval.models import check_served_modes, resolve_role_models
    from heart.settings import LoopConfig

    adapters = _adapters_trained_on(tmp_path / "adapters", router={"step": 40, "plan": 0},
                                    planner={"subgoals": 30, "plan": 0})
    models = resolve_role_models(str(adapters))
    check_served_modes(models, LoopConfig(router_mode="step", planner_form="subgoals"))  # as trained: served
    # refused before any model loads or episode runs, naming the role, the modes and the flag
    assert main(["--env", "bfcl", "--roles", str(adapters), "--router-mode", "plan", "--planner-form", "subgoals",
                 "--out", str(tmp_path / "e2e")]) == 2
    err = capsys.readouterr().err
    assert "the router adapter" in err and "trained on step inputs only" in err and "--router-mode step" in err
    assert not (tmp_path / "e2e").exists()
    assert main(["--env", "bfcl", "--roles", str(adapters), "--router-mode", "step",
                 "--out", str(tmp_path / "e2e")]) == 2
    err = capsys.readouterr().err
    assert "the planner adapter" in err and "--planner-form subgoals" in err
    with pytest.raises(ValueError, match="--planner-form subgoals"):
        check_served_modes(models, LoopConfig(router_mode="step"))


def test_a_joint_adapter_serves_every_role_it_trained_on_with_that_roles_modes(tmp_path):
    import json

    from heart.settings import LoopConfig
    from heart_distill.eval.models import check_served_modes, resolve_role_models

    adapters = _adapters_trained_on(tmp_path / "adapters", verifier={"step": 5, "attempt": 0})  # its own wins
    (adapters / "joint").mkdir()
    (adapters / "joint" / "adapter_config.json").write_text("{}")
    (adapters / "joint" / "manifest.json").write_text(json.dumps({
        "role": "joint", "roles": ["planner", "router", "verifier"], "system_prompt": "short",
        "base_model": {"name": "smollm2-135m"},
        "dataset": {"input_modes": {"planner": {"plan": 9, "subgoals": 0}, "router": {"step": 0, "plan": 7},
                                    "verifier": {"step": 3, "attempt": 0}}}}))
    models = resolve_role_models(str(adapters))
    assert models.adapters == {"planner": str(adapters / "joint"), "router": str(adapters / "joint"),
                               "verifier": str(adapters / "verifier")}
    assert set(models.short_prompts) == {"planner", "router"}
    check_served_modes(models, LoopConfig(router_mode="plan"))
    with pytest.raises(ValueError, match="the router adapter .* trained on plan inputs only"):
        check_served_modes(models, LoopConfig(router_mode="step"))
