"""Per-role evaluation: each role answers held-out role inputs, scored against the teacher.

    heart eval roles --data runs/NAME-test/datasets --split test --roles runs/NAME/adapters --out runs/NAME/eval/distilled
    heart eval roles --data runs/NAME-test/datasets --split test --roles base --out runs/NAME/eval/base
    heart eval roles ... --roles runs/NAME/adapters --out .../distilled --base-out .../base   # both at once

For each role, the rows of ``<data>/<role>`` (split ``--split``) are re-served: the row's
system + user messages (the short system prompt where the role's adapter was trained on
it), decoding constrained to the role's serving schema (:mod:`eval.serving`), all requests
through the backend's ``generate_batch`` so a batching runtime serves them together. Each
answer is parsed by the role's own parser and scored against the row's assistant message
(the teacher's target) and, for the Verifier, the environment's label
(:mod:`eval.metrics`). A backend exception is an *errored* example: counted, never scored
as the model's failure. Writes ``<out>/roles.json`` (figures with intervals and n,
provenance) and ``<out>/roles_examples.jsonl`` (every answer and its scores).

With ``--base-out`` the unadapted base answers the same rows at the same time, on the same
in-process model: both sides' calls decode in one continuously refilled batch
(:func:`run_sides`), each row still answered exactly as it would be alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from heart_distill.eval.formats import ROLES, canonical
from heart_distill.eval.metrics import (NATURAL, needs_extraction, primitive_scores, planner_scores, router_scores,
                                        summarize, verifier_scores)
from heart_distill.eval.models import (RoleModels, check_sides_agree, resolve_role_models, shared_backend, shared_backends,
                         with_base_side)
from heart_distill.eval.serving import matches_schema, parse_output, parse_target, schema_for, tool_schema
from heart.argtypes import nonnegative_int, positive_int
from heart.roles.common import role_input
from heart.roles.planner import shown_tools
from heart.runtime.base import Backend, Generation, GenerationRequest, SamplingConfig
from heart.runtime.engines import ENGINE_SPECS

RESULTS = "roles.json"
EXAMPLES = "roles_examples.jsonl"
MAX_NEW_TOKENS = {"planner": 320, "router": 384, "primitive": 160, "verifier": 224}
"""Decoding budget per role: above the 95th percentile of the teacher's answers on a gold
train collection (SmolLM2 tokens: planner 277, router 371, primitive 78, verifier 167). A
batch decodes until its longest row stops, so one runaway answer costs the whole batch its
budget: a tight budget per role keeps evaluation affordable on a CPU."""
CALLS_PER_BATCH = 4
"""Requests handed to the backend per ``generate_batch``, in batches: room to refill."""
LABEL_COLUMNS = ("label", "verdict")
"""Dataset columns holding the environment's verdict for a Verifier row (newest name first)."""


@dataclass
class RoleEvalConfig:
    """One ``heart eval roles`` run."""

    data: str
    """Folder of role datasets: ``<data>/<role>`` saved by ``datasets`` (see eval.heldout)."""
    out: str
    """Where roles.json and roles_examples.jsonl go."""
    split: str = "test"
    """Split of each role dataset to answer."""
    roles_spec: str = "base"
    """base | an adapters folder | teacher:SPEC (see eval.models)."""
    model: str = "smollm2-135m"
    """Base model when the adapters' manifests do not name one."""
    roles: tuple[str, ...] = ROLES
    """Roles to evaluate."""
    limit: int | None = None
    """At most this many rows per role (a seeded sample, the same for every model)."""
    batch_size: int = 8
    """Requests handed to generate_batch at a time (and the backend's max batch)."""
    engine: str = "peft"
    """In-process engine for the base and its adapters: peft or llamacpp (heart.runtime.engines)."""
    max_new_tokens: int | None = None
    """Per answer; None: the role's own budget (:data:`MAX_NEW_TOKENS`)."""
    constrained: bool = True
    """Constrain decoding to each role's serving schema, as the loop does by default."""
    seed: int = 0
    """Seed of the row sample and of the bootstrap."""
    max_prompt_tokens: int | None = 1536
    """Rows whose prompt is longer are left out before sampling, and counted (None: keep all).
    1536 is the CPU recipes' ``sft.max_length``: an adapter never trained on longer inputs."""


def load_rows(data: str | Path, role: str, split: str, limit: int | None, seed: int,
              fits: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """The role's rows of ``split``: all, or a seeded sample of ``limit`` (label-balanced for
    the Verifier, extraction rows and others in turn for the Primitive, see
    :func:`balanced_sample`) — the same rows for every model compared.
    With ``fits``, only rows it accepts are sampled from (see :func:`prompt_fits`)."""
    return load_role_rows(data, role, split, limit, seed, fits)[0]


def prompt_fits(model: str, max_prompt_tokens: int) -> Callable[[dict[str, Any]], bool]:
    """Whether a row's prompt (system + user, the chat template applied) fits ``max_prompt_tokens``
    tokens of ``model``'s tokenizer: training drops longer examples (``sft.max_length``), so an
    adapter has never seen one, and a few held-out inputs are far longer (a tool result of
    thousands of tokens in the context) and would cost a batch more than all the others."""
    from transformers import AutoTokenizer

    from heart.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))

    def fits(row: dict[str, Any]) -> bool:
        ids = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=True, add_generation_prompt=True,
                                            return_dict=False)
        return len(ids) <= max_prompt_tokens

    return fits


def load_role_rows(data: str | Path, role: str, split: str, limit: int | None, seed: int,
                   fits: Callable[[dict[str, Any]], bool] | None = None) -> tuple[list[dict[str, Any]], int]:
    """(:func:`load_rows`'s rows, how many rows of the split ``fits`` left out)."""
    from datasets import load_from_disk

    folder = Path(data) / role
    if not folder.is_dir():
        raise FileNotFoundError(f"no {role} dataset: {folder} does not exist")
    dataset = load_from_disk(str(folder))
    if split not in dataset:
        raise ValueError(f"{folder} has no {split!r} split (it has {sorted(dataset)}); held-out role inputs "
                         f"come from `python -m heart_distill.eval.heldout RUN --split {split}`")
    rows = dataset[split]
    if "mode" in rows.column_names:  # the Primitive's relevance rows: measured by bench/toolface.py --relevance;
        # its messages rows (heart.roles.primitive_messages) have no arguments to score
        rows = rows.filter(lambda row: row["mode"] not in ("relevance", "messages"), keep_in_memory=True)
    total = len(rows)
    if fits is not None:
        rows = rows.filter(fits, keep_in_memory=True)
    left_out = total - len(rows)
    if limit is not None and limit < len(rows):
        label = next((c for c in LABEL_COLUMNS if c in rows.column_names), None)
        if role == "verifier" and label is not None:
            return balanced_sample(natural_fails_in_turn(list(rows.shuffle(seed=seed)), label), label,
                                   limit), left_out
        if role == "primitive":
            return balanced_sample(list(rows.shuffle(seed=seed)), primitive_stratum, limit), left_out
        if role == "planner":
            return balanced_sample(list(rows.shuffle(seed=seed)), planner_stratum, limit), left_out
        rows = rows.shuffle(seed=seed).select(range(limit))
    return list(rows), left_out


def primitive_stratum(row: dict[str, Any]) -> str:
    """"extraction" for a tool call whose input binds an earlier step's whole result to a
    parameter that does not take it as is (the Primitive must take the value out:
    :func:`heart_distill.eval.metrics.needs_extraction`), else "other" (its bindings are the
    answer, or a code step)."""
    payload = role_input(row["messages"][:-1])
    tool = payload.get("tool", {})
    extraction = tool.get("family", "tool") != "code" and needs_extraction(payload.get("resolved_bindings") or {},
                                                                           tool.get("parameters"))
    return "extraction" if extraction else "other"


def planner_stratum(row: dict[str, Any]) -> str:
    """"multi_step" for a target plan of two or more steps, else "one_step" (a one-step plan
    or a clarification): the Planner's sample takes them in turn, so a Planner that only
    writes one-step plans cannot look good on a sample of mostly one-step inputs."""
    target = parse_target("planner", row["messages"][-1]["content"])
    steps = len(target.value.plan or []) if target.ok and target.value.status == "SUFFICIENT" else 0
    return "multi_step" if steps >= 2 else "one_step"


def natural_fails_in_turn(rows: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """``rows`` with their FAIL rows reordered so that natural and injected faults
    (``fault_kind``) take turns while both last, the rest in place: a label-balanced sample
    then holds as many natural FAILs as it can, up to half, so its accuracy on them is read
    on more than a handful."""
    fails = [i for i, row in enumerate(rows) if str(row[label]) == "FAIL"]
    natural = [rows[i] for i in fails if rows[i].get("fault_kind") == NATURAL]
    injected = [rows[i] for i in fails if rows[i].get("fault_kind") != NATURAL]
    turns = [row for pair in itertools.zip_longest(natural, injected) for row in pair if row is not None]
    reordered = list(rows)
    for i, row in zip(fails, turns):
        reordered[i] = row
    return reordered


def balanced_sample(rows: list[dict[str, Any]], label: str | Callable[[dict[str, Any]], str],
                    limit: int) -> list[dict[str, Any]]:
    """``limit`` rows taking the labels in turn (PASS, FAIL, PASS, ...) while each lasts;
    ``label`` is a column, or a function of the row.

    A test collection holds about two PASS steps per FAIL, so a plain sample of a few rows is
    mostly PASS and a Verifier that always says PASS scores high on it. The Verifier's job is
    to tell the two apart: its held-out sample is label-balanced, as its training set is, and
    verdict accuracy on it is balanced accuracy. The Primitive's sample takes extraction rows
    and the others in turn (:func:`primitive_stratum`): most of its inputs' bindings already
    are the answer, and a sample of those measures copying. ``rows`` are already shuffled
    (seeded).
    """
    key = label if callable(label) else (lambda row: str(row[label]))
    by_label: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(key(row), []).append(row)
    queues = [by_label[k] for k in sorted(by_label, reverse=True)]  # PASS first, then FAIL
    sample: list[dict[str, Any]] = []
    while len(sample) < limit and any(queues):
        for queue in queues:
            if queue and len(sample) < limit:
                sample.append(queue.pop(0))
    return sample


def request_for(role: str, row: dict[str, Any], models: RoleModels, config: RoleEvalConfig) -> GenerationRequest:
    """The row's system + user messages (the last is the target), the system prompt swapped
    for the short one of the input's mode when ``role``'s adapter was trained on it."""
    from heart.roles.registry import get_role

    messages = [dict(m) for m in row["messages"][:-1]]
    short = role in models.short_prompts and messages[0]["role"] == "system"
    payload = role_input(messages) if short or config.constrained else None  # read only when needed
    if short:
        messages[0]["content"] = get_role(role).system_prompt(payload, short=True)
    schema = schema_for(role, payload) if config.constrained else None
    sampling = SamplingConfig(max_new_tokens=config.max_new_tokens or MAX_NEW_TOKENS[role],
                              guided_json=json.dumps(schema) if schema is not None else None)
    return GenerationRequest(role, messages, sampling)


def score_row(role: str, row: dict[str, Any], generation: Generation) -> dict[str, Any]:
    """One example's scores (raises ValueError when the *target* itself does not parse)."""
    payload = role_input(row["messages"][:-1])
    target_result = parse_target(role, row["messages"][-1]["content"])
    if not target_result.ok:
        raise ValueError(f"target does not parse: {target_result.error}")
    target = canonical(role, target_result.value.model_dump(mode="json"))
    result = parse_output(role, payload, generation.text)
    parsed = result.value.model_dump(mode="json") if result.ok else None
    prediction = canonical(role, parsed)
    if role == "planner":
        scores = planner_scores(target, prediction, shown=list(shown_tools(payload)))
        scores["valid_output"] = int(parsed is not None and matches_schema(generation.text, schema_for(role, payload)))
    elif role == "router":
        scores = router_scores(target, prediction)
    elif role == "primitive":
        scores = primitive_scores(target, prediction, tool_schema(role, payload), row.get("failure_type"),
                                  bindings=payload.get("resolved_bindings"))
    else:
        label = next((row[c] for c in LABEL_COLUMNS if row.get(c)), None)
        scores = verifier_scores(target, prediction, label, row.get("fault_kind"))
    return {**scores, "parse_failure": int(not result.ok), "parse_error": result.error,
            "prompt_tokens": generation.prompt_tokens, "completion_tokens": generation.completion_tokens,
            "latency_s": generation.latency_s}


def evaluate_role(role: str, rows: list[dict[str, Any]], backend: Backend, models: RoleModels,
                  config: RoleEvalConfig) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(one record per row, counts of errored rows and unreadable targets)."""
    from heart.progress import progress_bar

    records: list[dict[str, Any]] = []
    counts = {"errored": 0, "target_unparsed": 0}
    # Similar prompt lengths side by side: a left-padded batch computes every row at its
    # longest row's length. Records keep this order; each names its example. Each call hands
    # the backend several batches' worth, so a continuously batching backend refills the
    # batch as answers finish instead of waiting for the slowest row of each batch.
    rows = sorted(rows, key=lambda row: sum(len(m["content"]) for m in row["messages"][:-1]))
    per_call = config.batch_size * CALLS_PER_BATCH
    with progress_bar(total=len(rows), desc=f"eval {role}", unit="call") as progress:
        for start in range(0, len(rows), per_call):
            chunk = rows[start:start + per_call]
            requests = [request_for(role, row, models, config) for row in chunk]
            try:
                generations: Sequence[Generation | None] = backend.generate_batch(requests)
                error = None
            except Exception as err:  # infrastructure: the rows are errored, not failed
                generations, error = [None] * len(chunk), f"{type(err).__name__}: {err}"
            for row, generation in zip(chunk, generations):
                record = {"role": role, "episode_id": row.get("episode_id"), "task_id": row.get("task_id"),
                          "turn": row.get("turn"), "attempt": row.get("attempt"), "step": row.get("step")}
                if generation is None:
                    counts["errored"] += 1
                    records.append({**record, "errored": True, "error": error})
                    continue
                try:
                    scores = score_row(role, row, generation)
                except ValueError as err:
                    counts["target_unparsed"] += 1
                    records.append({**record, "errored": True, "error": str(err)})
                    continue
                records.append({**record, "errored": False, "output": generation.text, **scores})
            progress.update(len(chunk))
    return records, counts


def load_side_rows(config: RoleEvalConfig, models: RoleModels) -> dict[str, tuple[list[dict[str, Any]], int]]:
    """Role → :func:`load_role_rows` of ``config`` (prompts too long for ``models`` left out)."""
    if models.teacher == "gold":
        raise ValueError("teacher:gold answers from a task's gold calls; it has no answer for a bare role "
                         "input (the targets are its answers): evaluate it end to end instead")
    fits = prompt_fits(models.model, config.max_prompt_tokens) if config.max_prompt_tokens and \
        models.teacher is None else None
    return {role: load_role_rows(config.data, role, config.split, config.limit, config.seed, fits)
            for role in config.roles}


def run(config: RoleEvalConfig, backend: Backend | None = None, argv: list[str] | None = None,
        loaded: dict[str, tuple[list[dict[str, Any]], int]] | None = None) -> dict[str, Any]:
    """Evaluate every role of ``config``; write and return the results. ``loaded``: its
    rows, loaded already (:func:`load_side_rows`)."""
    from heart_distill.eval.provenance import dataset_fingerprint, provenance

    models = resolve_role_models(config.roles_spec, config.model)
    loaded = loaded if loaded is not None else load_side_rows(config, models)
    rows = {role: role_rows for role, (role_rows, _) in loaded.items()}
    backend = backend or shared_backend(models, config.batch_size, config.engine)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    figures, counts, datasets = {}, {}, {}
    with open(out / EXAMPLES, "w", encoding="utf-8") as examples:
        for role in config.roles:
            started = time.perf_counter()
            records, counts[role] = evaluate_role(role, rows[role], backend, models, config)
            counts[role]["rows"] = len(rows[role])
            counts[role]["over_long_left_out"] = loaded[role][1]
            counts[role]["wall_s"] = round(time.perf_counter() - started, 3)
            scored = [r for r in records if not r["errored"]]
            figures[role] = {name: e.to_dict() for name, e in summarize(role, scored, config.seed).items()}
            datasets[role] = {"path": str(Path(config.data) / role), "split": config.split,
                              "fingerprint": dataset_fingerprint(Path(config.data) / role)}
            for record in records:
                examples.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    results = {
        "kind": "roles", "label": models.label, "roles_spec": models.spec, "model": models.model,
        "config": dataclasses.asdict(config), "figures": figures, "counts": counts,
        "adapters": {role: {"path": path, "manifest": models.manifests.get(role, {})}
                     for role, path in models.adapters.items()},
        "short_prompts": list(models.short_prompts), "datasets": datasets,
        "backend": backend.name, "provenance": provenance(argv),
    }
    (out / RESULTS).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def run_sides(configs: list[RoleEvalConfig], argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Evaluate several ``--roles`` on the same rows at once (e.g. base and distilled), each
    written to its own ``out``. Sides on one in-process base share the model
    (:func:`eval.models.shared_backends`): their calls decode in the same batches, so the
    batch is twice as full and the model loads once."""
    from concurrent.futures import ThreadPoolExecutor

    from heart.progress import create_bar_lock

    check_sides_agree(configs)
    models = [resolve_role_models(c.roles_spec, c.model) for c in configs]
    # Each side's thread draws a bar: tqdm's lock is created before the threads exist, and
    # the datasets are loaded here, in this thread (their loading creates and deletes tqdm's
    # lock when it finds none: heart.progress.create_bar_lock).
    create_bar_lock()
    loaded = [load_side_rows(config, side_models) for config, side_models in zip(configs, models)]
    backends = shared_backends(models, sum(c.batch_size for c in configs), configs[0].engine) \
        if len(configs) > 1 else [None]
    if not any(backends):
        return [run(config, argv=argv, loaded=side_rows) for config, side_rows in zip(configs, loaded)]
    # transformers resolves its lazy attributes on first use, and two threads doing it at once
    # can see a half-initialised module (ImportError): resolve the one both sides need first.
    from transformers import AutoTokenizer  # noqa: F401

    try:
        with ThreadPoolExecutor(len(configs)) as pool:
            futures = [pool.submit(run, config, backend, argv, side_rows)
                       for config, backend, side_rows in zip(configs, backends, loaded)]
            return [future.result() for future in futures]
    finally:
        for backend in {id(b): b for b in backends if hasattr(b, "close")}.values():
            backend.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="role datasets folder (<data>/<role>)")
    parser.add_argument("--split", default="test", help="split of each role dataset (default test)")
    parser.add_argument("--roles", dest="roles_spec", default=None,
                        help="base | ADAPTERS_DIR | teacher:SPEC (default base)")
    parser.add_argument("--adapters", help="an adapters folder (same as --roles DIR)")
    parser.add_argument("--model", default="smollm2-135m", help="base model (when no manifest names one)")
    parser.add_argument("--only", default=",".join(ROLES), help="comma-separated roles to evaluate")
    parser.add_argument("--limit", type=positive_int, help="at most N rows per role (seeded sample)")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--engine", choices=ENGINE_SPECS, default="peft",
                        help="in-process engine (llamacpp: GGUF on CPU, same greedy answers up to arithmetic order, "
                             "faster; llamacpp:f16 for f16 base weights, faster again)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="per answer (default: each role's own budget, eval.roles.MAX_NEW_TOKENS)")
    parser.add_argument("--no-constrain", action="store_true", help="decode without the serving schemas")
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--max-prompt-tokens", type=nonnegative_int, default=1536,
                        help="leave out (and count) rows whose prompt is longer (0: keep all; default 1536, "
                             "the CPU recipes' sft.max_length)")
    parser.add_argument("--out", required=True, help="output folder (roles.json, roles_examples.jsonl)")
    parser.add_argument("--base-out", help="also evaluate the unadapted base on the same rows, at the same time "
                                           "and on the same model, into this folder")


def config_from_args(args: argparse.Namespace) -> RoleEvalConfig:
    if args.roles_spec and args.adapters:
        raise ValueError("give --roles or --adapters, not both")
    roles = tuple(r.strip() for r in args.only.split(",") if r.strip())
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise ValueError(f"--only {args.only!r}: roles must be some of {', '.join(ROLES)}")
    return RoleEvalConfig(data=args.data, out=args.out, split=args.split,
                          roles_spec=args.adapters or args.roles_spec or "base", model=args.model, roles=roles,
                          limit=args.limit, batch_size=args.batch_size, engine=args.engine,
                          max_new_tokens=args.max_new_tokens,
                          constrained=not args.no_constrain, seed=args.seed,
                          max_prompt_tokens=args.max_prompt_tokens or None)


def print_summary(results: dict[str, Any]) -> None:
    from heart_distill.eval.metrics import HEADLINE
    from heart_distill.eval.stats import Estimate

    for role, figures in results["figures"].items():
        head = HEADLINE[role]
        c = results["counts"][role]
        print(f"  {role:<9} {head} {Estimate(**figures[head]).format(100)}  parse failures "
              f"{Estimate(**figures['parse_failure_rate']).format(100)}  errored {c['errored']}/{c['rows']}"
              f"  over-long left out {c.get('over_long_left_out', 0)}")


def main(argv: list[str], full_argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart eval roles", description="per-role held-out evaluation")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        configs = with_base_side(config, args.base_out)
        every_results = run_sides(configs, argv=full_argv)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for config, results in zip(configs, every_results):
        print(f"{results['label']} ({config.roles_spec}):")
        print_summary(results)
        print(f"wrote {Path(config.out) / RESULTS}")
    for results in every_results:
        counts = results["counts"].values()
        if all(c["errored"] + c["target_unparsed"] == c["rows"] for c in counts):
            print(f"error: every {results['label']} example errored (infrastructure): no figure measures the "
                  "model", file=sys.stderr)
            return 1
    return 0
