"""Primitive families (HEELO): what a plan step may be, named without heavy imports.

HEELO generalises HEART's Tool Primitives into agent-native primitives that come in
families. Two here:

- ``tool``: wraps one of the environment's tools (HEART's Tool Primitive,
  :mod:`heart.primitives`): the Primitive role writes its arguments, they are bound to the
  tool's schema and the tool runs;
- ``code``: the Code primitive, :data:`CODE_PRIMITIVE`: the Primitive role writes one
  Python expression over named inputs — the results of earlier steps, bound by the Router
  as ``$step_j.field`` references — and :mod:`heart.sandbox` evaluates it (no imports, no
  I/O, bounded time, memory and output). A plan step names it as its ``tool_hint``, with
  ``"family": "code"``.

The roles import these names from here (not from :mod:`heart.primitives`, which pulls in
ToolFace).
"""

from __future__ import annotations

FAMILIES = ("tool", "code")
"""A primitive's family: ``tool`` wraps one of the environment's tools; ``code`` evaluates one
Python expression over earlier steps' results (:mod:`heart.sandbox`)."""
CODE_PRIMITIVE = "compute"
"""The Code primitive's name: what a code step's ``tool_hint`` names."""
CODE_CATEGORY = "code"
EXPRESSION_CHARS = 600
"""Longest expression the Primitive may write (the sandbox refuses past its own limit)."""
CODE_DESCRIPTION = ("Compute from earlier results: one Python expression over named inputs "
                    "(a sum, a product, a time span, a time as HH:MM).")
CODE_PARAMETERS = {"type": "object", "additionalProperties": False, "required": ["expression"],
                   "properties": {"expression": {"type": "string", "minLength": 1, "maxLength": EXPRESSION_CHARS}}}
"""What the Verifier's input shows as the code step's schema."""
CODE_FUNCTIONS = ("sum min max len round abs sorted int float str bool list dict set tuple range any all zip "
                  "enumerate reversed; numbers(text) number(text) minutes(text) clock(text) hhmm(minutes) "
                  "minutes_between(a, b) days_between(a, b); reading methods of str, dict, list")
"""What an expression may call (the Primitive's tool card says it)."""


def family(name: str) -> str:
    """The family of the primitive a step names."""
    return "code" if name == CODE_PRIMITIVE else "tool"
