"""What every role's gold answers share: the per-turn state the teacher follows the loop
with, the Router's h-params, and the wording helpers — every natural-language field one
short, whole sentence from one template."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from heart.environments.base import ToolCall
from heart.grounding import grounded
from heart.roles import relevance, router
from heart.roles.common import first_clause, lead_phrase, quoted_value, whole_parts


QUOTED = re.compile(r"""['"‘“]([^'"’”]{1,60})['"’”]""")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def purpose_phrase(description: str, limit: int | None = None) -> str:
    """A short verb phrase from a tool description (its first sentence, lowercased); with
    ``limit``, its leading phrase within that many characters (:func:`lead_phrase`)."""
    text = " ".join(description.split("Tool description:")[-1].split())
    sentence = text.split(". ")[0].rstrip(".…").strip()
    if limit is not None:
        sentence = lead_phrase(sentence, limit)
    return sentence[:1].lower() + sentence[1:] if sentence else ""


def code_objective(objective: str) -> str:
    """A code step's objective: the task's own sentence for its computation, as a whole clause."""
    return as_sentence(first_clause(objective, STEP_OBJECTIVE_CHARS) or "Compute the value the answer needs")


def as_sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a final period."""
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else ""


_REQUEST = re.compile(r"\?|\b(please|could you|can you|would you|i need|i want|i'd like|help me|let's)\b", re.I)


def request_sentence(query: str) -> str:
    """The sentence of ``query`` that asks for something (a question, "please", "could
    you", …), else its first: an objective, not a greeting."""
    sentences = re.split(r"(?<=[.?!])\s", query)
    return next((s for s in sentences if _REQUEST.search(s)), sentences[0])


value_text = quoted_value


def in_schema_order(arguments: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``arguments`` in the parameter order of the tool's schema: constrained decoding
    writes properties in schema order, so the teacher does too."""
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(arguments.items(), key=lambda kv: rank.get(kv[0], len(rank))))


TASK_CHARS = 60
OBJECTIVE_CHARS = 80
STEP_OBJECTIVE_CHARS = 64
# The teacher writes every natural-language field as a complete, short sentence, shorter
# than the schema allows (every token of an answer is one the student must learn to produce),
# and from one template per field: a field whose wording is drawn at random is loss that can
# never fall. Parts that do not fit are dropped whole (whole_parts), never cut, so no field
# holds a clause cut off with "…" (`heart datasets build` refuses one).
PURPOSE_CHARS = 40
"""A tool's purpose inside feedback: its description's first phrase (:func:`purpose_phrase`)."""
SUBGOAL_PURPOSE_CHARS = 24
"""A sub-goal's purpose phrase (the rest of :data:`heart.roles.planner.SUBGOAL_CHARS` holds its values)."""
MAX_CONSTRAINTS = 2
DETAILS_CHARS = 80
"""A failure's details quoted in Verifier feedback: its first clause, if that fits."""


def gold_how(calls: Sequence[ToolCall], request: str) -> str:
    """A compact "how" for a tool the turn's gold ``calls`` use: the parameters they fill
    from the request's own words, then those filled from context (earlier results, the
    conversation, or inferred)."""
    names = list(dict.fromkeys(n for c in calls for n in c.arguments))
    from_request = [n for n in names if any(grounded(c.arguments.get(n), request) for c in calls
                                            if c.arguments.get(n) is not None)]
    rest = [n for n in names if n not in from_request]
    parts = ([f"fills {', '.join(from_request)} from the request"] if from_request else []) \
        + ([f"{', '.join(rest)} from context"] if rest else [])
    return whole_parts(parts, lambda kept: "; ".join(kept) or "runs without arguments", relevance.HOW_CHARS)


def same_value(shown: Any, value: Any) -> bool:
    """Whether a listed upstream field holds exactly the gold ``value`` (a number matching its
    text too); a list or object value is never one field."""
    if value is None or isinstance(value, (dict, list)) or isinstance(shown, (dict, list)):
        return False
    if isinstance(shown, bool) or isinstance(value, bool):
        return shown is value
    return shown == value or str(shown) == str(value)


def h_params(tool: str) -> dict[str, Any]:
    """The gold Router's h-params, derived from the tool: retries (3) for idempotent reads
    only — a write retried after a timeout could run twice —, priority "normal" (raised to
    "high" for a step whose result a later step reads), the default timeout."""
    return {"retry": 3 if router.is_read_only(tool) else 1, "priority": "normal", "timeout_s": router.DEFAULT_TIMEOUT_S}


@dataclass
class TurnState:
    """Where the teacher is in one user turn: which gold calls passed, what the current plan
    covers, which faults it carries."""

    turn: int
    consumed: int = 0
    """Gold calls of the turn that ran and passed verification."""
    faults: int = 0
    plan_calls: list[ToolCall] = field(default_factory=list)
    """The gold calls the current plan covers, in order (step i ↔ plan_calls[i-1])."""
    pending: list[tuple[int, ToolCall]] = field(default_factory=list)
    """Dispatched (step, call) pairs whose Primitive has not answered yet."""
    primitive_faults: dict[int, str] = field(default_factory=dict)
    """Plan step → fault its Primitive will carry out."""
    injected: dict[int, str] = field(default_factory=dict)
    """Plan step → fault injected into it in the current attempt (Router or Primitive)."""
    plan_indices: list[int] = field(default_factory=list)
    """Index (in the turn's calls) of each call of the current plan (step i ↔ plan_indices[i-1])."""
    code_dropped: bool = False
    """The turn's computations are not planned (the Code primitive is not shown)."""
    composites: list | None = None
    """Library composites shown to the turn's first plan: the turn's calls use them."""
