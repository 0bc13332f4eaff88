"""Which models answer the roles in an evaluation: ``base``, an adapters folder, or a teacher.

    base                      the unadapted base model (``--model``, default smollm2-135m)
    runs/NAME/adapters        one peft adapter per role found under it (<dir>/<role>/), on
                              the base its manifests name; a joint adapter (<dir>/joint/,
                              heart train --joint) serves the roles it trained on that have
                              none of their own; roles without one use the base
    teacher:gold              the gold-guided teacher (end to end only: it needs the task)
    teacher:openai:<url>#<m>  any OpenAI-compatible server;  teacher:hf:<model>  a local model

A role whose adapter was trained on the short system prompt (context distillation, its
manifest's ``system_prompt``) is served with that prompt, as at training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heart_distill.eval.formats import ROLES


@dataclass
class RoleModels:
    """The resolved ``--roles`` argument."""

    spec: str
    """As given on the command line."""
    label: str
    """"base", "distilled" or "teacher": the column this run fills in the report."""
    model: str
    """The base model (embedded name, folder or hub id); the teacher's spec for a teacher."""
    adapters: dict[str, str] = field(default_factory=dict)
    """Role → adapter folder."""
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Role → the adapter's manifest.json (provenance for the report)."""
    short_prompts: tuple[str, ...] = ()
    """Roles served with their SHORT_SYSTEM_PROMPT (their adapters were trained on it)."""
    teacher: str | None = None
    """The teacher spec after ``teacher:`` (gold, openai:…, hf:…)."""


def resolve_role_models(spec: str, model: str = "smollm2-135m") -> RoleModels:
    """Read ``--roles`` (see the module docstring); raises ValueError / FileNotFoundError
    naming what is wrong."""
    if spec == "base":
        return RoleModels(spec, "base", model)
    if spec.startswith("teacher:"):
        from heart.runtime.openai_compat import parse_teacher_spec

        teacher = spec[len("teacher:"):]
        parse_teacher_spec(teacher)  # raises ValueError with the accepted forms
        return RoleModels(spec, "teacher", teacher, teacher=teacher)
    folder = Path(spec)
    if not folder.is_dir():
        raise FileNotFoundError(f"--roles {spec!r}: expected 'base', 'teacher:SPEC' or an adapters folder "
                                f"(<dir>/<role>/adapter_config.json); {folder} is not a folder")
    adapters, manifests = {}, {}
    for role in ROLES:
        if (folder / role / "adapter_config.json").is_file():
            adapters[role] = str(folder / role)
            manifest = folder / role / "manifest.json"
            manifests[role] = json.loads(manifest.read_text()) if manifest.is_file() else {}
    joint = folder / "joint"
    if (joint / "adapter_config.json").is_file() and (joint / "manifest.json").is_file():
        # one adapter for every role it trained on (heart train --joint); a role's own adapter wins
        manifest = json.loads((joint / "manifest.json").read_text())
        modes = manifest.get("dataset", {}).get("input_modes") or {}
        for role in manifest.get("roles") or []:
            if role in ROLES and role not in adapters:
                adapters[role] = str(joint)
                manifests[role] = {**manifest, "dataset": {**manifest.get("dataset", {}),
                                                           "input_modes": modes.get(role)}}
    if not adapters:
        raise FileNotFoundError(f"--roles {spec!r}: no <role>/adapter_config.json (or joint/) under {folder} "
                                f"(roles: {', '.join(ROLES)})")
    bases = {m.get("base_model", {}).get("name") for m in manifests.values()} - {None}
    if len(bases) > 1:
        raise ValueError(f"--roles {spec!r}: adapters were trained on different bases {sorted(bases)}")
    short = tuple(r for r, m in manifests.items() if m.get("system_prompt") == "short")
    return RoleModels(spec, "distilled", bases.pop() if bases else model, adapters, manifests, short)


def served_modes(loop) -> dict[str, tuple[str, str]]:
    """Role → (the input mode ``loop`` (a :class:`heart.settings.LoopConfig`) serves it, the
    flag that sets it), for the roles whose mode is a loop setting."""
    return {"planner": (loop.planner_form, "--planner-form"), "router": (loop.router_mode, "--router-mode"),
            "verifier": (loop.verify, "--verify")}


def check_served_modes(models: RoleModels, loop) -> None:
    """ValueError when an adapter would be served inputs of a mode it never trained on (its
    manifest's ``dataset.input_modes``): the Router trained in step mode served whole plans,
    the Planner trained in the sub-goals form asked for plain plans. Adapters whose
    manifests predate the record are not checked."""
    for role, (mode, flag) in served_modes(loop).items():
        trained = models.manifests.get(role, {}).get("dataset", {}).get("input_modes")
        if trained and not trained.get(mode):
            seen = [name for name, n in trained.items() if n]
            raise ValueError(f"the {role} adapter {models.adapters[role]} was trained on {' and '.join(seen)} "
                             f"inputs only, and this run serves it {mode} inputs: pass {flag} {seen[0]} "
                             f"(or --allow-other-modes to measure it outside what it learnt)")


def shared_backend(models: RoleModels, max_batch_size: int = 8, engine: str = "peft"):
    """One backend for every call, or None for the gold teacher (built per task). ``engine``
    serves the base and its adapters, or an ``hf:`` teacher, in process
    (:data:`heart.runtime.backends.SERVING_ENGINES`)."""
    from heart.runtime.backends import backend_for, built_per_task

    if models.teacher is not None and built_per_task(models.teacher):
        return None
    return backend_for(models.teacher or models.model, models.adapters, engine, max_batch_size=max_batch_size)


class UnadaptedView:
    """A backend answering every role with the unadapted base: the ``base`` side of a paired
    run that shares one in-process model with the distilled side (peft serves rows named
    ``base`` without an adapter, the name ``heart serve`` gives the base too). Both sides'
    pending calls then decode in one mixed-adapter batch instead of one side after the other."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.name = f"{backend.name} (unadapted)"

    def generate(self, role: str, messages, sampling=None):
        return self.backend.generate("base", messages, sampling)

    def generate_batch(self, requests):
        import dataclasses

        return self.backend.generate_batch([dataclasses.replace(r, role="base") for r in requests])

    def client(self):
        return self.backend.client()


def shared_backends(models: list[RoleModels], max_batch_size: int, engine: str = "peft") -> list[Any]:
    """One backend per side run together (e.g. base and distilled), or None where a side
    builds its own. In-process sides on the same base, at most one of them adapted, share one
    model behind one batching scheduler (an :class:`UnadaptedView` for the base side): their
    calls decode in the same batches instead of one side after the other."""
    from heart.runtime.scheduler import BatchingBackend

    local = [m for m in models if m.teacher is None]
    adapted = [m for m in local if m.adapters]
    if len(local) < 2 or len(adapted) > 1 or len({m.model for m in local}) > 1:
        return [None] * len(models)
    shared = BatchingBackend(shared_backend((adapted or local)[0], max_batch_size, engine),
                             max_batch_size=max_batch_size)
    return [None if m.teacher is not None else shared if m.adapters else UnadaptedView(shared) for m in models]


def check_sides_agree(configs: list[Any]) -> None:
    """Sides run together answer the same inputs: every setting but ``roles_spec`` and
    ``out`` must match (ValueError naming the ones that differ)."""
    import dataclasses

    first = configs[0]
    for other in configs[1:]:
        differs = [f.name for f in dataclasses.fields(first) if f.name not in ("roles_spec", "out")
                   and getattr(other, f.name) != getattr(first, f.name)]
        if differs:
            raise ValueError(f"sides run together must share every setting but --roles/--out; {differs} differ")


def with_base_side(config: Any, base_out: str | None) -> list[Any]:
    """``[config]``, plus the unadapted base on the same inputs into ``base_out`` when given
    (``--base-out``); ValueError when ``config`` is the base already."""
    import dataclasses

    if not base_out:
        return [config]
    if config.roles_spec == "base":
        raise ValueError("--base-out runs the base beside --roles; --roles is already base")
    return [config, dataclasses.replace(config, roles_spec="base", out=base_out)]
