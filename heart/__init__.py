"""HEART: Planner → Router → Tool Primitive → Verifier over tools that really execute.

This package owns the loop (Algorithm 1 of the HEART paper), the four roles, ToolFace,
trace events, the runtime backends and the environments. It never imports `train` or
`eval` at module level.
"""

__version__ = "0.1.0"

ROLES = ("planner", "router", "primitive", "verifier")
