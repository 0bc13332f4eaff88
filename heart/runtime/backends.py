"""From a model string and role adapters to a backend: :func:`backend_for`, the one way.

Every command names the model that answers the roles with a string (``heart run --model``,
``heart serve --model``, ``heart collect --teacher``, ``heart eval --roles teacher:SPEC``), and
the strings mean the same thing everywhere::

    gold                      the gold-guided teacher (heart_distill.data.gold_teacher); it
                              answers from one task's gold calls, so the commands that run
                              tasks build it per task: backend_for refuses it
    openai:<url>#<model>      any OpenAI-compatible server (heart.runtime.openai_compat); the
                              server serves its own adapters
    hf:<model>                an in-process model: the same as <model> alone
    <model>                   an embedded name (smollm2-135m, tiny-qwen3), a local folder or a
                              hub id, served in process with the role adapters on ``engine``

``engine`` is one of :data:`SERVING_ENGINES`: transformers + peft, llama.cpp with its base
weights' precision (:data:`heart.runtime.engines.ENGINE_SPECS`), or vLLM in a worker process.

A model or adapter that cannot be found or loaded ends in a :class:`heart.user_errors.UserError`
whose one line names it: the libraries underneath answer a typo with a long traceback
(transformers' hub error while offline, peft's adapter checks), and every command prints a
UserError as one line.
"""

from __future__ import annotations

import contextlib
import os
from typing import Mapping

from heart.runtime.engines import ENGINE_SPECS, local_backend
from heart.runtime.openai_compat import OpenAIBackend, TeacherSpec, parse_teacher_spec
from heart.user_errors import UserError

SERVING_ENGINES = (*ENGINE_SPECS, "vllm")
"""What ``engine`` takes: an in-process engine (:data:`ENGINE_SPECS`) or vLLM in a worker process."""

EMBEDDED_NAMES = "smollm2-135m, tiny-qwen3"
"""The embedded models, written out so that an error message does not import heart.models."""

GOLD = "gold"


def parse_model_spec(spec: str) -> TeacherSpec:
    """The kind of model ``spec`` names: ``gold``, ``openai`` (url + model) or ``hf`` (an
    in-process model, also for a bare name); ValueError naming the spec when it is malformed."""
    spec = spec.strip()
    if not spec:
        raise ValueError("no model named: expected 'gold', 'openai:<url>#<model>', 'hf:<model>' or a model "
                         "name, folder or hub id")
    if spec == GOLD or spec.startswith(("hf:", "openai:")):
        return parse_teacher_spec(spec)
    return TeacherSpec(kind="hf", model=spec)


def built_per_task(spec: str) -> bool:
    """Whether ``spec`` names the gold teacher, which needs the task: callers that otherwise
    build one backend for every episode build this one per episode."""
    return spec.strip() == GOLD


def backend_for(spec: str, adapters: Mapping[str, str] | None = None, engine: str = "peft", *,
                max_batch_size: int = 8, quantize: str | None = None, **options):
    """The backend ``spec`` names (see the module docstring), serving ``adapters`` (role →
    peft adapter folder) when it runs in process.

    ``max_batch_size`` and ``quantize`` are the in-process engine's: a server and the gold
    teacher do not batch rows in this process nor hold weights. ``options`` go to the
    constructor of the backend ``spec`` names: ``task`` and ``tools`` (both needed),
    ``fault_rate``, ``seed``, ``composites`` for the gold teacher; ``api_key``, ``timeout_s``
    for a server; ``device``, ``dtype``, ... for an in-process engine. Raises UserError naming
    what is wrong: a malformed spec, an unknown engine, adapters for a model that cannot take
    them, or a model or adapter that cannot be loaded.
    """
    try:
        parsed = parse_model_spec(spec)
    except ValueError as err:
        raise UserError(str(err)) from None
    adapters = dict(adapters or {})
    if parsed.kind == "gold":
        _refuse_adapters(adapters, "the gold teacher")
        return _gold_teacher(**options)
    if parsed.kind == "openai":
        _refuse_adapters(adapters, "an OpenAI-compatible server (it serves its own adapters)")
        return OpenAIBackend(parsed.url, parsed.model, **options)
    return _in_process(engine, parsed.model, adapters, max_batch_size, quantize, **options)


def _refuse_adapters(adapters: dict[str, str], what: str) -> None:
    if adapters:
        raise UserError(f"adapters {adapters} apply to in-process models only, not to {what}")


def _gold_teacher(**options):
    raise UserError("model 'gold' is the gold-guided teacher: it answers from one task's gold calls, so it is built "
                    "per task (with the task and its tools) by the commands that run tasks (heart run, collect, eval; "
                    "heart_distill.data.gold_teacher), not once for every task")


def _in_process(engine: str, model: str, adapters: dict[str, str], max_batch_size: int, quantize: str | None,
                **options):
    if engine not in SERVING_ENGINES:
        raise UserError(f"engine must be one of {SERVING_ENGINES}, got {engine!r}")
    if quantize:
        if engine != "peft":  # int8 dynamic quantisation is torch's, on transformers' linears
            raise UserError(f"quantize {quantize!r} is a peft-engine option; the engine is {engine}")
        options["quantize"] = quantize
    with _load_errors_named(model, adapters):
        if engine == "vllm":  # vLLM schedules its own batches in the worker
            from heart.runtime.vllm_engine import VLLMBackend

            return VLLMBackend(model, adapters=adapters, **options)
        return local_backend(engine, model, adapters, max_batch_size, **options)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


@contextlib.contextmanager
def _load_errors_named(model: str, adapters: dict[str, str]):
    """Loading ``model`` with ``adapters``: what the libraries raise becomes a UserError naming them."""
    try:
        yield
    except FileNotFoundError as err:  # a missing model folder, or an adapter without adapter_config.json
        raise UserError(str(err).strip('"')) from None
    except OSError as err:  # transformers: not a folder, not cached, and no download allowed / possible
        if _offline():
            raise UserError(f"model {model!r} is not an embedded model ({EMBEDDED_NAMES}), not a local "
                            "folder, and not in the Hugging Face cache; downloads are off "
                            "(HF_HUB_OFFLINE=1)") from None
        raise UserError(f"cannot load model {model!r}: {str(err).splitlines()[0]}") from None
    except (ValueError, RuntimeError, KeyError) as err:  # a broken adapter folder, or one for another base
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = f" with adapters {adapters}" if adapters else ""
        raise UserError(f"cannot load model {model!r}{where}: {first_line}") from None
