"""Teachers: backends that answer every role well enough to learn from, built per episode.

A teacher string names one (``heart collect --teacher``, :func:`heart.runtime.openai_compat.parse_teacher_spec`);
:func:`heart.runtime.backends.backend_for` builds it, as it builds every command's backend:

- ``gold`` — the gold-guided teacher, :class:`heart.runtime.scripted.GoldTeacher`: it answers
  from the task's gold calls, with optional fault injection (``--fault-rate``) so the traces
  hold real failures, real Verifier FAILs and real recoveries; one is built per episode;
- ``openai:<url>#<model>`` — any chat-completions endpoint (:mod:`heart.runtime.openai_compat`);
- ``hf:<model>`` — any transformers model by id or folder (:mod:`heart.runtime.hf`), shared by
  concurrent episodes through the batching scheduler.

A teacher is a backend like any other, so collection runs the very loop inference runs.
"""

from __future__ import annotations

import contextlib

from heart.runtime.backends import backend_for
from heart.runtime.openai_compat import parse_teacher_spec
from heart.runtime.scripted import GoldTeacher, gold_teacher_name


class TeacherFactory:
    """Builds the backend for one episode from a teacher string (``gold``,
    ``openai:<url>#<model>``, ``hf:<model>``): the gold teacher is per task, others shared."""

    def __init__(self, spec: str, fault_rate: float, environment, quantize: str | None = None,
                 max_batch_size: int = 8):
        self.spec = parse_teacher_spec(spec)  # a teacher is one of the three forms, not a bare model name
        if fault_rate and self.spec.kind != "gold":
            raise ValueError(f"--fault-rate applies to the gold teacher only, not to {spec!r}")
        self.fault_rate = fault_rate
        self.environment = environment
        self._shared = None
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
        return gold_teacher_name(self.fault_rate) if self._shared is None else self._shared.name

    def client(self):
        """Context for one episode: registers it with the batching scheduler (hf teachers)."""
        return self._shared.client() if self.spec.kind == "hf" else contextlib.nullcontext()

    def __call__(self, task, seed: int):
        if self._shared is None:  # gold: phrasing and faults vary with the episode's seed
            return backend_for("gold", task=task, tools=self.environment.catalog(), fault_rate=self.fault_rate,
                               seed=seed)
        return self._shared


__all__ = ["GoldTeacher", "TeacherFactory", "gold_teacher_name"]
