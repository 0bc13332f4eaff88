"""Which in-process engine serves the roles: transformers + peft, or llama.cpp.

Both take the same base name and the same role → peft adapter folders, validate the adapters
against the base before any weight loads, decode from the same prompt token ids and batch
continuously, so every caller (``heart run``, ``heart serve``, the evaluations, the pipeline)
switches engine with one argument.

* ``peft`` (:class:`heart.runtime.hf.TransformersBackend`): any transformers model, CPU or GPU,
  per-row adapters in one batch; the reference every other engine is compared against.
* ``llamacpp`` (:class:`heart.runtime.llamacpp.LlamaCppBackend`): GGUF bases on a CPU (the
  embedded SmolLM2 ships as one); on this project's 2-core CPU it answers the same role
  calls several times faster, with the same greedy answers at fp32 weights (measured:
  ``bench/runtime.py``, ``heart check parity --engines llamacpp``).
"""

from __future__ import annotations

ENGINES = ("peft", "llamacpp")


def local_backend(engine: str, model: str, adapters: dict[str, str] | None = None, max_batch_size: int = 8,
                  **options):
    """A backend on ``engine`` (see :data:`ENGINES`); ``options`` go to its constructor."""
    if engine == "peft":
        from heart.runtime.hf import TransformersBackend

        return TransformersBackend(model, adapters=adapters or {}, max_batch_size=max_batch_size, **options)
    if engine == "llamacpp":
        from heart.runtime.llamacpp import LlamaCppBackend

        return LlamaCppBackend(model, adapters=adapters or {}, max_batch_size=max_batch_size, **options)
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
