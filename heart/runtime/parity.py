"""``heart check parity``: the same greedy answers from peft, vLLM, llama.cpp and the int8 path, per role.

For each role with an adapter in ``--adapters DIR`` (``DIR/<role>``), the same prompts go to
the reference (peft, fp32, one call at a time) and to each other engine; answers are
compared token for token (the completion's token ids under the base's tokenizer). vLLM must
match the reference exactly for every role (exit 1 otherwise); llama.cpp (fp32 GGUF weights,
its own kernels) and the int8 path are CPU speed options whose agreement is reported, not
required: a different summation order may flip a near-tie.

    heart check parity --adapters runs/NAME/adapters [--model smollm2-135m] [--engines vllm,llamacpp,int8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from heart import ROLES
from heart.argtypes import positive_int
from heart.runtime.base import GenerationRequest, SamplingConfig

QUESTIONS = (
    "List the files in the current directory, then open the largest one.",
    "Book the cheapest flight from Paris to Rome tomorrow and tell me the price.",
)
REQUIRED = {"vllm"}
"""Engines that must agree exactly; the others are reported."""


def role_requests(roles: list[str], max_new_tokens: int) -> list[GenerationRequest]:
    """Two prompts per role: the role's short system prompt and a user request."""
    from heart.roles.registry import get_role

    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    requests = []
    for role in roles:
        system = get_role(role).system_prompt(short=True)
        for question in QUESTIONS:
            requests.append(GenerationRequest(role, [{"role": "system", "content": system},
                                                     {"role": "user", "content": question}], sampling))
    return requests


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_parity(model: str, adapters_dir: str, engines: list[str], max_new_tokens: int = 16,
                 vllm_log: str | None = None) -> dict:
    from heart.runtime.hf import TransformersBackend

    folder = Path(adapters_dir)
    adapters = {role: str(folder / role) for role in ROLES if (folder / role / "adapter_config.json").is_file()}
    if not adapters:
        raise FileNotFoundError(f"no role adapters in {folder} (expected {folder}/<role>/adapter_config.json "
                                f"for roles {list(ROLES)})")
    requests = role_requests(list(adapters), max_new_tokens)
    reference = TransformersBackend(model, adapters=adapters)
    tokenizer = reference.tokenizer
    # vLLM computes in the reference's dtype (bf16 on a GPU, fp32 on a CPU): parity across dtypes means little
    dtype = "bfloat16" if reference.device.type == "cuda" else "float32"
    expected = [reference.generate(r.role, r.messages, r.sampling) for r in requests]
    # The base's own answers: parity means little if the adapters did not change anything.
    base = [reference.generate("base", r.messages, r.sampling) for r in requests]
    del reference
    report = {"model": model, "adapters": adapters, "max_new_tokens": max_new_tokens,
              "adapter_answers_differing_from_base": f"{sum(e.text != b.text for e, b in zip(expected, base))}"
                                                    f"/{len(requests)}", "engines": {}}
    for engine in engines:
        if engine == "vllm":
            from heart.runtime.vllm_engine import VLLMBackend

            with VLLMBackend(model, adapters=adapters, log=vllm_log, dtype=dtype) as backend:
                answers = backend.generate_batch(requests)
        elif engine == "llamacpp":
            from heart.runtime.llamacpp import LlamaCppBackend

            backend = LlamaCppBackend(model, adapters=adapters)
            answers = [backend.generate(r.role, r.messages, r.sampling) for r in requests]
        elif engine == "int8":
            answers = _int8_answers(model, adapters, requests)
        else:
            raise ValueError(f"unknown engine {engine!r}: expected vllm, llamacpp or int8")
        per_role: dict[str, dict] = {}
        for request, want, got in zip(requests, expected, answers):
            a = tokenizer(want.text, add_special_tokens=False)["input_ids"]
            b = tokenizer(got.text, add_special_tokens=False)["input_ids"]
            diff = first_difference(a, b)
            entry = per_role.setdefault(request.role, {"prompts": 0, "identical": 0, "first_differences": []})
            entry["prompts"] += 1
            entry["identical"] += diff is None
            if diff is not None:
                entry["first_differences"].append({"token": diff, "reference": want.text[:80], "got": got.text[:80]})
        report["engines"][engine] = {"required": engine in REQUIRED, "roles": per_role,
                                     "identical": all(e["identical"] == e["prompts"] for e in per_role.values())}
    report["passed"] = all(e["identical"] for name, e in report["engines"].items() if name in REQUIRED)
    return report


def _int8_answers(model: str, adapters: dict[str, str], requests: list[GenerationRequest]):
    from heart.runtime.hf import TransformersBackend

    backend = TransformersBackend(model, adapters=adapters, quantize="int8")
    return [backend.generate(r.role, r.messages, r.sampling) for r in requests]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart check parity", description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", required=True, help="folder with one adapter folder per role")
    parser.add_argument("--model", default="smollm2-135m", help="the base the adapters were trained on")
    parser.add_argument("--engines", default="vllm,int8", help="comma-separated: vllm, llamacpp, int8")
    parser.add_argument("--max-new-tokens", type=positive_int, default=16)
    parser.add_argument("--vllm-log", help="append the vLLM worker's log here")
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args(argv)
    try:
        report = check_parity(args.model, args.adapters, [e for e in args.engines.split(",") if e],
                              args.max_new_tokens, args.vllm_log)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    for engine, result in report["engines"].items():
        counts = ", ".join(f"{role} {e['identical']}/{e['prompts']}" for role, e in result["roles"].items())
        print(f"parity {engine} vs peft: {counts}{'' if result['required'] else ' (reported, not required)'}",
              file=sys.stderr)
    print(f"parity: {'PASS' if report['passed'] else 'FAIL'}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
