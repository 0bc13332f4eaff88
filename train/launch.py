"""Train every role of a ``roles.yaml``: one ``accelerate launch -m heart_distill.train.sft`` per role.

    python -m heart_distill.train.launch --recipe recipes/smollm2-135m/roles.yaml --roles planner,router [section.key=value ...]

``--recipe`` may also be one role's recipe (``recipes/smollm2-135m/router.yaml``): that role
is trained alone, with the accelerate config of the ``roles.yaml`` beside it.

Roles run one after another in one ``train.sft`` process (``{role}`` in an override is each
role's name, e.g. ``output.dir=runs/x/adapters/{role}``); with ``--parallel`` and several GPUs, each role gets its own GPU
(CUDA_VISIBLE_DEVICES) and they run at once. Each role's recipe is validated before any
training starts, so a typo in the fourth recipe does not surface after three trainings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import yaml

from heart_distill.recipes import load_roles
from heart_distill.train.config import Recipe, RecipeError, load_recipe, override_scope, role_overrides
from heart_distill.train.sft import PAUSE_MARKER, PAUSED

RECIPE_SECTIONS = frozenset(f.name for f in dataclasses.fields(Recipe))
"""Top-level keys of one role's recipe (a roles.yaml has ``accelerate_config`` and ``roles``)."""


def _device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def role_command(recipes: str | list[str], accelerate_config: str | None, overrides: list[str],
                 stop_after: float | None = None) -> list[str]:
    """One ``accelerate launch -m heart_distill.train.sft`` that trains ``recipes`` one after another
    (stopping at a checkpoint after ``stop_after`` minutes: :data:`heart_distill.train.sft.PAUSED`)."""
    # --quiet: a failing child's own traceback is what matters; accelerate's would only repeat its status
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--quiet"]
    if accelerate_config:
        accelerate += ["--config_file", accelerate_config]
    if _device_count() == 0:  # accelerate picks the same number for a CPU run, with a warning that it did
        accelerate += ["--num_cpu_threads_per_process", str(len(os.sched_getaffinity(0)))]
    recipe_args = [arg for recipe in ([recipes] if isinstance(recipes, str) else recipes) for arg in ("--recipe", recipe)]
    slot = ["--stop-after", f"{stop_after:g}"] if stop_after is not None else []
    return [*accelerate, "-m", "heart_distill.train.sft", *recipe_args, *slot, *overrides]


def _recipe_kind(path: Path) -> str:
    """"role" for one role's recipe (model/lora/sft/data/output), "pipeline" for a ``heart
    pipeline`` recipe (run_dir, stages), else "roles"; a file that cannot be read is "roles",
    and :func:`load_roles` then names its problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "roles"
    if not isinstance(data, dict) or "roles" in data:
        return "roles"
    keys = set(map(str, data))
    if "run_dir" in keys:
        return "pipeline"
    return "role" if keys & RECIPE_SECTIONS else "roles"


def training_spec(recipe_path: str | Path, overrides: list[str] | None = None) -> dict:
    """:func:`load_roles`'s ``{accelerate_config, roles}`` for a roles.yaml; for one role's recipe
    (e.g. recipes/smollm2-135m/router.yaml), that role alone, with the accelerate config of the
    roles.yaml beside it (none there: accelerate's defaults). Raises RecipeError."""
    path = Path(recipe_path)
    kind = _recipe_kind(path)
    if kind == "pipeline":
        raise RecipeError(f"{path} is a pipeline recipe: run it with `heart pipeline --recipe {path}` "
                          "(`heart train` takes a roles.yaml or one role's recipe)")
    if kind == "roles":
        return load_roles(path)
    try:
        role = load_recipe(path, role_overrides(path, overrides), check_paths=False).data.role
    except RecipeError as err:
        raise RecipeError(str(err) if str(path) in str(err) else f"{path}: {err}") from None
    beside = path.parent / "roles.yaml"
    accelerate_config = load_roles(beside)["accelerate_config"] if beside.is_file() else None
    where = accelerate_config or "accelerate's defaults (no roles.yaml beside it)"
    print(f"train.launch: {path} is the {role} role's recipe: training {role} alone, accelerate config {where}",
          file=sys.stderr)
    return {"accelerate_config": accelerate_config, "roles": {role: str(path)}}


def paused(status: int, output_dirs: list[Path], stop_after: float | None, label: str = "") -> int:
    """``status`` of a training process, :data:`PAUSED` (and said so) where ``--stop-after``
    stopped one of ``output_dirs`` at a checkpoint (its marker says so: accelerate reports any
    stop as 1)."""
    if status != 0 and any((Path(d) / "checkpoints" / PAUSE_MARKER).is_file() for d in output_dirs):
        print(f"train.launch: {label}stopped after {stop_after:g} min at a checkpoint; the same command resumes",
              file=sys.stderr)
        return PAUSED
    return status


def run_roles(recipe_path: str | Path, roles: list[str] | None = None, overrides: list[str] | None = None,
              parallel: bool = False, stop_after: float | None = None) -> int:
    """Train the given roles (default: all in the roles.yaml; a single role's recipe trains that
    role, see :func:`training_spec`); returns the first non-zero exit status, else 0
    (:data:`~heart_distill.train.sft.PAUSED` when ``stop_after`` minutes stopped it at a checkpoint)."""
    overrides = overrides or []
    try:
        spec = training_spec(recipe_path, overrides)
    except RecipeError as err:
        print(f"train.launch: {err}", file=sys.stderr)
        return 2
    chosen = roles or list(spec["roles"])
    unknown = [r for r in chosen if r not in spec["roles"]]
    if unknown:
        print(f"train.launch: {recipe_path} has no recipe for role(s) {unknown} "
              f"(has: {', '.join(spec['roles'])})", file=sys.stderr)
        return 2
    stray = sorted({scope for o in overrides if (scope := override_scope(o)) and scope not in spec["roles"]})
    if stray:  # a misspelt role would otherwise drop its override silently
        print(f"train.launch: override(s) scoped to {stray}, which {recipe_path} has no recipe for "
              f"(has: {', '.join(spec['roles'])})", file=sys.stderr)
        return 2
    outputs = {}  # role → its output.dir, where a pause leaves its marker
    for role in chosen:
        try:
            outputs[role] = Path(load_recipe(spec["roles"][role], role_overrides(spec["roles"][role], overrides)).output.dir)
        except RecipeError as err:
            print(f"train.launch: {role}: {err}", file=sys.stderr)
            return 2
    devices = _device_count() if parallel else 0
    if parallel and devices >= 2:
        commands = {role: role_command(spec["roles"][role], spec["accelerate_config"], overrides, stop_after)
                    for role in chosen}
        running = []
        for index, (role, command) in enumerate(commands.items()):  # one GPU per role, in waves
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index % devices)}
            running.append((role, subprocess.Popen(command, env=env)))
            if len(running) == devices or index == len(commands) - 1:
                for done_role, process in running:
                    status = paused(process.wait(), [outputs[done_role]], stop_after, f"{done_role} ")
                    if status not in (0, PAUSED):
                        print(f"train.launch: {done_role} failed ({status})", file=sys.stderr)
                    if status != 0:
                        return status
                running = []
        return 0
    if parallel:
        print(f"train.launch: --parallel needs 2+ GPUs (found {devices}); running roles one after another",
              file=sys.stderr)
    # One after another in one process: each role would otherwise pay for starting Python and
    # importing torch/transformers/TRL again (~15 s on a 2-core CPU).
    command = role_command([spec["roles"][role] for role in chosen], spec["accelerate_config"], overrides, stop_after)
    print(f"train.launch: {', '.join(chosen)}: {' '.join(command)}", file=sys.stderr, flush=True)
    status = paused(subprocess.call(command), list(outputs.values()), stop_after)
    if status not in (0, PAUSED):
        print(f"train.launch: {', '.join(chosen)} failed ({status}); roles whose adapter was written are done",
              file=sys.stderr)
    return status


def chosen_recipes(recipe_path: str | Path, roles: list[str] | None, overrides: list[str],
                   check_paths: bool = True) -> tuple[dict, dict[str, Recipe]]:
    """:func:`training_spec` and the loaded recipe of each chosen role (default: all), with
    ``overrides``; raises RecipeError naming a role the recipe lacks."""
    spec = training_spec(recipe_path, overrides)
    chosen = roles or list(spec["roles"])
    unknown = [r for r in chosen if r not in spec["roles"]]
    if unknown:
        raise RecipeError(f"{recipe_path} has no recipe for role(s) {unknown} (has: {', '.join(spec['roles'])})")
    return spec, {role: load_recipe(spec["roles"][role], role_overrides(spec["roles"][role], overrides),
                                    check_paths=check_paths) for role in chosen}


def publish_roles(recipe_path: str | Path, dest: str | Path, roles: list[str] | None = None,
                  overrides: list[str] | None = None) -> int:
    """Copy the trained adapter of each role (its recipe's output.dir, with ``overrides``) to
    ``<dest>/<role>``, cards naming the new folder (:func:`~heart_distill.train.adapter.copy_adapter`):
    the same command line that trained a set, with ``--publish DIR``. 0, or 2 naming what is wrong
    before anything is copied."""
    from heart_distill.train.adapter import copy_adapter

    try:
        _, recipes = chosen_recipes(recipe_path, roles, overrides or [], check_paths=False)
        sources = {role: Path(recipe.output.dir) for role, recipe in recipes.items()}
    except RecipeError as err:
        print(f"train.launch: {err}", file=sys.stderr)
        return 2
    dest = Path(dest)
    unfinished = [str(src) for src in sources.values() if not (src / "manifest.json").is_file()]
    taken = [str(dest / role) for role in sources if (dest / role).exists()]
    if unfinished or taken:  # checked for every role first: a set is published whole or not at all
        problems = ([f"no finished adapter in {', '.join(unfinished)}"] if unfinished else []) + \
                   ([f"{', '.join(taken)} exist (never overwritten)"] if taken else [])
        print(f"train.launch: --publish {dest}: {'; '.join(problems)}", file=sys.stderr)
        return 2
    for role, src in sources.items():
        try:
            copy_adapter(src, dest / role)
        except ValueError as err:
            print(f"train.launch: --publish {dest}: {err}", file=sys.stderr)
            return 2
        print(f"train.launch: {role}: {src} → {dest / role}", file=sys.stderr)
    return 0


def run_joint(recipe_path: str | Path, adapters: str | Path, roles: list[str] | None = None,
              overrides: list[str] | None = None, stop_after: float | None = None) -> int:
    """Train one adapter into ``<adapters>/joint`` on the union of the roles' rows, with their
    steps and their recipe (:mod:`heart_distill.train.joint`); 0 or the failing exit status."""
    from heart_distill.train.joint import JOINT, write_joint

    try:
        spec, recipes = chosen_recipes(recipe_path, roles, overrides or [])
        joint_recipe = write_joint(recipes, adapters)
    except RecipeError as err:
        print(f"train.launch: {err}", file=sys.stderr)
        return 2
    command = role_command(str(joint_recipe), spec["accelerate_config"], [], stop_after)
    print(f"train.launch: joint adapter of {', '.join(recipes)}: {' '.join(command)}", file=sys.stderr, flush=True)
    return paused(subprocess.call(command), [Path(adapters) / JOINT], stop_after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True,
                        help="roles.yaml listing the per-role recipes, or one role's recipe (trains that role)")
    parser.add_argument("--roles", default="", help="comma-separated roles (default: all)")
    parser.add_argument("--parallel", action="store_true", help="one role per GPU when several exist")
    parser.add_argument("--joint", metavar="ADAPTERS", default=None,
                        help="one adapter for every role instead (ADAPTERS/joint), on the union of their rows with "
                             "their steps and recipe")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES", default=None,
                        help=f"stop at a checkpoint after this many minutes (exit {PAUSED}); the same command resumes")
    parser.add_argument("--publish", metavar="DIR", default=None,
                        help="train nothing: copy the trained adapters to DIR/<role>, cards naming DIR")
    parser.add_argument("overrides", nargs="*", help="section.key=value applied to every role's recipe")
    args = parser.parse_args(argv)
    roles = [r.strip() for r in args.roles.split(",") if r.strip()] or None
    if args.publish:
        return publish_roles(args.recipe, args.publish, roles, args.overrides)
    if args.joint:
        return run_joint(args.recipe, args.joint, roles, args.overrides, args.stop_after)
    return run_roles(args.recipe, roles, args.overrides, args.parallel, args.stop_after)


if __name__ == "__main__":
    sys.exit(main())
