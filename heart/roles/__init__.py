"""The four HEART roles: each one prompt template, one parser and one output model."""

from heart.roles import planner, primitive, router, verifier

ROLE_MODULES = {"planner": planner, "router": router, "primitive": primitive, "verifier": verifier}

__all__ = ["ROLE_MODULES", "planner", "primitive", "router", "verifier"]
