"""A harness: what surrounds a fixed model in the HEART loop — each role's system prompt and
the tool-boundary middleware — saved as a folder that ``heart run --harness`` and
``heart eval e2e --harness`` load.

PRISM ("Beyond Prompts: Measuring and Optimizing LLM Tool-Agent Harnesses") searches this
surface without retraining; ``heart optimize`` writes the harness it selects in this form::

    HARNESS/harness.yaml     format, name, prompts (per role: append or replace), middleware
    HARNESS/middleware.yaml  the intercept set (heart/middleware.py), when it is not default/none

``harness.yaml``::

    format: heart-harness/1
    name: bfcl-simple-s0r1
    prompts:
      router: {append: "Use only parameter names of the tool's schema."}
      verifier: {replace: "You are the Verifier ..."}
    middleware: middleware.yaml        # a path relative to this folder, or default / none

A role without an entry keeps its shipped prompt (``heart/roles/<role>.py``); ``append``
adds to the prompt the role gets (the short one for a context-distilled adapter). The loop
reads a harness as two :class:`heart.loop.LoopConfig` fields, ``prompt_edits`` and
``middleware``; this module is their one loader.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from heart.roles.registry import ROLE_NAMES
from heart.user_errors import UserError

FORMAT = "heart-harness/1"
FILE = "harness.yaml"
MIDDLEWARE_FILE = "middleware.yaml"
ROLES = ROLE_NAMES
"""The roles a harness may edit: the registry's (this name is what callers import)."""
EDITS = ("append", "replace")


class HarnessError(UserError):
    """A harness that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Harness:
    """Prompt edits per role plus one intercept set."""

    name: str = "shipped"
    prompts: tuple[tuple[str, str, str], ...] = ()
    """(role, "append" | "replace", text), at most one per role."""
    middleware: str = "default"
    """default | none | the path of an intercept file."""
    middleware_text: str | None = None
    """The intercept file's YAML when the harness carries its own (saved as middleware.yaml)."""
    notes: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def fingerprint(self) -> str:
        """A content hash: two harnesses with the same prompts and intercepts are the same."""
        body = json.dumps({"prompts": sorted(self.prompts),
                           "middleware": self.middleware_text if self.middleware_text is not None else self.middleware},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:12]

    def describe(self) -> str:
        parts = [f"{role}:{edit}" for role, edit, _ in self.prompts]
        if self.middleware_text is not None:
            parts.append(f"middleware:{len(yaml.safe_load(self.middleware_text).get('intercepts') or [])} intercepts")
        else:
            parts.append(f"middleware:{self.middleware}")
        return ", ".join(parts)


def _parse_prompts(data: Any, source: str) -> tuple[tuple[str, str, str], ...]:
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise HarnessError(f"{source}: prompts: expected a mapping role → {{append|replace: TEXT}}")
    out = []
    for role, edit in data.items():
        if role not in ROLES:
            raise HarnessError(f"{source}: prompts.{role}: unknown role; one of {', '.join(ROLES)}")
        if not isinstance(edit, dict) or len(edit) != 1 or next(iter(edit)) not in EDITS:
            raise HarnessError(f"{source}: prompts.{role}: expected exactly one of {', '.join(EDITS)}")
        kind, text = next(iter(edit.items()))
        if not isinstance(text, str) or not text.strip():
            raise HarnessError(f"{source}: prompts.{role}.{kind}: expected non-empty text")
        out.append((role, kind, text.strip()))
    return tuple(out)


def load_harness(path: str | Path, catalog=None) -> Harness:
    """The harness in folder ``path`` (or its ``harness.yaml``); with ``catalog`` (the
    environment's tool specs) its intercepts are checked against the environment's tools."""
    from heart.middleware import load_middleware

    path = Path(path)
    file = path / FILE if path.is_dir() else path
    if not file.is_file():
        raise HarnessError(f"{file}: no harness file (give a folder holding {FILE}, or the file)")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise HarnessError(f"{file}: not YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{file}: expected a mapping with format, name, prompts, middleware")
    unknown = set(data) - {"format", "name", "prompts", "middleware", "notes"}
    if unknown:
        raise HarnessError(f"{file}: {sorted(unknown)[0]}: unknown field; allowed: format, name, prompts, middleware, notes")
    if data.get("format") != FORMAT:
        raise HarnessError(f"{file}: format: must be {FORMAT!r}, got {data.get('format')!r}")
    prompts = _parse_prompts(data.get("prompts"), str(file))
    middleware = str(data.get("middleware", "default"))
    text = None
    if middleware not in ("default", "none"):
        target = (file.parent / middleware).resolve()
        if not target.is_file():
            raise HarnessError(f"{file}: middleware: no such intercept file {target}")
        load_middleware(target, catalog=catalog)  # refused here, naming its file and field
        middleware, text = str(target), target.read_text()
    elif catalog is not None:
        load_middleware(middleware, catalog=catalog)
    return Harness(str(data.get("name", file.parent.name)), prompts, middleware, text, dict(data.get("notes") or {}))


def save_harness(harness: Harness, folder: str | Path) -> Path:
    """Write ``harness`` as a folder (harness.yaml, plus middleware.yaml when it carries one)."""
    from heart.atomic import publish_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    middleware = harness.middleware
    if harness.middleware_text is not None:
        publish_text(folder / MIDDLEWARE_FILE, harness.middleware_text)
        middleware = MIDDLEWARE_FILE
    doc = {"format": FORMAT, "name": harness.name,
           "prompts": {role: {edit: text} for role, edit, text in harness.prompts} or None,
           "middleware": middleware}
    if harness.notes:
        doc["notes"] = harness.notes
    publish_text(folder / FILE, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100))
    return folder


def loop_fields(harness: Harness | None) -> dict[str, Any]:
    """The LoopConfig fields a harness sets (none: the shipped prompts and default middleware)."""
    if harness is None:
        return {}
    return {"prompt_edits": harness.prompts, "middleware": harness.middleware}
