"""The ``$step_j.field`` syntax that binds a step's argument to an earlier step's result.

One home for the grammar, imported by what writes references (the Router's input and
templates, :mod:`heart.roles.router`) and by what resolves them (:mod:`heart.primitives`),
light enough for the role modules to import.
"""

from __future__ import annotations

import re

FIELD_KEY = r"[A-Za-z0-9_\-]+"
"""One segment of a reference's field path: a key or a list index."""

REFERENCE = re.compile(rf"\$step_(\d+)((?:\.{FIELD_KEY})*)")
"""``$step_<j>`` and its field path (group 1: the step, group 2: ``.result.files.0``)."""
