"""train.launch: validates every role's recipe before starting any training."""

import subprocess
from pathlib import Path

from heart_distill.train import launch

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "recipes/smollm2-135m/roles.yaml"


def test_unknown_role(capsys):
    assert launch.run_roles(ROLES, ["judge"]) == 2
    assert "no recipe for role(s) ['judge']" in capsys.readouterr().err


def test_bad_recipe_stops_before_any_launch(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    status = launch.run_roles(ROLES, ["planner", "router"], [f"data.dataset_dir={tmp_path}/missing"])
    assert status == 2 and not started
    assert "'data.dataset_dir'" in capsys.readouterr().err


def test_runs_roles_in_order_through_accelerate(tmp_path, monkeypatch):
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    monkeypatch.setattr(launch, "_device_count", lambda: 0)  # a CPU machine, whatever this one has
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    for role in ("planner", "router"):
        write_synthetic_role_dataset(tmp_path, role, 2, 1, compact=True)
    # one override per role would need per-role values; the dataset_dir override is shared here
    assert launch.run_roles(ROLES, ["planner"], [f"data.dataset_dir={tmp_path}/planner"], parallel=True) == 0
    (command,) = started
    assert command[1:5] == ["-m", "accelerate.commands.launch", "--quiet", "--config_file"]
    assert command[5].endswith("recipes/smollm2-135m/../accelerate/cpu.yaml")
    assert command[6:8] == ["--num_cpu_threads_per_process", "3"]  # said, so accelerate need not warn it chose
    assert command[8:12] == ["-m", "heart_distill.train.sft", "--recipe", str(REPO / "recipes/smollm2-135m/planner.yaml")]
    assert command[-1] == f"data.dataset_dir={tmp_path}/planner"


def test_several_roles_train_in_one_process_with_role_placeholders(tmp_path, monkeypatch):
    """Sequential roles share one accelerate launch (one start-up); ``{role}`` in an override
    becomes each role's name, and each role's recipe is validated with its own value first."""
    from heart_distill.train.config import load_recipe, role_overrides
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    for role in ("planner", "router"):
        write_synthetic_role_dataset(tmp_path, role, 2, 1, compact=True)
    overrides = [f"data.dataset_dir={tmp_path}/{{role}}", f"output.dir={tmp_path}/adapters/{{role}}"]
    assert launch.run_roles(ROLES, ["planner", "router"], overrides) == 0
    (command,) = started
    recipes = [command[i + 1] for i, arg in enumerate(command) if arg == "--recipe"]
    assert [Path(r).name for r in recipes] == ["planner.yaml", "router.yaml"]
    assert command[-2:] == overrides  # substituted per recipe inside train.sft
    router = load_recipe(recipes[1], role_overrides(recipes[1], overrides))
    assert router.data.dataset_dir == f"{tmp_path}/router" and router.output.dir == f"{tmp_path}/adapters/router"
    # a missing dataset for one role stops everything before any launch
    started.clear()
    (tmp_path / "router").rename(tmp_path / "gone")
    assert launch.run_roles(ROLES, ["planner", "router"], overrides) == 2 and not started


def test_an_override_scoped_to_a_role_reaches_that_role_alone(tmp_path, monkeypatch, capsys):
    """``planner:sft.epochs=2`` changes the Planner's recipe and leaves the Router's as written;
    a scope naming a role the roles.yaml does not have stops before any launch."""
    from heart_distill.train.config import load_recipe, role_overrides
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    for role in ("planner", "router"):
        write_synthetic_role_dataset(tmp_path, role, 2, 1, compact=True)
    overrides = [f"data.dataset_dir={tmp_path}/{{role}}", f"output.dir={tmp_path}/adapters/{{role}}",
                 "planner:sft.epochs=2"]
    assert launch.run_roles(ROLES, ["planner", "router"], overrides) == 0
    recipes = [started[0][i + 1] for i, arg in enumerate(started[0]) if arg == "--recipe"]
    planner, router = (load_recipe(r, role_overrides(r, overrides)) for r in recipes)
    assert planner.sft.epochs == 2 and router.sft.epochs == 1
    started.clear()
    assert launch.run_roles(ROLES, ["planner", "router"], [*overrides, "planer:sft.epochs=3"]) == 2
    assert not started and "['planer']" in capsys.readouterr().err


def test_a_joint_adapter_trains_on_each_roles_own_rows_repeated_by_its_epochs(tmp_path, monkeypatch):
    """heart train --joint: one dataset of every role's rows as its own recipe samples and
    prompts them, each repeated by its epochs; one recipe that trains them in one epoch."""
    import yaml
    from datasets import load_from_disk

    from heart.roles import get_role
    from heart_distill.train.config import load_recipe
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    for role in ("planner", "router"):
        write_synthetic_role_dataset(tmp_path / "datasets", role, 6, 2, compact=True)
    adapters = tmp_path / "adapters"
    assert launch.run_joint(ROLES, adapters, ["planner", "router"],
                            [f"data.dataset_dir={tmp_path}/datasets/{{role}}", "data.max_train_examples=4",
                             "sft.learning_rate=1e-3", "planner:sft.epochs=2", "router:sft.epochs=1"]) == 0
    (command,) = started
    recipe_path = adapters / "joint-data" / "recipe.yaml"
    assert command[-2:] == ["--recipe", str(recipe_path)]
    recipe = load_recipe(recipe_path)
    assert recipe.data.joint_roles == ["planner", "router"] and recipe.sft.epochs == 1.0
    assert recipe.output.dir == str(adapters / "joint") and recipe.data.system_prompt == "short"
    train = load_from_disk(str(adapters / "joint-data" / "data"))["train"]
    assert sorted(train["role"]) == ["planner"] * 8 + ["router"] * 4  # 4 sampled rows x 2 epochs, 4 x 1
    by_role = {role: {row["messages"][0]["content"] for row in train if row["role"] == role} for role in ("planner", "router")}
    assert by_role["planner"] == {get_role("planner").short_system_prompt_for(p) for p in by_role["planner"]} != by_role["router"]
    assert "optimizer steps the roles' own trainings take: {'planner': 4, 'router': 2} (together 6)" in \
        recipe_path.read_text()
    assert yaml.safe_load(recipe_path.read_text())["data"]["joint_roles"] == ["planner", "router"]


def test_a_joint_adapter_refuses_roles_whose_recipes_differ(tmp_path, capsys):
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    for role in ("planner", "router"):
        write_synthetic_role_dataset(tmp_path / "datasets", role, 2, 1, compact=True)
    assert launch.run_joint(ROLES, tmp_path / "adapters", ["planner", "router"],
                            [f"data.dataset_dir={tmp_path}/datasets/{{role}}", "router:sft.learning_rate=5e-4"]) == 2
    assert "router's sft.learning_rate is 0.0005, planner's 0.003: give it once as an override" in capsys.readouterr().err
    assert not (tmp_path / "adapters").exists()


def test_a_time_slot_reaches_the_training_and_a_pause_says_how_to_resume(tmp_path, monkeypatch, capsys):
    """``heart train --stop-after M``: the training process gets the slot, and its pause (exit
    75, a checkpoint written) is reported as one to resume, not as a failure."""
    from heart_distill.train.sft import PAUSE_MARKER, PAUSED
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    out = tmp_path / "adapters" / "planner"
    started = []

    def training(command, marker):
        started.append(command)
        if marker:  # what train.sft leaves when the slot ends; accelerate launch then exits 1
            (out / "checkpoints").mkdir(parents=True)
            (out / "checkpoints" / PAUSE_MARKER).write_text("{}")
        return 1

    write_synthetic_role_dataset(tmp_path, "planner", 2, 1, compact=True)
    overrides = [f"data.dataset_dir={tmp_path}/planner", f"output.dir={out}"]
    monkeypatch.setattr(subprocess, "call", lambda command: training(command, marker=False))
    assert launch.run_roles(ROLES, ["planner"], overrides, stop_after=50) == 1  # a failure stays one
    assert "planner failed (1)" in capsys.readouterr().err
    monkeypatch.setattr(subprocess, "call", lambda command: training(command, marker=True))
    assert launch.run_roles(ROLES, ["planner"], overrides, stop_after=50) == PAUSED == 75
    command = started[-1]
    assert command[command.index("--stop-after") + 1] == "50"
    err = capsys.readouterr().err
    assert "stopped after 50 min at a checkpoint; the same command resumes" in err and "failed" not in err


def test_publishing_a_trained_set_copies_it_with_cards_naming_the_new_folder(tmp_path, capsys):
    """``--publish DIR`` on the command line that trained a set copies each role's adapter to
    DIR/<role> (no checkpoints), the card's commands naming DIR; an unfinished role or a taken
    folder stops it before anything is copied."""
    import json

    from heart_distill.train.adapter import adapter_card

    overrides = [f"output.dir={tmp_path}/runs/{{role}}"]
    for role in ("planner", "router"):
        src = tmp_path / "runs" / role
        (src / "checkpoints" / "checkpoint-4").mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            (src / name).write_text("{}")
        manifest = {"role": role, "base_model": {"name": "smollm2-135m", "path": "/m"}, "metrics": {"steps": 2},
                    "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj"]}, "system_prompt": "short",
                    "dataset": {"path": "/d", "fingerprint": "sha256:" + "0" * 64, "sizes": {"train": 2}},
                    "recipe": {"output": {"dir": str(src)}}}
        (src / "manifest.json").write_text(json.dumps(manifest))
        (src / "README.md").write_text(adapter_card(manifest, src))
    dest = tmp_path / "docs" / "adapters"
    # the Verifier has not been trained: nothing is copied
    assert launch.publish_roles(ROLES, dest, ["planner", "verifier"], overrides) == 2
    assert "no finished adapter in" in capsys.readouterr().err and not dest.exists()
    assert launch.publish_roles(ROLES, dest, ["planner", "router"], overrides) == 0
    card = (dest / "router" / "README.md").read_text()
    assert f"--lora-modules router={dest / 'router'}" in card and str(tmp_path / "runs") not in card
    assert not (dest / "router" / "checkpoints").exists()
    assert json.loads((dest / "router" / "manifest.json").read_text())["recipe"]["output"]["dir"] == str(tmp_path / "runs" / "router")
    # publishing again never overwrites
    assert launch.publish_roles(ROLES, dest, ["planner"], overrides) == 2
    assert "exist (never overwritten)" in capsys.readouterr().err
