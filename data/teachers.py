"""Teachers: backends that answer every role well enough to learn from, built per episode.

A teacher string names one (``heart collect --teacher``, :func:`heart.runtime.openai_compat.parse_teacher_spec`);
:func:`heart.runtime.backends.backend_for` builds it, as it builds every command's backend,
except the gold teacher, which this side builds (:mod:`heart_distill.data.gold_teacher`):

- ``gold`` — the gold-guided teacher, :class:`heart_distill.data.gold_teacher.GoldTeacher`: it answers
  from the task's gold calls, with optional fault injection (``--fault-rate``) so the traces
  hold real failures, real Verifier FAILs and real recoveries; one is built per episode;
- ``openai:<url>#<model>`` — any chat-completions endpoint (:mod:`heart.runtime.openai_compat`);
- ``hf:<model>`` — any transformers model by id or folder (:mod:`heart.runtime.hf`), shared by
  concurrent episodes through the batching scheduler.

A teacher is a backend like any other, so collection runs the very loop inference runs.

The gold teacher can take a **student** (``--student base|ADAPTERS``, ``--student-rate``): a
model, served once for every episode, whose Primitive answers at some steps replace the gold
ones, so the traces hold that model's real mistakes, executed and judged (natural faults,
:class:`heart_distill.data.gold_teacher.GoldTeacher`).
"""

from __future__ import annotations

import contextlib

from heart.runtime.backends import backend_for
from heart.runtime.openai_compat import parse_teacher_spec
from heart_distill.data.gold_teacher import GoldTeacher, gold_teacher_name


class TeacherFactory:
    """Builds the backend for one episode from a teacher string (``gold``,
    ``openai:<url>#<model>``, ``hf:<model>``): the gold teacher is per task, others shared."""

    def __init__(self, spec: str, fault_rate: float, environment, quantize: str | None = None,
                 max_batch_size: int = 8, student: str | None = None, student_rate: float = 0.0,
                 student_engine: str = "llamacpp:f16"):
        self.spec = parse_teacher_spec(spec)  # a teacher is one of the three forms, not a bare model name
        if fault_rate and self.spec.kind != "gold":
            raise ValueError(f"--fault-rate applies to the gold teacher only, not to {spec!r}")
        if student and self.spec.kind != "gold":
            raise ValueError(f"--student applies to the gold teacher only, not to {spec!r}")
        if bool(student) != bool(student_rate):
            raise ValueError("--student and --student-rate go together: a student needs a rate above 0, "
                             "and a rate a student")
        self.fault_rate = fault_rate
        self.environment = environment
        self._shared = None
        self._student = None
        self.student_rate = student_rate
        if student:
            self._student, self.student_name, self.student_short = _student_backend(student, student_engine,
                                                                                    max_batch_size)
        if self.spec.kind == "openai":
            self._shared = backend_for(spec)
        elif self.spec.kind == "hf":
            from heart.runtime.scheduler import BatchingBackend

            # Concurrent episodes share the one in-process model through the scheduler,
            # which serves their pending role calls as mixed-role batches.
            self._shared = BatchingBackend(backend_for(spec, max_batch_size=max_batch_size, quantize=quantize),
                                           max_batch_size=max_batch_size)

    @property
    def name(self) -> str:
        """The teacher's backend name, as it appears in traces and episode ids."""
        if self._shared is not None:
            return self._shared.name
        return gold_teacher_name(self.fault_rate, self.student_name if self._student else None, self.student_rate)

    def client(self):
        """Context for one episode: registers it with the batching scheduler (hf teachers, a
        gold teacher's student)."""
        shared = self._shared if self.spec.kind == "hf" else self._student
        return shared.client() if shared is not None else contextlib.nullcontext()

    def __call__(self, task, seed: int):
        if self._shared is None:  # gold: phrasing and faults vary with the episode's seed
            student = {} if self._student is None else {
                "student": self._student, "student_rate": self.student_rate, "student_short": self.student_short,
                "student_name": self.student_name}
            return GoldTeacher(task, self.environment.catalog(), fault_rate=self.fault_rate, seed=seed, **student)
        return self._shared


def _student_backend(spec: str, engine: str, max_batch_size: int):
    """(backend, name, short prompt?) of a student: ``base`` or an adapters folder (as ``heart
    eval --roles`` reads it), one model behind the batching scheduler for every episode. Its
    name, which enters the teacher's and so the episodes' ids, is ``base`` or ``distilled-``
    and a hash of the Primitive adapter's weights, so other adapters never resume these traces."""
    import hashlib
    from pathlib import Path

    from heart.runtime.scheduler import BatchingBackend
    from heart_distill.eval.models import resolve_role_models, shared_backend

    models = resolve_role_models(spec)
    name = "base"
    if models.adapters:
        if "primitive" not in models.adapters:
            raise ValueError(f"--student {spec!r}: no primitive adapter under it (the student answers Primitive steps)")
        weights = Path(models.adapters["primitive"]) / "adapter_model.safetensors"
        digest = hashlib.sha256(weights.read_bytes() if weights.is_file() else spec.encode()).hexdigest()
        name = f"distilled-{digest[:8]}"
    backend = BatchingBackend(shared_backend(models, max_batch_size, engine), max_batch_size=max_batch_size)
    return backend, name, "primitive" in models.short_prompts


__all__ = ["GoldTeacher", "TeacherFactory", "gold_teacher_name"]
