"""Does the Router end its answer? Held-out Router rows under the schema's previous and shipped bounds.

    python bench/router_termination.py                          # 12 validation rows, llama.cpp f16
    python bench/router_termination.py --limit 32 --engine peft

The same held-out Router rows (``--data``/router, ``--split``, a seeded sample of ``--limit``)
are answered by the unadapted base and by the distilled Router (``--adapters``/router), each
under two grammars: the Router's serving schema as shipped (:func:`heart.roles.router.schema_for_input`)
compiled as shipped (:mod:`heart.runtime.json_grammar`), and as served before: the binding
bounds it had (:data:`PREVIOUS_BOUNDS`, no bound on keys) compiled by xgrammar alone. Every
answer is decoded greedily with the role's budget (``eval.roles.MAX_NEW_TOKENS``), as
``heart eval roles`` decodes it. Per arm: answers that ended before the budget, answers the
Router's parser accepts, completion tokens, wall time, and the Router's binding exact match
against the teacher (micro over steps and arguments). Rows whose teacher answer alone is longer
than the budget are counted apart: no grammar makes those fit.

It also checks that the grammar as served still takes what the adapters were trained on: every
training target of the four roles (``--data``/<role>, all splits), tokenised as in training, is
fed token by token to a matcher of its row's compiled schema and must end it.

Written to ``--out`` (default ``runs/bench/router_termination.json``) under the run's stamp.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.roles import router  # noqa: E402  (after the path insert)
from heart.roles.common import role_input  # noqa: E402
import heart.runtime.chat  # noqa: E402
from heart.runtime.json_grammar import compile_answer_grammar  # noqa: E402
from heart_distill.eval.formats import ROLES  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "router_termination.json"
"""Where a run's result goes by default (runs/ is not tracked)."""

PREVIOUS_BOUNDS = {"maxLength": 512, "maxItems": 16, "maxProperties": 8}
"""The binding-value bounds before they were fitted to the collections' gold bindings."""


def served_grammars(previous: set[str]):
    """What ``heart.runtime.chat`` compiles a schema with: for the ``previous`` schema texts,
    xgrammar's own JSON-schema grammar, as the engines compiled every answer schema before
    :mod:`heart.runtime.json_grammar` (unbounded digits)."""
    def compile_grammar(compiler, schema: str, separators: tuple[str, str]):
        if schema in previous:
            return compiler.compile_json_schema(schema, any_whitespace=False, separators=separators)
        return compile_answer_grammar(compiler, schema, separators)
    return compile_grammar


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="runs/smollm2-pipeline/datasets", help="role datasets (<data>/<role>)")
    parser.add_argument("--split", default="validation", help="held-out split of the Router dataset")
    parser.add_argument("--adapters", default="runs/smollm2-pipeline/adapters", help="distilled adapters folder")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--engine", default="llamacpp:f16")
    parser.add_argument("--limit", type=int, default=12, help="Router rows (seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def with_previous_bounds(schema: Any) -> Any:
    """``schema`` with every binding value's bound set back to :data:`PREVIOUS_BOUNDS` and no
    bound on keys (the invocation request, the one other bounded string, keeps its own)."""
    if isinstance(schema, list):
        return [with_previous_bounds(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: with_previous_bounds(value) for key, value in schema.items()
           if not (key == "propertyNames" and value == {"maxLength": router.KEY_CHARS})}
    kind = out.get("type")
    if kind == "string" and out.get("maxLength") == router.VALUE_CHARS:
        out["maxLength"] = PREVIOUS_BOUNDS["maxLength"]
    elif kind == "array" and "prefixItems" not in out and out.get("maxItems") == router.VALUE_ITEMS:
        out["maxItems"] = PREVIOUS_BOUNDS["maxItems"]
    elif kind == "object" and out.get("maxProperties") == router.VALUE_KEYS:
        out["maxProperties"] = PREVIOUS_BOUNDS["maxProperties"]
    return out


def targets_accepted(data: str, chat) -> dict[str, dict[str, int]]:
    """Per role: training targets whose tokens the row's compiled schema accepts to its end,
    and those it rejects (or leaves open, or cannot compile)."""
    from datasets import load_from_disk

    from heart_distill.eval.serving import schema_for

    counts: dict[str, dict[str, int]] = {}
    for role in ROLES:
        tally = {"targets": 0, "accepted": 0, "rejected": 0, "not_ended": 0, "uncompiled": 0}
        for split in (dataset := load_from_disk(str(Path(data) / role))):
            rows = dataset[split]
            if "mode" in rows.column_names:  # relevance and messages rows answer other schemas
                rows = rows.filter(lambda row: row["mode"] not in ("relevance", "messages"), keep_in_memory=True)
            for row in rows:
                tally["targets"] += 1
                matcher, _ = chat.matcher(json.dumps(schema_for(role, role_input(row["messages"][:-1]))))
                if matcher is None:
                    tally["uncompiled"] += 1
                    continue
                ids = chat.tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"]
                if not all(matcher.accept_token(token) for token in ids):
                    tally["rejected"] += 1
                elif not matcher.accept_token(chat.stop_token_ids[0]):
                    tally["not_ended"] += 1
                else:
                    tally["accepted"] += 1
        counts[role] = tally
    return counts


def run_arm(backend, rows, requests, budget: int, tokens_of) -> dict[str, Any]:
    """Answer ``requests`` (one per row) and count what ended, parsed and matched."""
    from heart_distill.eval.metrics import router_scores
    from heart_distill.eval.serving import parse_target

    started = time.perf_counter()
    generations = backend.generate_batch(requests)
    wall = time.perf_counter() - started
    answers, sums = [], {"args_matched": 0, "args_total": 0, "steps_matched": 0, "steps_total": 0}
    for row, generation in zip(rows, generations):
        payload = role_input(row["messages"][:-1])
        parsed = router.parse_for_input(generation.text, payload)
        target = parse_target("router", row["messages"][-1]["content"]).value.model_dump(mode="json")
        scores = router_scores(target, parsed.value.model_dump(mode="json") if parsed.ok else None)
        for key in sums:
            sums[key] += scores[key]
        answers.append({"task_id": row.get("task_id"), "plan_steps": len(payload["plan"]),
                        "target_tokens": tokens_of(row["messages"][-1]["content"]),
                        "tokens": generation.completion_tokens, "ended": generation.completion_tokens < budget,
                        "parsed": parsed.ok, "error": parsed.error, "text": generation.text})
    fitting = [a for a in answers if a["target_tokens"] < budget]
    return {
        "rows": len(answers),
        "ended": sum(a["ended"] for a in answers),
        "parsed": sum(a["parsed"] for a in answers),
        "rows_whose_target_fits_budget": len(fitting),
        "ended_of_those": sum(a["ended"] for a in fitting),
        "tokens_mean": round(sum(a["tokens"] for a in answers) / max(len(answers), 1), 1),
        "tokens": [a["tokens"] for a in answers],
        "wall_s": round(wall, 2),
        "binding_step_em": round(sums["steps_matched"] / max(sums["steps_total"], 1), 4),
        "binding_argument_em": round(sums["args_matched"] / max(sums["args_total"], 1), 4),
        **sums,
        "answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from heart.runtime.engines import local_backend
    from heart_distill.eval.models import resolve_role_models
    from heart_distill.eval.roles import MAX_NEW_TOKENS, RoleEvalConfig, load_rows, prompt_fits, request_for

    for folder in (Path(args.data) / "router", Path(args.adapters) / "router"):
        if not folder.is_dir():
            print(f"error: {folder} does not exist", file=sys.stderr)
            return 2
    result_stamp = stamp(argv)
    sides = {"base": resolve_role_models("base", args.model), "distilled": resolve_role_models(args.adapters, args.model)}
    rows = load_rows(args.data, "router", args.split, args.limit, args.seed, prompt_fits(args.model, 1536))
    budget = MAX_NEW_TOKENS["router"]
    backend = local_backend(args.engine, args.model, {"router": sides["distilled"].adapters["router"]},
                            args.batch_size)
    tokens_of = lambda text: len(backend.chat.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    started = time.perf_counter()
    accepted = targets_accepted(args.data, backend.chat)
    accept_s = time.perf_counter() - started
    arms, previous_texts = {}, set()
    result = {
        "config": {**vars(args), "out": str(args.out), "budget": budget, "bounds": {
            "previous": PREVIOUS_BOUNDS, "shipped": {"maxLength": router.VALUE_CHARS, "maxItems": router.VALUE_ITEMS,
                                                    "maxProperties": router.VALUE_KEYS,
                                                    "propertyNames.maxLength": router.KEY_CHARS}}},
        "training_targets_accepted": accepted,
        "training_targets_check_s": round(accept_s, 1),
        "arms": arms,
    }
    heart.runtime.chat.compile_answer_grammar = served_grammars(previous_texts)
    for side, models in sides.items():
        config = RoleEvalConfig(data=args.data, out="", split=args.split, roles_spec=models.spec, roles=("router",))
        shipped = [request_for("router", row, models, config) for row in rows]
        if side == "base":  # the unadapted base answers rows no adapter is named for
            shipped = [dataclasses.replace(r, role="base") for r in shipped]
        # written compactly, so a previous schema's text never equals a shipped one's
        previous = [dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, guided_json=json.dumps(
            with_previous_bounds(json.loads(r.sampling.guided_json)), separators=(",", ":")))) for r in shipped]
        previous_texts.update(r.sampling.guided_json for r in previous)
        for bounds, requests in (("previous", previous), ("shipped", shipped)):
            arms[f"{side}/{bounds}"] = arm = run_arm(backend, rows, requests, budget, tokens_of)
            write_stamped_json(args.out, result, result_stamp)  # each arm as it ends
            print(f"{side:9s} {bounds:8s} ended {arm['ended']}/{arm['rows']}  parsed {arm['parsed']}/{arm['rows']}  "
                  f"tokens/answer {arm['tokens_mean']:6.1f}  wall {arm['wall_s']:6.1f}s  "
                  f"step EM {arm['binding_step_em']:.3f}  argument EM {arm['binding_argument_em']:.3f}", flush=True)
    print(f"training targets accepted by the served grammar: {json.dumps(accepted)}")
    print(f"wrote {write_stamped_json(args.out, result, result_stamp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
