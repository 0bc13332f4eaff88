"""Runtime: the one interface that joins the loop to every model.

A backend answers ``generate(role, messages, ...)`` and ``generate_batch(requests)``.
Roles never know which backend serves them; teachers are backends too.
"""

from heart.runtime.base import Backend, Generation, GenerationRequest, SamplingConfig
from heart.runtime.scripted import ScriptedBackend

__all__ = ["Backend", "Generation", "GenerationRequest", "SamplingConfig", "ScriptedBackend"]
