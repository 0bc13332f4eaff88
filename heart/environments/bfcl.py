"""BFCL v4 multi-turn: the eight executable backends of ``bfcl-eval`` and its own checker.

Tasks, gold answers and function docs come from the installed ``bfcl_eval`` package. A
session holds fresh instances of the task's involved classes, loaded with the task's initial
configuration exactly as BFCL's ``execute_multi_turn_func_call`` loads them; its tools are
those classes' methods (minus the task's excluded functions), bound to those instances. At
the end, the logged calls are rendered as BFCL call strings and scored by BFCL's
``multi_turn_checker``, which re-executes them next to the gold calls and compares the
backends' states and results turn by turn.

``multi_turn_miss_param`` (:data:`heart.environments.BFCL_MULTI_TURN_CATEGORIES`): a task's request withholds a parameter — the
turn's gold is empty and the next user turn gives the value. The session plays that user,
from the data, without a model: a clarification question asked in such a turn is answered
with the next turn's text, and the calls that follow are logged under that next turn, as
BFCL's checker expects them (the turn given as an answer is then not run on its own:
``answered_turns``). A Planner that does not ask gets the next turn as its next user turn,
as BFCL's own runner would give it.

    env = BFCLEnvironment()
    session = env.start(env.load_task("multi_turn_base_0"))
"""

from __future__ import annotations

import os

from heart import default_cache_dir

# bfcl_eval's eval_config creates result/ and score/ under BFCL_PROJECT_ROOT (by default
# next to the installed package) as soon as it is imported: point it at a scratch folder
# before any bfcl_eval module can be imported, so nothing is written into site-packages.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(default_cache_dir() / "bfcl"))

import ast  # noqa: E402
import copy  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402
from functools import cached_property  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bfcl_eval.constants.executable_backend_config import (  # noqa: E402
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker,
    multi_turn_irrelevance_checker,
)

from heart.environments.categories import BFCL_MULTI_TURN_CATEGORIES  # noqa: E402
from heart.environments.base import (  # noqa: E402
    CatalogEnvironment,
    EpisodeScore,
    Task,
    ToolCall,
    ToolExecutionError,
)
from heart.environments.calls import EpisodeLog, LoggedSession, jsonable  # noqa: E402
from heart.environments.splits import split_of  # noqa: E402
from heart.toolface import Tool, ToolSpec  # noqa: E402
from heart.validation import state_view  # noqa: E402

MULTI_TURN_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
"""The eight backends of the multi-turn categories (BFCL's other classes serve agentic ones)."""

CLARIFY_ANSWER = (
    "I have no further information: everything needed is in my request. "
    "Please proceed with what you have."
)
"""The answer to a clarification asked where the task withholds nothing (every turn of the
base and long-context categories state all information up front): no new facts."""

_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_AST_LOCK = threading.Lock()
"""CPython 3.11 keeps the AST-to-object conversion's recursion depth in shared state, so
``ast.parse`` in concurrent threads can fail with ``SystemError: AST constructor recursion
depth mismatch``; a BFCL train collection at concurrency 8 lost an episode to it."""
_ENUM_IN_DESCRIPTION = re.compile(r"\[Enum\]:\s*(\[.*?\])")


def data_dir() -> Path:
    """The installed ``bfcl_eval`` package's data folder (BFCL_v4_<category>.json, possible_answer/, ...)."""
    return Path(importlib.util.find_spec("bfcl_eval").submodule_search_locations[0]) / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a BFCL data file, one per non-empty line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _backend_class(class_name: str) -> type:
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def json_schema(bfcl_schema: dict[str, Any]) -> dict[str, Any]:
    """BFCL's parameter schema as JSON Schema: its "dict"/"float"/"tuple"/"any" types mapped,
    recursively, and the "[Enum]: [...]" lists that BFCL writes into descriptions lifted
    into ``enum`` (the description is kept as it is)."""
    schema: dict[str, Any] = {}
    for key, value in bfcl_schema.items():
        if key == "type":
            if value != "any":
                schema["type"] = _BFCL_TYPES.get(value, value)
        elif key == "properties":
            schema["properties"] = {name: json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            schema[key] = json_schema(value)
        else:
            schema[key] = copy.deepcopy(value)
    match = _ENUM_IN_DESCRIPTION.search(schema.get("description", ""))
    if match and "enum" not in schema:
        try:
            options = json.loads(match.group(1))
        except json.JSONDecodeError:
            options = None  # free-form text that only looks like a list: leave it in the description
        if options is not None and schema.get("type") == "array":
            # On an array parameter ("door": which doors) the options constrain each item.
            schema.setdefault("items", {})["enum"] = options
        elif options is not None:
            schema["enum"] = options
    return schema


def withheld_turns(ground_truth: list[list[Any]]) -> list[int]:
    """The turns of a ``multi_turn_miss_param`` task whose request withholds a parameter that
    the next user turn gives: BFCL marks them by an empty gold list followed by a turn with
    gold calls (miss_param_N is base_N with that turn split in two). An empty turn followed
    by another empty one, or by none, withholds nothing the user will give (BFCL's own
    empty turns, as in base_167 and base_180)."""
    return [i for i in range(len(ground_truth) - 1) if not ground_truth[i] and ground_truth[i + 1]]


def _call_string(call: ToolCall) -> str:
    """A logged call as BFCL writes one: ``name(arg=repr(value), ...)``."""
    args = ", ".join(f"{key}={value!r}" for key, value in call.arguments.items())
    return f"{call.name}({args})"


class BFCLEnvironment(CatalogEnvironment):
    """BFCL v4 multi-turn tasks over the eight executable backends."""

    name = "bfcl"

    def __init__(self, category: str = "multi_turn_base", check_irrelevance: bool = False):
        if category not in BFCL_MULTI_TURN_CATEGORIES:
            raise ValueError(
                f"unsupported BFCL category {category!r}: expected one of {BFCL_MULTI_TURN_CATEGORIES}"
            )
        self.category = category
        """BFCL test category, e.g. "multi_turn_base"."""
        self.check_irrelevance = check_irrelevance
        """Also fail an episode that calls tools in a turn whose gold is empty. BFCL's own
        runner (eval_runner.multi_turn_runner) does not apply this check, so by default the
        result is only reported in ``details``."""
        self.long_context = "long_context" in category
        self.miss_param = category == "multi_turn_miss_param"

    # -- data ----------------------------------------------------------------------------
    @cached_property
    def _entries(self) -> dict[str, dict[str, Any]]:
        data = data_dir()
        entries = {e["id"]: e for e in read_jsonl(data / f"BFCL_v4_{self.category}.json")}
        for answer in read_jsonl(data / "possible_answer" / f"BFCL_v4_{self.category}.json"):
            entries[answer["id"]]["ground_truth"] = answer["ground_truth"]
        return entries

    @cached_property
    def _docs(self) -> dict[str, list[dict[str, Any]]]:
        """Function docs per class, in BFCL's order."""
        folder = data_dir() / "multi_turn_func_doc"
        return {
            cls: read_jsonl(folder / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])
            for cls in MULTI_TURN_CLASSES
        }

    @cached_property
    def _specs(self) -> dict[str, ToolSpec]:
        specs: dict[str, ToolSpec] = {}
        for cls, docs in self._docs.items():
            for doc in docs:
                # BFCL's call strings name methods bare, so a name must mean one method.
                assert doc["name"] not in specs, f"BFCL method {doc['name']!r} is not unique"
                specs[doc["name"]] = ToolSpec(
                    name=doc["name"],
                    description=doc["description"],
                    parameters=json_schema(doc["parameters"]),
                    category=cls,
                )
        return specs

    @cached_property
    def _class_of(self) -> dict[str, str]:
        return {doc["name"]: cls for cls, docs in self._docs.items() for doc in docs}

    def task_ids(self, split: str | None = None) -> list[str]:
        ids = list(self._entries)  # BFCL's file order: multi_turn_base_0, _1, ...
        if split is None:
            return ids
        return [task_id for task_id in ids if split_of(self.name, task_id) == split]

    def load_task(self, task_id: str) -> Task:
        try:
            entry = self._entries[task_id]
        except KeyError:
            raise KeyError(f"no BFCL {self.category} task with id {task_id!r}") from None
        return Task(
            task_id=task_id,
            env=self.name,
            turns=[
                "\n".join(m["content"] for m in turn if m["role"] == "user")
                for turn in entry["question"]
            ],
            gold=[[self._parse_gold(call) for call in turn] for turn in entry["ground_truth"]],
            meta={
                "category": self.category,
                "involved_classes": list(entry["involved_classes"]),
                "initial_config": copy.deepcopy(entry["initial_config"]),
                "path": list(entry.get("path", [])),
                "excluded_function": list(entry.get("excluded_function", [])),
                "ground_truth": copy.deepcopy(entry["ground_truth"]),
                # miss_param: the turns whose request withholds a parameter (the next turn gives it)
                "withheld_turns": withheld_turns(entry["ground_truth"]) if self.miss_param else [],
            },
        )

    def _parse_gold(self, call_string: str) -> ToolCall:
        """A gold call string (positional arguments allowed) as a call with keywords."""
        with _AST_LOCK:
            node = ast.parse(call_string.strip(), mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            raise ValueError(f"unexpected BFCL gold call {call_string!r}")
        name = node.func.id
        method = getattr(_backend_class(self._class_of[name]), name)
        params = [p for p in inspect.signature(method).parameters if p != "self"]
        # literal_eval of a node converts no source, so it needs no lock
        arguments = {params[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
        arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
        return ToolCall(name, arguments)

    # -- tools ---------------------------------------------------------------------------
    def catalog(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def start(self, task: Task) -> BFCLSession:
        return BFCLSession(self, task, self._entries[task.task_id])


class BFCLSession(LoggedSession):
    """One BFCL episode: its own backend instances, tools bound to them, and the call log."""

    clarify_answer = CLARIFY_ANSWER

    def __init__(self, env: BFCLEnvironment, task: Task, entry: dict[str, Any]):
        self.env = env
        self.task = task
        self._entry = entry
        self._log = EpisodeLog(len(task.turns))
        self._withheld = set(task.meta.get("withheld_turns", []))
        self._turn: int | None = None
        """The user turn the agent is in (the one ``start_turn`` opened)."""
        self._run_turns: list[int] = []
        self.answered_turns: set[int] = set()
        """Turns the user gave as the answer to a clarification of the turn before: the
        episode does not run them as turns of their own (:func:`heart.episode.run_episode`)."""
        self.asked_turns: list[int] = []
        """The turn of each clarification question asked, in order."""
        self.instances: dict[str, Any] = {}
        for cls in entry["involved_classes"]:
            instance = _backend_class(cls)()
            if cls not in STATELESS_CLASSES:
                # As bfcl's execute_multi_turn_func_call loads them, so states stay comparable.
                instance._load_scenario(
                    copy.deepcopy(entry["initial_config"].get(cls, {})),
                    long_context=env.long_context,
                )
            self.instances[cls] = instance
        excluded = set(entry.get("excluded_function", []))
        self.tools: list[Tool] = [
            Tool(spec=env._specs[doc["name"]], fn=self._bind(cls, doc["name"]))
            for cls in entry["involved_classes"]
            for doc in env._docs[cls]
            if doc["name"] not in excluded
        ]

    def start_turn(self, turn: int) -> None:
        self._log.start_turn(turn)
        self._turn = turn
        self._run_turns.append(turn)

    def clarify(self, question: str) -> str:
        """The user's answer: in a turn that withholds a parameter (miss_param), the next user
        turn of the task, once — calls from then on belong to that turn, as BFCL's checker
        scores them; anywhere else, and to a second question, :data:`CLARIFY_ANSWER`. The
        answer depends on the data alone, never on how the question is worded."""
        turn = self._turn
        if turn is None:
            return self.clarify_answer
        self.asked_turns.append(turn)
        if turn in self._withheld and turn + 1 not in self.answered_turns:
            self.answered_turns.add(turn + 1)
            self._log.start_turn(turn + 1)
            return self.task.turns[turn + 1]
        return self.clarify_answer

    def clarification_record(self) -> dict[str, list[int]]:
        """Which turns the agent ran needed a clarification (withhold a parameter) and in
        which it asked: what clarification precision and recall are computed from
        (:func:`heart_distill.eval.metrics.clarification_figures`)."""
        return {"needed": sorted(t for t in set(self._run_turns) if t in self._withheld),
                "asked": sorted(set(self.asked_turns))}

    def _bind(self, cls: str, name: str):
        method = getattr(self.instances[cls], name)

        def call(**arguments):
            self._log.record(name, arguments)
            try:
                result = method(**arguments)
            except Exception as e:
                raise ToolExecutionError(f"{type(e).__name__}: {e}") from e
            # BFCL backends report failure by returning {"error": message}.
            if isinstance(result, dict) and "error" in result:
                raise ToolExecutionError(str(result["error"]))
            return jsonable(result)

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call

    def state(self) -> dict:
        """The backends' state as plain JSON, every attribute followed (private ones too: a
        file system's current directory is ``_current_dir``), for the carried validation's
        before/after comparison (:mod:`heart.validation`)."""
        return {cls: state_view(instance) for cls, instance in self.instances.items()}

    def decoded_calls(self) -> list[list[list[str]]]:
        """The logged calls as BFCL's checker takes them: turns of steps of call strings.
        Each call is its own step, as an agent that sees each result before the next call
        (BFCL runs a turn's steps in order on the same instances)."""
        return [[[_call_string(call)] for call in turn] for turn in self._log.calls]

    def _check(self, decoded: list, gold: list) -> dict[str, Any]:
        """BFCL's ``multi_turn_checker`` on ``decoded`` against ``gold`` (a checker crash is a
        failed episode, not a crash). The checker caches backend instances in its module
        globals under the model name and entry id: a fresh name per call keeps episodes of
        the same task apart, and its entries are dropped after (else every call leaks two states)."""
        model_name = f"heart_{uuid.uuid4().hex}"
        try:
            return multi_turn_checker(decoded, gold, self._entry, self.env.category, model_name)
        except Exception as e:  # a malformed episode is a failed episode, not a crash
            return {"valid": False, "error_type": f"checker_exception:{type(e).__name__}", "error_message": str(e)}
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(model_name)]:
                del vars(multi_turn_utils)[key]

    def _turns_passed(self, decoded: list, gold: list, upto: int) -> int:
        """How many turns, from the first and at most ``upto``, BFCL's checker accepts before
        the first it fails: the checker run on the first k turns for k = 1, 2, ... (it checks
        state and responses turn by turn, in its own order, and stops at the first failure).
        A measure that moves before whole multi-turn tasks do."""
        for k in range(1, upto + 1):
            if not self._check(decoded[:k], gold[:k])["valid"]:
                return k - 1
        return upto

    def score(self) -> EpisodeScore:
        gold = self._entry["ground_truth"]
        decoded = self.decoded_calls()
        clarifications = self.clarification_record()
        if self._log.turns_started < len(gold):
            # What BFCL's runner reports when a model stops before the last turn.
            return EpisodeScore(0.0, False, {
                "error_type": "multi_turn:force_terminated",
                "error_message": f"the episode ran {self._log.turns_started} of {len(gold)} turns",
                "clarifications": clarifications, "turns": len(gold),
                "turns_passed": self._turns_passed(decoded, gold, self._log.turns_started),
            })
        result = self._check(decoded, gold)
        irrelevance = multi_turn_irrelevance_checker(decoded, gold)
        details: dict[str, Any] = {"irrelevance_valid": irrelevance["valid"], "clarifications": clarifications,
                                   "turns": len(gold),
                                   "turns_passed": len(gold) if result["valid"]
                                   else self._turns_passed(decoded, gold, len(gold) - 1)}
        if not result["valid"]:
            details["error_type"] = result.get("error_type")
            details["error_message"] = result.get("error_message")
            if "missing_items" in result.get("details", {}):
                details["missing_items"] = result["details"]["missing_items"]
            if "differences" in result.get("details", {}):
                details["differences"] = repr(result["details"]["differences"])[:2000]
        elif self.env.check_irrelevance and not irrelevance["valid"]:
            details["error_type"] = irrelevance["error_type"]
            details["error_message"] = irrelevance["error_message"]
        valid = result["valid"] and (irrelevance["valid"] or not self.env.check_irrelevance)
        return EpisodeScore(1.0 if valid else 0.0, valid, details)
