"""Reading and checking the YAML configs: role recipes, roles.yaml and the pipeline recipe.

One loader for all of them, so every config fails the same way, at load, naming the field:

* :func:`read_yaml` parses a file (a missing file, malformed YAML or a non-UTF-8 file is a
  :class:`RecipeError` naming the file and the line);
* :func:`check_keys` rejects keys that are not fields of the config's dataclass, in nested
  sections and lists of sections too (pydantic ignores unknown keys of a dataclass), with
  the closest known key; :func:`validate_sections` then validates the values with pydantic;
* :func:`load_roles` reads a ``roles.yaml`` (``{accelerate_config, roles: {role: recipe}}``).

:mod:`heart_distill.train.config` (a role's training recipe) and
:mod:`heart_distill.pipeline` (the pipeline recipe) both build on it. It imports no training
library: the CLI's parser and the pipeline import it without loading ``train``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from heart import ROLES

Role = Literal[ROLES]  # type: ignore[valid-type]  (a tuple subscript: one Literal of each role)

Config = TypeVar("Config")


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the field and the problem."""


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line: what the YAML parser objects to, and where."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or err}{where}"


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML file, or a RecipeError naming the file and the problem."""
    if not path.is_file():
        raise RecipeError(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: malformed YAML: {yaml_problem(err)}") from None
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not a UTF-8 text file ({err.reason})") from None


def check_keys(data: Any, cls: type, where: str = "", error: type[Exception] = RecipeError,
               what: str = "recipe") -> None:
    """Fail with ``error`` on a key that is not a field of the dataclass ``cls``, naming its
    dotted field and the closest known key. Sections (fields that are dataclasses) and lists
    of them (``eval.e2e.0.env``) are checked the same way. pydantic ignores unknown keys of a
    dataclass, so this runs before it; ``what`` names the whole document in messages.

    One checker for every YAML config: the training recipes (:mod:`heart_distill.train.config`)
    and the pipeline recipe (:mod:`heart_distill.pipeline`).
    """
    if not isinstance(data, dict):
        raise error(f"{where or what}: expected a mapping of {cls.__name__} fields, got {data!r}")
    fields = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        name = f"{where}.{key}" if where else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean '{where + '.' if where else ''}{close[0]}'?" if close else ""
            raise error(f"unknown key '{name}'{hint} (known: {', '.join(fields)})")
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            check_keys(value, kind, name, error, what)
        elif typing.get_origin(kind) is list and dataclasses.is_dataclass(item := typing.get_args(kind)[0]):
            for index, entry in enumerate(value if isinstance(value, list) else []):
                check_keys(entry, item, f"{name}.{index}", error, what)


def validate_sections(data: Any, cls: type[Config], source: str, error: type[Exception] = RecipeError,
                      what: str = "recipe") -> Config:
    """``data`` (a parsed YAML mapping) as the dataclass ``cls``: its keys checked by
    :func:`check_keys`, its values validated by pydantic; fails with ``error`` naming every
    offending field (``source``: the file, for the message)."""
    check_keys(data, cls, "", error, what)
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "constrained")))
            problems.append(f"'{loc}': {e['msg']} (got {e['input']!r})")
        raise error(f"{source}: invalid {what}: " + "; ".join(problems)) from None


def load_roles(path: str | Path) -> dict[str, Any]:
    """A ``roles.yaml``: {accelerate_config: path, roles: {role: recipe path}}, paths made absolute."""
    path = Path(path)
    data = read_yaml(path, "roles recipe") or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a roles recipe is a mapping {{accelerate_config: PATH, roles: "
                          f"{{ROLE: RECIPE}}}}, got {type(data).__name__}")
    unknown = set(map(str, data)) - {"accelerate_config", "roles"}
    if unknown:
        raise RecipeError(f"{path}: unknown key(s) {sorted(unknown)} (known: accelerate_config, roles)")
    roles = data.get("roles") or {}
    if not isinstance(roles, dict):
        raise RecipeError(f"{path}: 'roles' must map each role to its recipe file, got {type(roles).__name__}")
    bad = set(roles) - set(ROLES)
    if bad:
        raise RecipeError(f"{path}: 'roles' has unknown role(s) {sorted(map(str, bad))}")
    accelerate_config = data.get("accelerate_config")
    return {
        "accelerate_config": str(path.parent / accelerate_config) if accelerate_config else None,
        "roles": {role: str(path.parent / recipe) for role, recipe in roles.items()},
    }
