"""How a HEART turn runs: the loop's settings, declared once.

:class:`LoopConfig` is the one declaration of every loop setting, with its one default. What
else names a setting is derived from its fields, as TRL's ``TrlParser`` (``HfArgumentParser``)
derives flags from dataclasses:

* the command-line flags of ``heart run``, ``heart collect`` and ``heart eval e2e``
  (:func:`heart_distill.arguments.loop_arguments`: name, type, choices, default and help
  from the field; :data:`POLICY` and :data:`TURN` name the ones each command takes);
* what run folders record about how their episodes ran (:meth:`LoopConfig.record`: a
  collection's ``manifest.json``, an evaluation's ``e2e-run.json``);
* the ``loop`` sections of recipes (the optimize recipe's ``loop``, the pipeline's
  ``eval.e2e[].loop``): their keys are the field names, checked like every recipe key
  (:func:`heart_distill.recipes.check_keys`), their values checked by the dataclass itself.

A field with ``help`` metadata is a user setting (it gets a flag); the others are set by the
code that serves the roles (``short_prompts``, a harness's ``prompt_edits``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from heart.roles import router


def setting(default: Any, help: str, *, flag: str | None = None, aliases: tuple[str, ...] = (),
            kind: str | None = None, metavar: str | None = None) -> Any:
    """A user setting: its default and its one-line help, and how its flag is spelt where the
    field's name would not do (``flag``; ``aliases`` for older spellings). ``kind`` names the
    :mod:`heart.argtypes` checker of a number's range ("positive_int", "nonnegative_int")."""
    return field(default=default, metadata={"help": help, "flag": flag, "aliases": aliases, "kind": kind,
                                            "metavar": metavar})


@dataclass(frozen=True)
class LoopConfig:
    """How one HEART turn runs."""

    replan_budget: int = setting(3, "re-plan budget B (attempts = B + 1)", flag="--replan-budget",
                                 aliases=("--budget",), kind="nonnegative_int", metavar="B")
    """B: how many times the Planner may re-plan after a FAIL (attempts = B + 1)."""
    max_clarifications: int = setting(2, "clarification questions the Planner may ask per turn",
                                      kind="nonnegative_int")
    retrieve_k: int | None = setting(None, "tools ToolFace ranks for the Planner (default: ToolFace's own, "
                                           "top 7 + companions, >= 9 shown)", kind="positive_int")
    """None keeps ToolFace's own setting (top 7, their companions, filled up to 9: ``RetrievalConfig``)."""
    max_plan_steps: int = setting(10, "longest plan the Planner may write", kind="positive_int")
    """10: the longest gold plans of the environments' tasks (AgentDojo travel/user_task_19) fit.
    Shorter is cheaper for a small model (the benchmark recipe sets 4 for its end-to-end runs)."""
    replan_tools: int = 3
    """Tools a re-plan adds to the Planner's list, retrieved for the latest feedback (0: the
    paper's one retrieval per query)."""
    verify: Literal["step", "attempt"] = setting(
        "step", "Verifier granularity: per step (Algorithm 1, default) or per whole attempt")
    """"step": Algorithm 1, one Verifier call per executed step, right after it runs;
    "attempt": all steps run, then one Verifier call judges the whole attempt."""
    short_prompts: tuple[str, ...] = ()
    """Roles served by context-distilled adapters: they get the short system prompt."""
    prefill: bool = setting(True, "without constraints, do not start answers with each role's JSON prefix",
                            flag="--no-prefill")
    """Start each answer with the role's RESPONSE_PREFIX (steers small base models into JSON)."""
    constrained: bool = setting(True, "do not constrain decoding to each role's JSON schema (on by default)",
                                flag="--no-constrain")
    """Constrain decoding to each role's output schema (``schema_for_input`` of its input);
    it supersedes ``prefill``. Backends that cannot constrain answer unconstrained."""
    code: bool = True
    """Show the Code primitive (HEELO's Code family, :mod:`heart.families`) to the Planner,
    so a step may compute a value from earlier results; False: tools only, as in HEART."""
    middleware: str = setting("default", "tool-boundary middleware (docs/middleware.md): default (the shipped "
                                         "silent corrections), none (arguments bound as given), or a YAML "
                                         "intercept file", metavar="PATH|default|none")
    """The tool-boundary intercept set (:mod:`heart.middleware`): "default" (the shipped
    silent corrections: type coercion, JSON unwrapping, enum case), "none" (arguments bound
    as given), or the path of a YAML intercept file (docs/middleware.md)."""
    messages: bool = setting(True, "no messages between primitives (a passed step's Primitive tells the steps "
                                   "that read its result which field they need; docs/primitives.md)")
    """Messages between primitives (HEELO, :mod:`heart.roles.primitive_messages`): a passed
    step whose result later steps read writes them messages (one more Primitive call);
    False: no messages, as in HEART."""
    validation: str = setting("default", "carried validation after execution (docs/primitives.md): default "
                                         "(the shipped mined result shapes + state-change checks), none, or a "
                                         "result-shapes file", metavar="PATH|default|none")
    """Carried validation after execution (:mod:`heart.validation`): "default" (the shipped
    mined result shapes, and state changes where the session exposes its state), "none" (no
    post-execution checks), or the path of a result-shapes file."""
    prompt_edits: tuple[tuple[str, str, str], ...] = ()
    """(role, "append" | "replace", text): a harness's edits of role system prompts
    (:mod:`heart.harness`, ``--harness``), applied to the prompt the role would get (the
    short one for context-distilled roles); other roles keep their shipped prompt."""
    relevance: bool = setting(False, "relevance before selection: ToolFace's top 20 each judge, in the "
                                     "Primitive's relevance mode, whether they apply; the Planner is shown "
                                     "those that do (<= 10; the gold teacher answers with gold relevance; "
                                     "docs/toolface.md)")
    """Relevance before selection (HEELO, :mod:`heart.relevance`): ToolFace's top
    ``relevance_candidates`` each judge, in the Primitive's relevance mode, whether they apply,
    and the Planner is shown those that do (at most ``relevance_shown``, best ToolFace rank
    first) instead of ToolFace's default list. Off by default (the default list is what the
    shipped figures measure). With the gold teacher, gold relevance: the turn's gold tools apply."""
    relevance_thresholds: str | None = setting(
        None, "with --relevance: relevance that only prunes ToolFace's default list, by the thresholds "
              "in PATH (bench/relevance_prune.py calibrates them on dev turns; docs/toolface.md)",
        metavar="PATH")
    """The prune policy (:func:`heart.relevance.prune`): ToolFace's default list stays the
    floor; a tool leaves it only when its P(applies) is below the file's ``prune_below``, a
    candidate joins only at ``add_above`` or more, and the shown tools carry their ``how``.
    None: the gate policy (the Planner sees the candidates that say they apply)."""
    relevance_candidates: int = 20
    """Candidates the relevance step judges."""
    relevance_shown: int = 10
    """Most applying candidates shown to the Planner."""
    router_mode: Literal["plan", "step"] = setting(
        router.DEFAULT_MODE, f"plan: one Router call dispatches the whole plan (HEART D.2); step: one call per "
                             f"step, after its dependencies ran, shown their results (default "
                             f"{router.DEFAULT_MODE}; docs/loop.md)")
    """"plan": one Router call dispatches the whole plan before any step runs (Appendix D.2);
    "step": one Router call per step, after its dependencies ran, with their results
    (Algorithm 1 line 9; see :mod:`heart.loop`)."""

    planner_form: Literal["plan", "subgoals"] = setting(
        "plan", "plan: the Planner answers with its plan (HEART D.1); subgoals: it first lists what the user "
                "asked for, one sub-goal per call, then one plan step per sub-goal (docs/loop.md)")
    """The Planner's answer form (:data:`heart.roles.planner.FORMS`): "subgoals" grounds the
    plan's length in the request; an adapter is trained in one form and served in it."""

    def __post_init__(self) -> None:
        if self.verify not in ("step", "attempt"):
            raise ValueError(f"verify must be 'step' or 'attempt', got {self.verify!r}")
        if self.planner_form not in ("plan", "subgoals"):
            raise ValueError(f"planner_form must be 'plan' or 'subgoals', got {self.planner_form!r}")
        if self.router_mode not in router.MODES:
            raise ValueError(f"router_mode must be one of {', '.join(router.MODES)}, got {self.router_mode!r}")
        for name in ("replan_budget", "max_clarifications", "replan_tools"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("max_plan_steps", "relevance_candidates", "relevance_shown"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.retrieve_k is not None and (not isinstance(self.retrieve_k, int) or self.retrieve_k < 1):
            raise ValueError(f"retrieve_k must be an integer >= 1 or None, got {self.retrieve_k!r}")
        if self.relevance_thresholds is not None:
            if not self.relevance:
                raise ValueError("relevance_thresholds is the prune policy of relevance before selection: "
                                 "turn relevance on (--relevance) to use it")
            from heart.relevance import Thresholds

            Thresholds.load(self.relevance_thresholds)  # a bad file fails here, before any episode

    def record(self, names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The settings ``names`` (default: every field) as run folders record them: a file
        named by ``middleware``, ``validation`` or ``relevance_thresholds`` also with the
        sha256 of its content, so an edited file counts as another setting (an unset
        ``relevance_thresholds`` is left out). ValueError when such a file cannot be read."""
        names = names or tuple(f.name for f in dataclasses.fields(self))
        out = {name: getattr(self, name) for name in names}
        if out.get("relevance_thresholds", "") is None:  # unset: records (and resumes) of runs before it stay equal
            del out["relevance_thresholds"]
        if out.get("planner_form") == "plan":  # the default form: records of runs before the setting stay equal
            del out["planner_form"]
        for name in ("middleware", "validation", "relevance_thresholds"):
            if out.get(name) is not None:
                out[f"{name}_sha256"] = _file_sha256(name, out[name])
        return out

    def check_files(self, catalog: Any) -> None:
        """Refuse, before any episode runs, a middleware file that does not fit ``catalog``
        (the environment's tools) or a validation file that is not a result-shapes file
        (MiddlewareError / ShapesFormatError: UserErrors naming the file and field)."""
        from heart.middleware import load_middleware

        load_middleware(self.middleware, catalog=catalog)
        if self.validation not in ("default", "none"):
            from heart.validation import load_result_shapes

            load_result_shapes(self.validation)


def user_settings() -> list[dataclasses.Field]:
    """The fields of :class:`LoopConfig` a user sets (those with help: each has a flag)."""
    return [f for f in dataclasses.fields(LoopConfig) if "help" in f.metadata]


POLICY = ("replan_budget", "verify", "middleware", "relevance", "relevance_thresholds", "messages", "validation",
          "router_mode", "planner_form")
"""How the loop judges, re-plans and meets the tools: the settings every command that runs
episodes takes (``heart collect`` too, whose teacher answers every role)."""
TURN = ("max_clarifications", "max_plan_steps", "retrieve_k", "constrained")
"""What a served model is allowed per turn: ``heart run`` and ``heart eval e2e`` take these
beside :data:`POLICY` (``heart run`` also ``prefill``, for backends that cannot constrain)."""


def _file_sha256(name: str, value: str) -> str | None:
    """The content hash of the file ``value`` names (None for the keywords default and none)."""
    if value in ("default", "none"):
        return None
    try:
        return hashlib.sha256(Path(value).read_bytes()).hexdigest()
    except OSError as err:
        raise ValueError(f"{name} {value}: cannot read it ({err.strerror})") from None
