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
  ``bench/runtime.py``, ``heart check parity --engines llamacpp``). ``llamacpp:f16`` (or
  another precision of :data:`heart.runtime.gguf_files.BASE_WEIGHTS`) names the base's
  weights: f16 is faster again at both prefill and decoding, and on the pipeline's held-out
  role inputs it gave the same answers as peft for 126 of 128 calls (docs/serving.md).
"""

from __future__ import annotations

ENGINES = ("peft", "llamacpp")
LLAMACPP_WEIGHTS = ("f32", "f16", "q8_0", "shipped")
"""Base precisions llama.cpp can run: :data:`heart.runtime.gguf_files.BASE_WEIGHTS`'s keys, written
out so that building a CLI parser does not import that module's numpy and ToolFace (~0.3 s); a
test checks they agree."""
ENGINE_SPECS = (*ENGINES, *(f"llamacpp:{w}" for w in LLAMACPP_WEIGHTS))
"""What ``--engine`` takes: an engine, or llama.cpp with its base weights' precision (bare ``llamacpp``: f32)."""


def local_backend(engine: str, model: str, adapters: dict[str, str] | None = None, max_batch_size: int = 8,
                  **options):
    """A backend on ``engine`` (one of :data:`ENGINE_SPECS`); ``options`` go to its constructor."""
    if engine not in ENGINE_SPECS:
        raise ValueError(f"engine must be one of {ENGINE_SPECS}, got {engine!r}")
    engine, _, weights = engine.partition(":")
    if weights:
        options = {"weights": weights, **options}
    if engine == "peft":
        from heart.runtime.hf import TransformersBackend

        return TransformersBackend(model, adapters=adapters or {}, max_batch_size=max_batch_size, **options)
    if engine == "llamacpp":
        from heart.runtime.llamacpp import LlamaCppBackend

        return LlamaCppBackend(model, adapters=adapters or {}, max_batch_size=max_batch_size, **options)
