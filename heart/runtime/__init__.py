"""Runtime: the one interface that joins the loop to every model.

A backend answers ``generate(role, messages, ...)`` and ``generate_batch(requests)``.
Roles never know which backend serves them; teachers are backends too. ``BatchingBackend``
serves concurrent episodes' calls as batches; ``hf`` (transformers + peft), ``vllm_engine``
(vLLM in a worker process) and ``openai_compat`` are imported where they are used.
"""

from heart.runtime.base import Backend, Generation, GenerationRequest, SamplingConfig
from heart.runtime.scheduler import BatchingBackend


def __getattr__(name: str):
    # imported on first use, as every backend but the base interface and the scheduler is
    if name == "ScriptedBackend":
        from heart.runtime.scripted import ScriptedBackend

        return ScriptedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BatchingBackend", "Backend", "Generation", "GenerationRequest", "SamplingConfig", "ScriptedBackend"]
