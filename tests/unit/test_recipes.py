"""Every shipped recipe loads against the entry point's dataclasses, so recipes never rot.

The Qwen3-8B recipes are also checked without weights: the model is built from its published
config on the meta device, the recipe's LoRA is applied, and target modules, trainable
parameters and the single-GPU memory estimate are checked.
"""

from pathlib import Path

import pytest
import yaml

from heart_distill.recipes import load_roles
from heart_distill.train.config import Recipe, load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# pipeline recipes (pipeline.yaml, benchmark*.yaml, your-tools.yaml: tests/unit/test_pipeline_stages.py), the
# optimize recipe (tests/unit/test_optimize.py) and the whole-loop benchmark (e2e-benchmark.yaml,
# below) are not role recipes
ROLE_RECIPES = sorted(p for p in RECIPES.glob("*/*.yaml")
                      if p.parent.name != "accelerate" and p.name not in ("roles.yaml", "optimize.yaml")
                      and not p.name.startswith(("pipeline", "benchmark", "e2e-benchmark", "your-tools")))
BENCH_RECIPES = sorted(RECIPES.glob("*/e2e-benchmark*.yaml"))
ROLES_FILES = sorted(RECIPES.glob("*/roles.yaml"))
ACCELERATE = sorted((RECIPES / "accelerate").glob("*.yaml"))


def test_recipes_are_shipped():
    assert {p.parent.name for p in ROLE_RECIPES} == {"smollm2-135m", "qwen3-8b"}
    assert len([p for p in ROLE_RECIPES if "-" not in p.stem]) == 8 and len(ROLES_FILES) == 2
    assert {p.stem for p in ACCELERATE} == {"cpu", "single_gpu", "fsdp", "deepspeed_zero3"}


@pytest.mark.parametrize("path", ROLE_RECIPES + ROLES_FILES + ACCELERATE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_starts_with_its_run_command(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and ("accelerate launch" in first or "python -m heart_distill.train.launch" in first)
    assert str(path.relative_to(RECIPES.parent)) in first or "--recipe recipes/" in first


@pytest.mark.parametrize("path", BENCH_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_whole_loop_benchmark_recipe_loads_and_names_its_command(path):
    from heart_distill.eval.bench_e2e import load_bench

    assert path.read_text().startswith(f"# heart eval bench --recipe {path.relative_to(RECIPES.parent)}")
    config = load_bench(path)
    assert [a.roles for a in config.arms if a.roles not in ("base", "teacher:gold")] and \
        all(Path(RECIPES.parent / a.roles).is_dir() for a in config.arms if a.roles not in ("base", "teacher:gold"))
    assert {c.category for c in config.conditions} >= {"simple", "multiple", "parallel", "parallel_multiple"}


@pytest.mark.parametrize("path", ROLE_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_role_recipe_loads(path):
    recipe = load_recipe(path, check_paths=False)
    assert isinstance(recipe, Recipe)
    role = path.stem.split("-")[0]  # a variant of a role's recipe: primitive-relevance.yaml
    assert recipe.data.role == role
    assert recipe.data.dataset_dir.endswith(f"datasets/{role}")
    assert recipe.output.dir.endswith(f"adapters/{role}")
    assert recipe.lora.r <= recipe.output.max_serving_rank
    if path.parent.name == "smollm2-135m":
        assert (recipe.model.dtype, recipe.sft.bf16, recipe.sft.gradient_checkpointing, recipe.sft.use_cpu) == \
            ("float32", False, False, True)
        assert recipe.lora.r == 8 and (recipe.sft.max_steps > 0 or recipe.data.max_train_examples > 0)  # bounded
    else:
        assert recipe.model.name == "Qwen/Qwen3-8B" and recipe.model.dtype == "bfloat16"
        assert (recipe.lora.r, recipe.lora.alpha, recipe.lora.target_modules) == (16, 32, "all-linear")
        assert recipe.sft.bf16 and recipe.sft.gradient_checkpointing and not recipe.sft.use_cpu


@pytest.mark.parametrize("path", ROLES_FILES, ids=lambda p: p.parent.name)
def test_roles_file(path):
    spec = load_roles(path)
    assert set(spec["roles"]) == {"planner", "router", "primitive", "verifier"}
    assert all(Path(p).is_file() for p in spec["roles"].values())
    assert Path(spec["accelerate_config"]).is_file()


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_config(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(path))  # refuses unknown top-level keys
    options = {o.lstrip("-") for action in launch_command_parser()._actions for o in action.option_strings}
    raw = yaml.safe_load(path.read_text())
    for section in ("fsdp_config", "deepspeed_config"):
        assert set(raw.get(section, {})) <= options, f"{section} keys unknown to accelerate launch"
    if path.stem == "cpu":
        assert config.use_cpu and config.num_processes == 1 and config.mixed_precision == "no"
    else:
        assert config.mixed_precision == "bf16" and not config.use_cpu
    if path.stem == "fsdp":
        assert raw["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Qwen3DecoderLayer"
        assert raw["fsdp_config"]["fsdp_version"] == 2
    if path.stem == "deepspeed_zero3":
        assert raw["deepspeed_config"]["zero_stage"] == 3 and raw["deepspeed_config"]["zero3_save_16bit_model"]


@pytest.fixture(scope="module")
def qwen3_8b_meta():
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, Qwen3Config

    from heart_distill.train.known_configs import QWEN3_8B

    config = Qwen3Config(**{k: v for k, v in QWEN3_8B.items() if k not in ("architectures", "model_type")})
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model


@pytest.mark.parametrize("path", [p for p in ROLE_RECIPES if p.parent.name == "qwen3-8b"], ids=lambda p: p.stem)
def test_qwen3_8b_recipe_on_meta_model(path, qwen3_8b_meta):
    import copy

    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model

    from heart_distill.train.adapter import linear_module_names
    from heart_distill.train.known_configs import QWEN3_8B, lora_parameters, training_memory_gb

    recipe = load_recipe(path, check_paths=False)
    base_params = sum(p.numel() for p in qwen3_8b_meta.parameters())
    assert base_params == 8_190_735_360  # Qwen3-8B: 8.2B with untied embeddings
    with init_empty_weights():
        model = get_peft_model(copy.deepcopy(qwen3_8b_meta), LoraConfig(
            r=recipe.lora.r, lora_alpha=recipe.lora.alpha, lora_dropout=recipe.lora.dropout,
            target_modules=recipe.lora.target_modules, task_type="CAUSAL_LM"))
    targets = set(model.peft_config["default"].target_modules)
    assert targets == linear_module_names(qwen3_8b_meta) == \
        {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable, total = model.get_nb_trainable_parameters()
    expected = lora_parameters(QWEN3_8B, recipe.lora.r)
    assert trainable == expected == 43_646_976
    assert total == base_params + trainable
    memory = training_memory_gb(QWEN3_8B, base_params, trainable, recipe.sft.batch_size, recipe.sft.max_length,
                                recipe.sft.gradient_checkpointing)
    print(f"\n{path.stem}: trainable {trainable:,} / {total:,} ({trainable / total:.2%}); bf16 memory at batch "
          f"{recipe.sft.batch_size} x {recipe.sft.max_length}: " + ", ".join(f"{k} {v:.1f} GB" for k, v in memory.items()))
    assert memory["total"] < 80


def test_qwen3_8b_pipeline_recipe_on_meta_model(qwen3_8b_meta):
    """The GPU pipeline: OpenAI-compatible teacher, the accelerate configs it names, and each role's
    recipe applied through train.sft's own LoRA placement on the meta-device Qwen3-8B."""
    import copy

    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model

    from heart_distill.pipeline import _recipe_files, load_pipeline, stages
    from heart.runtime.openai_compat import parse_teacher_spec
    from heart_distill.train.adapter import linear_module_names, lora_placement
    from heart_distill.train.known_configs import QWEN3_8B, lora_parameters, training_memory_gb

    config, folder = load_pipeline(RECIPES / "qwen3-8b/pipeline.yaml")
    assert config.model == "Qwen/Qwen3-8B" and parse_teacher_spec(config.collect.teacher).kind == "openai"
    assert config.collect.fault_rate == 0  # faults are a gold-teacher option
    header = (RECIPES / "qwen3-8b/pipeline.yaml").read_text()
    assert "accelerate/fsdp.yaml" in header and "accelerate/deepspeed_zero3.yaml" in header
    files = _recipe_files(folder / config.train.recipe, config.train.roles)
    assert files[-1].name == "single_gpu.yaml" and all(f.is_file() for f in files)
    train_stage = next(s for s in stages(config, folder) if s.name == "train")
    (command,) = train_stage.commands  # every role in one training process, {role} per recipe
    assert "planner,router,primitive,verifier" in command and any("{role}" in arg for arg in command)

    linear = linear_module_names(qwen3_8b_meta)
    base_params = sum(p.numel() for p in qwen3_8b_meta.parameters())
    for recipe_path in files[1:-1]:
        recipe = load_recipe(recipe_path, check_paths=False)
        with init_empty_weights():
            model = get_peft_model(copy.deepcopy(qwen3_8b_meta), LoraConfig(
                r=recipe.lora.r, lora_alpha=recipe.lora.alpha, lora_dropout=recipe.lora.dropout, task_type="CAUSAL_LM",
                **lora_placement(recipe.lora, qwen3_8b_meta, linear)))
        assert {n.rsplit(".", 1)[-1] for n in model.peft_config["default"].target_modules} == linear
        trainable, total = model.get_nb_trainable_parameters()
        layers = recipe.lora.top_layers or QWEN3_8B["num_hidden_layers"]
        assert trainable == lora_parameters(QWEN3_8B, recipe.lora.r) * layers // QWEN3_8B["num_hidden_layers"]
        memory = training_memory_gb(QWEN3_8B, base_params, trainable, recipe.sft.batch_size, recipe.sft.max_length,
                                    recipe.sft.gradient_checkpointing)
        assert memory["total"] < 80, memory


def test_top_layers_places_lora_on_the_upper_layers_only(qwen3_8b_meta):
    import copy

    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model

    from heart_distill.train.adapter import linear_module_names, lora_placement
    from heart_distill.train.config import LoraConfig as RecipeLora
    from heart_distill.train.known_configs import QWEN3_8B, lora_parameters

    placement = lora_placement(RecipeLora(r=8, top_layers=4), qwen3_8b_meta, linear_module_names(qwen3_8b_meta))
    assert placement["layers_to_transform"] == [32, 33, 34, 35]
    with init_empty_weights():
        model = get_peft_model(copy.deepcopy(qwen3_8b_meta), LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                                                                          **placement))
    adapted = {int(n.split(".layers.")[1].split(".")[0]) for n, _ in model.named_parameters() if "lora_A" in n}
    assert adapted == {32, 33, 34, 35}
    assert model.get_nb_trainable_parameters()[0] == lora_parameters(QWEN3_8B, 8) * 4 // 36
    with pytest.raises(ValueError, match="top_layers=40 but the base has 36"):
        lora_placement(RecipeLora(top_layers=40), qwen3_8b_meta, set())
