"""The four HEART roles: each one prompt template, one parser and one output model."""

from heart.roles import planner, primitive, router, verifier

FORMATS_VERSION = 2
"""Version of the roles' input and answer formats and of the gold teacher's wording: bumped
whenever one changes, so that content-addressed stages (``heart pipeline``) built under
another version run again instead of being reused (2: whole-sentence fields, one request
template, the step-mode Router)."""

ROLE_MODULES = {"planner": planner, "router": router, "primitive": primitive, "verifier": verifier}

__all__ = ["FORMATS_VERSION", "ROLE_MODULES", "planner", "primitive", "router", "verifier"]
