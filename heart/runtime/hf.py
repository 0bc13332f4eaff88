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

import dataclasses
import time
from collections import defaultdict
from contextlib import nullcontext
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from heart.models import DEFAULT_MODEL, resolve_model
from heart.runtime.adapters import MAX_SERVING_RANK, validate_role_adapters
from heart.runtime.base import Generation, GenerationRequest, SamplingConfig
from heart.runtime.chat import BASE_ADAPTER, AdapterEngine, ChatFormat, first_token_logprobs

KV_CACHES = ("auto", "static", "dynamic")
"""KV cache of ``generate``. "static" preallocates prompt + max_new_tokens per batch: the
default "dynamic" cache grows each layer's keys and values with ``torch.cat`` every step,
which copies the whole cache — measured on the 2-core CPU at batch 8 with ~700-token
prompts, half of a decoding step's time; the static cache made steps ~30% faster with the
same greedy tokens. "auto": static on CPU, dynamic on CUDA."""

DECODINGS = ("continuous", "generate")
"""How greedy requests decode. "continuous": :class:`~heart.runtime.continuous.ContinuousDecoder`,
rows join and leave the batch every step; "generate": ``transformers``' ``generate`` in
left-padded batches of ``max_batch_size`` that decode until their longest row stops (the
reference the parity test compares against). Sampled requests always use ``generate``.
With ``reuse_prefixes`` (continuous only) each role's system prompt is prefilled once per
adapter and its keys and values reused by every later call that starts with it."""

QUANTIZE = (None, "int8")
"""Base-weight formats: None keeps the loaded dtype; "int8" is dynamic int8 on CPU."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quantize_linears_int8(model: torch.nn.Module) -> int:
    """Replace the base's linear layers by dynamic-int8 ones in place; LoRA stays exact.

    Decoding on a CPU is bound by the bytes of weights read per token, and int8 weights are
    a quarter of fp32's. Inside a peft LoRA layer only ``base_layer`` is replaced, so the
    role's low-rank update (lora_A, lora_B) still runs in fp32 on top of it; the output head
    is quantised too (a fifth of SmolLM2's weights). Activations are quantised per call
    (dynamic), so no calibration data is needed. Returns how many layers were replaced.
    """
    import warnings

    from torch.ao.quantization import quantize_dynamic

    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and "lora_" not in name]
    with warnings.catch_warnings():
        # torch.ao's eager quantisation is deprecated in favour of torchao (not installed
        # here); in torch 2.13 it still works and is the fastest int8 path on this CPU.
        warnings.simplefilter("ignore")
        for name, linear in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            quantized = quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)[0]
            setattr(parent, child, quantized)
    return len(targets)


class TransformersBackend(AdapterEngine):
    """Answers role calls with a transformers model plus per-role peft LoRA adapters.

    ``model`` is an embedded name (``smollm2-135m``, ``tiny-qwen3``), a local folder or a
    Hugging Face id (see :func:`heart.models.resolve_model`). ``adapters`` maps role →
    adapter folder. ``dtype="auto"`` is float32 on CPU (bf16 has no fast path on CPUs
    without AMX: ~9x slower) and bfloat16 on CUDA. ``enable_thinking`` is passed to the
    chat template: Qwen3 thinks only when asked; templates without the variable ignore it.
    ``quantize="int8"`` (CPU) makes the base's linears dynamic int8 with each role's LoRA
    kept exact on top (:func:`quantize_linears_int8`); the backend's name gains ``+int8``.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        adapters: dict[str, str] | None = None,
        device: str | None = None,
        dtype: str = "auto",
        enable_thinking: bool = False,
        max_batch_size: int = 8,
        quantize: str | None = None,
        max_adapter_rank: int = MAX_SERVING_RANK,
        kv_cache: str = "auto",
        decoding: str = "continuous",
        reuse_prefixes: bool = True,
    ):
        if quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {QUANTIZE}, got {quantize!r}")
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {decoding!r}")
        self.decoding = decoding
        self.reuse_prefixes = reuse_prefixes
        self._prefix_cache: dict = {}
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
        self.adapters = {role: str(path) for role, path in (adapters or {}).items()}
        self.enable_thinking = enable_thinking
        self.max_batch_size = max_batch_size
        self._model_id = model
        self.model_path = resolve_model(model)
        # Every adapter is checked against this base before any weight (base or adapter) loads.
        validate_role_adapters(model, self.model_path, self.adapters, max_adapter_rank, reserved=BASE_ADAPTER)
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
        self.chat = ChatFormat(self.tokenizer, base.config.vocab_size, base.generation_config.eos_token_id,
                               enable_thinking)
        self.stop_token_ids = self.chat.stop_token_ids

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
        self.quantize = quantize
        if quantize == "int8":
            if self.device.type != "cpu":
                raise ValueError(f"quantize='int8' is a CPU path (dynamic int8 linears); device is {self.device}")
            quantize_linears_int8(self.model)
            self.name += "+int8"
        self.kv_cache = ("static" if self.device.type == "cpu" else "dynamic") if kv_cache == "auto" else kv_cache
        self.model.eval()

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Batches of at most ``max_batch_size`` rows, mixing roles and schemas.

        Each row keeps its own adapter (peft ``adapter_names``), its own JSON-schema grammar
        and its own ``max_new_tokens``. Greedy requests decode continuously (``decoding``,
        see :data:`DECODINGS`); the others are grouped by how they decode (temperature,
        top_p, seed) into left-padded ``generate`` batches that run to their largest budget,
        each row cut at its own. ``latency_s`` is how long the request took: until its row
        left the batch (continuous), or the wall time of its ``generate`` batch.
        """
        results: list[Generation | None] = [None] * len(requests)
        greedy = [i for i, r in enumerate(requests) if r.sampling.temperature == 0]
        if self.decoding == "continuous" and greedy:
            for i, generation in zip(greedy, self._decode_all([requests[i] for i in greedy])):
                results[i] = generation
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            s = request.sampling
            if results[i] is None:
                groups[(s.temperature, s.top_p, s.seed)].append(i)
        for indices in groups.values():
            for start in range(0, len(indices), self.max_batch_size):
                chunk = indices[start : start + self.max_batch_size]
                generations = self._generate_chunk([requests[i] for i in chunk])
                for i, generation in zip(chunk, generations):
                    results[i] = generation
        return results  # type: ignore[return-value]

    def _decode_rows(self, rows, poll=None, on_finish=None) -> None:
        """Greedy rows through :class:`~heart.runtime.continuous.ContinuousDecoder` (the
        shared :meth:`~heart.runtime.chat.AdapterEngine.decode_stream` and ``_decode_all``
        drive it)."""
        with torch.inference_mode():
            self._decoder().run(rows, poll=poll, on_finish=on_finish)

    def _stream_batch_size(self) -> int:
        return self.last_decode_stats.max_running

    def _decoder(self):
        from heart.runtime.continuous import ContinuousDecoder

        decoder = ContinuousDecoder(self._forward_last, self._mask_to_grammars, self.stop_token_ids,
                                    self.tokenizer.pad_token_id, max_batch_size=self.max_batch_size,
                                    prefix_cache=self._prefix_cache if self.reuse_prefixes else None)
        self.last_decode_stats = decoder.stats
        return decoder

    def _row(self, request: GenerationRequest, owner: object = None):
        """A request as the decoder's Row: prompt ids, adapter, budget and grammar matcher."""
        from heart.runtime.continuous import Row

        if request.sampling.temperature != 0:
            raise ValueError(f"continuous decoding is greedy; a {request.role} request asks for "
                             f"temperature {request.sampling.temperature}")
        ids, matcher, meta, adapter = self._prompt(request)
        return Row(ids, adapter, request.sampling.max_new_tokens, matcher, owner=owner,
                   prefix_len=self.chat.system_prefix_len(request.messages, ids), meta=meta,
                   scored=self.chat.single_token_ids(request.sampling.first_token_logprobs))

    def _forward_last(self, input_ids, attention_mask, position_ids, cache, adapter_names: list[str]) -> torch.Tensor:
        """Logits of each row's last position, each row through its own adapter."""
        kwargs, context = self._adapter_routing(adapter_names)
        with context:
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                             position_ids=position_ids.to(self.device), cache=cache, use_cache=True,
                             logits_to_keep=1, **kwargs)
        return out.logits[:, -1, :].float()

    @staticmethod
    def _mask_to_grammars(rows, logits: torch.Tensor) -> torch.Tensor:
        """Each constrained row's logits masked to what its grammar allows next."""
        from heart.runtime.grammar import mask_to_grammars

        return mask_to_grammars([row.matcher for row in rows], logits)

    def _adapter_routing(self, adapter_names: list[str]):
        """(forward kwargs, context) that route each row to its adapter (or the bare base)."""
        if len(set(adapter_names)) > 1:
            return {"adapter_names": adapter_names}, nullcontext()
        if adapter_names[0] == BASE_ADAPTER:
            return {}, (self.model.disable_adapter() if self.adapters else nullcontext())
        if self._active_adapter != adapter_names[0]:
            self.model.set_adapter(adapter_names[0])
            self._active_adapter = adapter_names[0]
        return {}, nullcontext()

    def _generate_chunk(self, requests: list[GenerationRequest]) -> list[Generation]:
        """One ``generate`` call for requests that share temperature, top_p and seed."""
        sampling = requests[0].sampling
        sampling = dataclasses.replace(
            sampling, max_new_tokens=max(r.sampling.max_new_tokens for r in requests), guided_json=None)
        start = time.perf_counter()
        prompts = [self.render(r.messages) for r in requests]
        # The template already holds the special tokens (SmolLM2 would add none anyway).
        inputs = self.tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        adapter_names = [self._adapter(r.role) for r in requests]
        kwargs, context = self._adapter_routing(adapter_names)

        config = self._generation_config(sampling)
        if sampling.temperature > 0 and sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode(), context:
            processors, metas = self._guided([r.sampling.guided_json for r in requests])
            scored = [self.chat.single_token_ids(r.sampling.first_token_logprobs) for r in requests]
            output = self.model.generate(**inputs, generation_config=config, logits_processor=processors,
                                         output_logits=any(scored), return_dict_in_generate=True, **kwargs)
        latency = time.perf_counter() - start
        for i, ids in enumerate(scored):
            if ids:  # raw logits of the first generated position (output_logits: before any processor)
                metas[i] = {**metas[i], "first_token_logprobs": first_token_logprobs(
                    output.logits[0][i].float().cpu().numpy(), ids)}

        prompt_len = inputs["input_ids"].shape[1]
        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        stops = set(self.stop_token_ids)
        generations = []
        for row, request, adapter_name, n_prompt, meta in zip(
            output.sequences, requests, adapter_names, prompt_tokens, metas
        ):
            new = row[prompt_len:].tolist()[: request.sampling.max_new_tokens]
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
                    meta={**meta, "batch_size": len(requests)} if len(requests) > 1 else meta,
                )
            )
        return generations

    def _guided(self, schemas: list[str | None]) -> tuple[list, list[dict]]:
        """Logits processors that keep each row inside its own schema (None: unconstrained)."""
        grammars = [None if s is None else self.chat.grammar(s) for s in schemas]
        metas = [{"guided_json_error": g[:300]} if isinstance(g, str) else {} for g in grammars]
        compiled = [None if isinstance(g, str) else g for g in grammars]
        if all(g is None for g in compiled):
            return [], metas
        from heart.runtime.grammar import RowGrammarProcessor

        return [RowGrammarProcessor(compiled, self.model.config.vocab_size)], metas

    def _generation_config(self, sampling: SamplingConfig) -> GenerationConfig:
        common = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            cache_implementation=self.kv_cache,
        )
        if sampling.temperature == 0:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, **common
        )
