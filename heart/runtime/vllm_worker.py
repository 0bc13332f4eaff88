"""The vLLM engine in a worker process: run by ``.venv-vllm/bin/python`` (never imported by heart).

vLLM lives in its own environment (it pins an older transformers), so the runtime drives it
as a child process speaking JSON lines: one request line per batch on stdin, one reply line
per batch on stdout. Prompts arrive as token ids rendered by the parent's tokenizer, so
peft and vLLM decode from identical inputs; each row carries its role's ``LoRARequest``
(multi-LoRA: ``max_loras`` = number of adapters). stdout is kept for the protocol: anything
vLLM prints goes to stderr.

    request:  {"rows": [{"prompt_token_ids": [...], "adapter": "planner"|null, "max_tokens": 64,
                         "temperature": 0.0, "top_p": 1.0, "seed": null, "guided_json": null}]}
    reply:    {"rows": [{"token_ids": [...], "text": "...", "finish_reason": "stop"}]} | {"error": "..."}

Started with one JSON argument: {"model", "adapters": {role: path}, "max_lora_rank",
"stop_token_ids", "dtype", "max_model_len"}. It writes {"ready": true} once loaded.
"""

import json
import os
import sys


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints and logs go to stderr
    spec = json.loads(sys.argv[1])

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import StructuredOutputsParams

    adapters = spec["adapters"]
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), enforce_eager=True,
              enable_lora=bool(adapters), max_loras=max(1, len(adapters)), max_lora_rank=spec["max_lora_rank"],
              max_model_len=spec.get("max_model_len", 4096), seed=0)
    loras = {role: LoRARequest(role, i + 1, os.path.abspath(path)) for i, (role, path) in enumerate(adapters.items())}
    protocol.write(json.dumps({"ready": True}) + "\n")

    for line in sys.stdin:
        try:
            rows = json.loads(line)["rows"]
            params = []
            for row in rows:
                structured = StructuredOutputsParams(json=row["guided_json"]) if row.get("guided_json") else None
                params.append(SamplingParams(
                    max_tokens=row["max_tokens"], temperature=row["temperature"], top_p=row["top_p"],
                    seed=row.get("seed"), stop_token_ids=spec["stop_token_ids"], skip_special_tokens=True,
                    structured_outputs=structured))
            outputs = llm.generate([{"prompt_token_ids": row["prompt_token_ids"]} for row in rows], params,
                                   lora_request=[loras.get(row["adapter"]) for row in rows], use_tqdm=False)
            reply = {"rows": [{"token_ids": list(out.outputs[0].token_ids), "text": out.outputs[0].text,
                               "finish_reason": out.outputs[0].finish_reason} for out in outputs]}
        except Exception as err:  # a bad batch is answered with its error; the engine lives on
            reply = {"error": f"{type(err).__name__}: {err}"}
        protocol.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
