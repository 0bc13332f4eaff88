"""The loop's settings are declared once (heart.settings.LoopConfig): every command's flags,
the optimize recipe's ``loop`` section and the pipeline's are derived from it, with its defaults."""

import argparse
import re
from pathlib import Path

import pytest

from heart.settings import POLICY, TURN, LoopConfig, user_settings
from heart_distill.arguments import collect_arguments, loop_flags
from heart_distill.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def _defaults(parser: argparse.ArgumentParser, argv: list[str], names) -> dict:
    args = parser.parse_args(argv)
    return {name: getattr(args, name) for name in names}


def test_every_command_defaults_each_setting_to_the_loops_one_default():
    from heart_distill.eval import e2e

    expected = {name: getattr(LoopConfig(), name) for name in (*POLICY, *TURN)}
    run = build_parser()
    assert _defaults(run, ["run", "--task", "t"], expected) == expected
    e2e_parser = argparse.ArgumentParser()
    e2e.add_arguments(e2e_parser)
    assert _defaults(e2e_parser, ["--env", "bfcl", "--out", "o"], expected) == expected
    collect = argparse.ArgumentParser()
    collect_arguments(collect)
    assert _defaults(collect, ["--env", "bfcl", "--out", "o"], POLICY) == {n: expected[n] for n in POLICY}
    # the demo's short loop is a stated choice of its parser, not another default of the setting
    assert _defaults(run, ["demo"], ["replan_budget", "max_plan_steps"]) == {"replan_budget": 1, "max_plan_steps": 4}


def test_no_module_declares_a_loop_flag_of_its_own():
    """Only heart_distill.arguments adds a setting's flag (bench scripts, which replicate a
    recipe's settings, are measurement tools and may fix their own)."""
    flags = []
    for f in user_settings():
        flags += [f.metadata["flag"] or "--" + ("no-" if f.default is True else "") + f.name.replace("_", "-"),
                  *f.metadata["aliases"]]
    pattern = re.compile(r"add_argument\(\s*\"(" + "|".join(map(re.escape, flags)) + r")\"")
    offenders = [str(path.relative_to(REPO)) for folder in ("heart", "heart_distill", "eval", "data", "train")
                 for path in (REPO / folder).rglob("*.py") if pattern.search(path.read_text())]
    # the same spelling, another thing: rows held out for validation; one role call's decoding
    # in the per-role evaluation, where no loop runs
    assert sorted(offenders) == ["eval/roles.py", "train/synthetic.py"]


def test_loop_flags_are_the_inverse_of_the_parsed_flags():
    from heart_distill.eval import e2e

    settings = {"replan_budget": 0, "verify": "attempt", "middleware": "none", "relevance": True, "messages": False,
                "validation": "none", "router_mode": "step", "max_clarifications": 0, "max_plan_steps": 3,
                "retrieve_k": 5, "constrained": False}
    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    parsed = e2e.config_from_args(parser.parse_args(["--env", "bfcl", "--out", "o", *loop_flags(settings)]))
    assert parsed.loop == LoopConfig(**settings)
    assert loop_flags({"max_plan_steps": LoopConfig().max_plan_steps}) == []  # a default names no flag
    with pytest.raises(ValueError, match="not loop settings: budget"):
        loop_flags({"budget": 3})
    with pytest.raises(ValueError, match="max_plan_steps must be an integer >= 1"):
        loop_flags({"max_plan_steps": 0})


def test_an_optimize_recipes_loop_keys_are_the_loops_field_names(tmp_path):
    from heart_distill.eval.optimize.protocol import load_recipe

    path = tmp_path / "optimize.yaml"
    path.write_text("out: x\nconditions: [bfcl:simple]\nsearch: {budget: 400}\nloop: {budget: 3}\n")
    with pytest.raises(ValueError, match=r"unknown key 'loop\.budget'; did you mean 'loop\.replan_budget'"):
        load_recipe(path)
    path.write_text("out: x\nconditions: [bfcl:simple]\nsearch: {budget: 400}\nloop: {router_mode: steps}\n")
    with pytest.raises(ValueError, match="loop: router_mode must be one of plan, step"):
        load_recipe(path)
    path.write_text("out: x\nconditions: [bfcl:simple]\nsearch: {budget: 400}\n"
                    "loop: {replan_budget: 1, argument_types: {primitive: string}}\n")
    config = load_recipe(path)
    assert config.loop_config() == LoopConfig(replan_budget=1)  # the rest: the loop's defaults
