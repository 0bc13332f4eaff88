"""Role outputs in the Appendix D field names that every metric reads.

The metrics (:mod:`eval.metrics`) read one shape per role — the Appendix D formats the roles serve:

- Planner: ``status`` SUFFICIENT | INSUFFICIENT, ``plan`` of ``{step, tool_hint, dependencies}``;
- Router: ``dispatch`` of ``{step, target_tool, resolved_bindings, h_params{retry, priority, timeout_s}}``
  with ``retry`` in [1, 5] attempts, ``priority`` in low | normal | high, ``timeout_s`` an integer;
- Primitive: ``{tool, arguments}`` or ``{status: UNRESOLVABLE, tool, reason}``;
- Verifier: ``{status: PASS | FAIL, step, criteria: {name: pass | fail}, feedback}``.

Traces and datasets in the older role formats use other names (``tool``/``depends_on``,
``verdict`` with boolean criteria, integer priorities and 0-based retries).
:func:`canonical` maps those onto the names above, so the same metric code scores both;
an output already in the new names passes through unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from heart import ROLES
from heart.roles.router import PRIORITIES
from heart.roles.verifier import CRITERIA

__all__ = ["CRITERIA", "PRIORITIES", "ROLES", "canonical"]

_LEGACY_PRIORITY = {0: "normal", 1: "high", 2: "high"}


def canonical(role: str, output: dict[str, Any] | None) -> dict[str, Any] | None:
    """``output`` (a parsed role answer) in the Appendix D names; None stays None."""
    if output is None:
        return None
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: expected one of {ROLES}")
    out = copy.deepcopy(output)
    if role == "planner":
        for step in out.get("plan") or []:
            if "tool_hint" not in step and "tool" in step:
                step["tool_hint"] = step.pop("tool")
            if "dependencies" not in step and "depends_on" in step:
                step["dependencies"] = step.pop("depends_on")
    elif role == "router":
        for entry in out.get("dispatch") or []:
            h = entry.get("h_params")
            # The older format's priority is an int and its retry counts re-tries (0-3), not attempts.
            if isinstance(h, dict) and isinstance(h.get("priority"), int) and not isinstance(h.get("priority"), bool):
                h["priority"] = _LEGACY_PRIORITY.get(h["priority"], "high")
                if isinstance(h.get("retry"), int):
                    h["retry"] = h["retry"] + 1
    elif role == "verifier":
        if "status" not in out and "verdict" in out:
            out["status"] = out.pop("verdict")
        criteria = out.get("criteria")
        if isinstance(criteria, dict):
            out["criteria"] = {name: ("pass" if value is True else "fail" if value is False else value)
                               for name, value in criteria.items()}
    return out
