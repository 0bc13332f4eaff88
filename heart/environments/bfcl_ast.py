"""BFCL's single-turn AST categories (simple, multiple, parallel, parallel_multiple) as an
environment the HEART loop runs, scored by bfcl's own ``ast_checker``.

A task is one user query and the function docs BFCL gives with it; nothing executes (BFCL
checks these categories by comparing the calls, not by running them). A session's tools
record each call the Primitives make, and :meth:`BFCLASTSession.score` hands the recorded
calls — ``[{name: arguments}, ...]`` — to ``bfcl_eval``'s ``ast_checker`` with the task's
possible answers, exactly as BFCL's eval runner does for a decoded model result.

bfcl's ``ast_checker`` module imports its model registry (``constants.model_config``) only
to look up one flag of the model under test (``underscore_to_dot``: whether the model's API
renamed "math.factorial" to "math_factorial"); that registry imports every provider SDK
(Anthropic, Mistral, Google, …). The calls here keep BFCL's own names, so the registry is
replaced, for that import only, by one entry with the flag off; the checker code is bfcl's.
"""

from __future__ import annotations

import copy
import sys
import types
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import heart.environments.bfcl as bfcl  # sets BFCL_PROJECT_ROOT before bfcl_eval is imported
from heart.environments.categories import BFCL_SINGLE_TURN_CATEGORIES
from heart.environments.base import CatalogEnvironment, EpisodeScore, Task, ToolCall
from heart.environments.calls import EpisodeLog, LoggedSession
from heart.environments.splits import split_of
from heart.toolface import Tool, ToolSpec

CHECKER_MODEL = "heart"
"""The model name handed to bfcl's checker (a key of the one-entry registry below)."""


@dataclass(frozen=True)
class _ModelConfig:
    underscore_to_dot: bool = False


def ast_checker():
    """bfcl_eval's ``ast_checker`` function and its ``Language`` enum."""
    name = "bfcl_eval.constants.model_config"
    saved = sys.modules.get(name)
    registry = types.ModuleType(name)
    registry.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: _ModelConfig()}
    sys.modules[name] = registry
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker as checker
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved
    return checker, Language


def _first_value(options: list[Any]) -> Any:
    """The first acceptable value of a possible answer ("" marks an optional parameter)."""
    return next((o for o in options if o != ""), None)


class BFCLASTEnvironment(CatalogEnvironment):
    """One BFCL single-turn AST category."""

    name = "bfcl"  # the toolkit's split is keyed by ("bfcl", task id), as for multi-turn

    def __init__(self, category: str = "simple"):
        if category not in BFCL_SINGLE_TURN_CATEGORIES:
            raise ValueError(f"unknown BFCL AST category {category!r}: expected one of {list(BFCL_SINGLE_TURN_CATEGORIES)}")
        self.category = category
        self.test_category = BFCL_SINGLE_TURN_CATEGORIES[category]

    @cached_property
    def _entries(self) -> dict[str, dict[str, Any]]:
        data = bfcl.data_dir()
        entries = {e["id"]: e for e in bfcl.read_jsonl(data / f"BFCL_v4_{self.test_category}.json")}
        for answer in bfcl.read_jsonl(data / "possible_answer" / f"BFCL_v4_{self.test_category}.json"):
            entries[answer["id"]]["ground_truth"] = answer["ground_truth"]
        return entries

    def task_ids(self, split: str | None = None) -> list[str]:
        ids = list(self._entries)
        return ids if split is None else [t for t in ids if split_of(self.name, t) == split]

    def load_task(self, task_id: str) -> Task:
        try:
            entry = self._entries[task_id]
        except KeyError:
            raise KeyError(f"no BFCL {self.test_category} task with id {task_id!r}") from None
        # Gold for teachers: each possible answer's first acceptable value; optional
        # parameters whose only acceptable value is "absent" are left out.
        gold = [ToolCall(name, {k: _first_value(v) for k, v in args.items() if _first_value(v) is not None})
                for call in entry["ground_truth"] for name, args in call.items()]
        return Task(task_id=task_id, env=self.name,
                    turns=["\n".join(m["content"] for m in entry["question"][0] if m["role"] == "user")],
                    gold=[gold], meta={"category": self.test_category})

    def _specs(self, entry: dict[str, Any]) -> list[ToolSpec]:
        return [ToolSpec(name=f["name"], description=f["description"], parameters=bfcl.json_schema(f["parameters"]))
                for f in entry["function"]]

    def catalog(self) -> list[ToolSpec]:
        specs: dict[str, ToolSpec] = {}
        for entry in self._entries.values():
            for spec in self._specs(entry):
                specs.setdefault(spec.name, spec)
        return list(specs.values())

    def start(self, task: Task) -> "BFCLASTSession":
        entry = self._entries[task.task_id]
        return BFCLASTSession(self, task, entry, self._specs(entry))

    def check(self, task_id: str, calls: list[ToolCall]) -> dict[str, Any]:
        """BFCL's AST checker on ``calls`` for the task: ``{valid, error_type, error}``. An
        episode's score is this on its recorded calls; a report may ask it of a role's output
        before any tool ran (a Router's bindings)."""
        entry = self._entries[task_id]
        checker, language = ast_checker()
        return checker(entry["function"], [{call.name: call.arguments} for call in calls], entry["ground_truth"],
                       language.PYTHON, self.test_category, CHECKER_MODEL)


class BFCLASTSession(LoggedSession):
    """One single-turn task: tools that record calls, and bfcl's AST checker."""

    clarify_answer = bfcl.CLARIFY_ANSWER

    def __init__(self, env: BFCLASTEnvironment, task: Task, entry: dict[str, Any], specs: list[ToolSpec]):
        self.env = env
        self.task = task
        self._entry = entry
        self._log = EpisodeLog(len(task.turns))
        self.tools = [Tool(spec=spec, fn=self._recorder(spec.name)) for spec in specs]

    def _recorder(self, name: str):
        def call(**arguments):
            self._log.record(name, copy.deepcopy(arguments))
            return {"status": "recorded", "call": name}  # BFCL does not execute these functions

        call.__name__ = name
        return call

    def model_output(self) -> list[dict[str, dict[str, Any]]]:
        """The recorded calls as bfcl's decoded model result: ``[{name: arguments}]``."""
        return [{call.name: call.arguments} for turn in self._log.calls for call in turn]

    def score(self) -> EpisodeScore:
        result = self.env.check(self.task.task_id, [call for turn in self._log.calls for call in turn])
        details = {"calls": len(self.model_output())}
        if not result["valid"]:
            details.update(error_type=result.get("error_type"), error_message=str(result.get("error"))[:2000])
        return EpisodeScore(1.0 if result["valid"] else 0.0, bool(result["valid"]), details)
