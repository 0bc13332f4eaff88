"""The four HEART roles: each one prompt template, one parser and one output model.

What callers ask of a role (prompts, parser, schema, messages) goes through its
:class:`~heart.roles.registry.Role` (:data:`REGISTRY`, :func:`get_role`), not through a role
module found by name.
"""

from heart.roles import planner, primitive, router, verifier
from heart.roles.registry import PLANNER, PRIMITIVE, REGISTRY, ROLE_NAMES, ROUTER, VERIFIER, Mode, Role, get_role

FORMATS_VERSION = 2
"""Version of the roles' input and answer formats: bumped whenever one changes, so that
content-addressed stages (``heart pipeline``) and the whole-loop benchmark's chunks built under
another version run again instead of being reused (2: whole-sentence fields, one request
template, the step-mode Router). The gold teacher's wording has its own version
(``heart_distill.data.TEACHER_WORDING_VERSION``)."""

ROLE_MODULES = {name: role.module for name, role in REGISTRY.items()}
"""Role name → its own module (older callers; new ones ask the :class:`Role`)."""

__all__ = ["FORMATS_VERSION", "PLANNER", "PRIMITIVE", "REGISTRY", "ROLE_MODULES", "ROLE_NAMES", "ROUTER", "VERIFIER",
           "Mode", "Role", "get_role", "planner", "primitive", "router", "verifier"]
