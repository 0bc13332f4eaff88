"""TransformersBackend: one base model in-process, one LoRA adapter per role (peft).

The base is loaded once; each role's adapter is loaded next to it under the role's name, and
a role without an adapter is answered by the base with every adapter disabled. A batch that
mixes roles runs in one ``generate`` call through peft's ``adapter_names`` (``"__base__"``
for roles without an adapter).

Heavy imports (torch, transformers, peft) live in this module only: ``heart.runtime`` does
not import it, so the loop and the unit tests stay light.

On a CPU shared with other jobs, torch's default of one thread per core oversubscribes:
measured here, greedy decoding ran ~7x slower with 2 threads than with
``OMP_NUM_THREADS=1`` while other processes held the cores (the caller sets threads; this
module does not touch the process-wide setting).

Try it::

    HF_HUB_OFFLINE=1 python -c "from heart.runtime.hf import TransformersBackend; \\
        print(TransformersBackend().generate('planner', [{'role': 'user', 'content': 'Hi'}]))"
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from heart.models import DEFAULT_MODEL, model_content_hash, resolve_model
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig

BASE_ADAPTER = "__base__"
"""peft's name for "no adapter" in ``generate(..., adapter_names=[...])``."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_adapter_folder(role: str, path: str) -> None:
    """Fail on a bad adapter folder before any weight is loaded, naming the role."""
    if role == BASE_ADAPTER:
        raise ValueError(f"{BASE_ADAPTER!r} is reserved by peft and cannot name a role")
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"adapter for role {role!r}: no adapter_config.json in {path}")
    peft_type = json.loads(config.read_text()).get("peft_type")
    if peft_type != "LORA":
        raise ValueError(f"adapter for role {role!r} at {path} is {peft_type}, not LORA")


class TransformersBackend:
    """Answers role calls with a transformers model plus per-role peft LoRA adapters.

    ``model`` is an embedded name (``smollm2-135m``, ``tiny-qwen3``), a local folder or a
    Hugging Face id (see :func:`heart.models.resolve_model`). ``adapters`` maps role →
    adapter folder. ``dtype="auto"`` is float32 on CPU (bf16 has no fast path on CPUs
    without AMX: ~9x slower) and bfloat16 on CUDA. ``enable_thinking`` is passed to the
    chat template: Qwen3 thinks only when asked; templates without the variable ignore it.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        adapters: dict[str, str] | None = None,
        device: str | None = None,
        dtype: str = "auto",
        enable_thinking: bool = False,
        max_batch_size: int = 8,
    ):
        self.adapters = {role: str(path) for role, path in (adapters or {}).items()}
        for role, path in self.adapters.items():
            _check_adapter_folder(role, path)
        self.enable_thinking = enable_thinking
        self.max_batch_size = max_batch_size
        self._model_id = model
        self.model_path = resolve_model(model)
        self.name = f"hf:{model}"
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        elif dtype in DTYPES:
            torch_dtype = DTYPES[dtype]
        else:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"  # decoder-only batches grow to the right
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        base.to(self.device)
        self.stop_token_ids = self._stop_token_ids(base)

        if self.adapters:
            from peft import PeftModel

            first, *rest = self.adapters
            peft_model = PeftModel.from_pretrained(base, self.adapters[first], adapter_name=first)
            for role in rest:
                peft_model.load_adapter(self.adapters[role], adapter_name=role)
            self.model = peft_model
            self._active_adapter: str | None = first
        else:
            self.model = base
            self._active_adapter = None
        self._grammar_compiler = None
        self._grammars: dict[str, object] = {}
        self.model.eval()

    @property
    def base_model_id(self) -> str:
        """The base model as named by the caller: embedded name, folder or hub id."""
        return self._model_id

    @property
    def base_model_hash(self) -> str | None:
        """Content hash of the base weights (None for a hub id): adapters record it."""
        return model_content_hash(self.model_path)

    def roles_with_adapters(self) -> list[str]:
        return list(self.adapters)

    def _stop_token_ids(self, model) -> list[int]:
        """EOS of the tokenizer and the generation config plus the template's end of turn."""
        ids: list[int] = []
        candidates = [self.tokenizer.eos_token_id, model.generation_config.eos_token_id]
        candidates.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        for value in candidates:
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is not None and token_id != self.tokenizer.unk_token_id:
                    if token_id not in ids:
                        ids.append(token_id)
        return ids

    def render(self, messages: list[Message]) -> str:
        """The exact prompt text a role call sends to the model."""
        # A final assistant message is a prefill: the model continues it (the Generation's
        # text is then the continuation only).
        prefilled = messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not prefilled,
            continue_final_message=prefilled,
            enable_thinking=self.enable_thinking,
        )

    def generate(
        self, role: str, messages: list[Message], sampling: SamplingConfig | None = None
    ) -> Generation:
        request = GenerationRequest(role, messages, sampling or SamplingConfig())
        return self._generate_chunk([request])[0]

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Left-padded batches of at most ``max_batch_size``, one group per sampling config.

        Each Generation's ``latency_s`` is the wall time of the batch that served it.
        """
        groups: dict[SamplingConfig, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            groups[request.sampling].append(i)
        results: list[Generation | None] = [None] * len(requests)
        for indices in groups.values():
            for start in range(0, len(indices), self.max_batch_size):
                chunk = indices[start : start + self.max_batch_size]
                generations = self._generate_chunk([requests[i] for i in chunk])
                for i, generation in zip(chunk, generations):
                    results[i] = generation
        return results  # type: ignore[return-value]

    def _generate_chunk(self, requests: list[GenerationRequest]) -> list[Generation]:
        """One ``generate`` call for requests that share a sampling config."""
        sampling = requests[0].sampling
        start = time.perf_counter()
        prompts = [self.render(r.messages) for r in requests]
        # The template already holds the special tokens (SmolLM2 would add none anyway).
        inputs = self.tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        adapter_names = [r.role if r.role in self.adapters else BASE_ADAPTER for r in requests]

        kwargs = {}
        if len(set(adapter_names)) > 1:
            kwargs["adapter_names"] = adapter_names
            context = nullcontext()
        elif adapter_names[0] == BASE_ADAPTER:
            context = self.model.disable_adapter() if self.adapters else nullcontext()
        else:
            if self._active_adapter != adapter_names[0]:
                self.model.set_adapter(adapter_names[0])
                self._active_adapter = adapter_names[0]
            context = nullcontext()

        config = self._generation_config(sampling)
        if sampling.temperature > 0 and sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode(), context:
            processors, meta = self._guided(sampling.guided_json, len(requests))
            output = self.model.generate(**inputs, generation_config=config, logits_processor=processors, **kwargs)
        latency = time.perf_counter() - start

        prompt_len = inputs["input_ids"].shape[1]
        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        stops = set(self.stop_token_ids)
        generations = []
        for row, request, adapter_name, n_prompt in zip(
            output, requests, adapter_names, prompt_tokens
        ):
            new = row[prompt_len:].tolist()
            # Tokens after the first stop token are padding of a finished row.
            length = next((j + 1 for j, t in enumerate(new) if t in stops), len(new))
            generations.append(
                Generation(
                    text=self.tokenizer.decode(new[:length], skip_special_tokens=True),
                    backend=self.name,
                    adapter=None if adapter_name == BASE_ADAPTER else adapter_name,
                    prompt_tokens=int(n_prompt),
                    completion_tokens=length,
                    latency_s=latency,
                    meta=meta,
                )
            )
        return generations

    def _guided(self, schema: str | None, batch: int) -> tuple[list, dict]:
        """xgrammar logits processors that keep every answer inside ``schema``.

        Grammars are compiled once per schema and cached; a schema xgrammar cannot compile
        is reported in the Generation's meta and the call runs unconstrained.
        """
        if schema is None:
            return [], {}
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor

        if schema not in self._grammars:
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.model.config.vocab_size,
                                                          stop_token_ids=self.stop_token_ids)
                self._grammar_compiler = xgr.GrammarCompiler(info)
            try:
                # Compact JSON with json.dumps' separators: what teachers write and adapters
                # learn, and no tokens spent on indentation.
                self._grammars[schema] = self._grammar_compiler.compile_json_schema(
                    schema, any_whitespace=False, separators=(", ", ": "))
            except Exception as err:  # an exotic tool schema: answer unconstrained, say so
                self._grammars[schema] = f"{type(err).__name__}: {err}"
        grammar = self._grammars[schema]
        if isinstance(grammar, str):
            return [], {"guided_json_error": grammar[:300]}
        return [LogitsProcessor([grammar] * batch)], {}

    def _generation_config(self, sampling: SamplingConfig) -> GenerationConfig:
        common = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if sampling.temperature == 0:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, **common
        )
