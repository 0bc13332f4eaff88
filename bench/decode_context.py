"""What one llama.cpp decoding step costs, by rows, by their context length and by the slots they sit in.

    python bench/decode_context.py [--contexts 500 1000 2000] [--rows 1 4 8 16] [--steps 16]

A decoding step feeds one token per row to one ``llama_decode`` call of one role context
(:class:`heart.runtime.llamacpp.RoleContext`). Its time has three parts this separates: the
weights, read once per micro-batch; attention, each row over its own context; and how
llama.cpp splits the call into micro-batches. Without a unified cache it puts into one
micro-batch only sequences whose ids follow each other, so rows in slots 0, 1, 2, 3 share
one weight pass and rows in slots 0, 2, 4, 6 pay four; and it takes the same number of
tokens from each sequence into a micro-batch, so one row feeding a draft splits the call
again. Each cell fills ``--rows`` slots (``consecutive``: 0..rows-1; ``spread``: every other
slot; ``one-drafts``: consecutive, the first row feeding its last token and a
``DRAFT_TOKENS``-token draft) with ``--contexts`` random tokens, then times ``--steps``
decoding calls of one token per row, fed in slot order, on the unadapted embedded base. Cells run one after another in one process: the figures to
compare are ratios across cells.

Prints a table and writes it under its provenance stamp to ``--out`` (default
``runs/bench/decode_context.json``; curated results live in ``bench/results/``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "decode_context.json"
LAYOUTS = ("consecutive", "spread", "one-drafts")


def slots_of(layout: str, rows: int) -> list[int]:
    return list(range(0, 2 * rows, 2)) if layout == "spread" else list(range(rows))


def build_parser() -> argparse.ArgumentParser:
    from heart.argtypes import positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=positive_int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--rows", type=positive_int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--layouts", choices=LAYOUTS, nargs="+", default=list(LAYOUTS))
    parser.add_argument("--steps", type=positive_int, default=16)
    parser.add_argument("--weights", default="f16")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    from heart.runtime.llamacpp import BATCH_TOKENS, DRAFT_TOKENS, LlamaCppBackend, RoleContext

    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)

    backend = LlamaCppBackend(weights=args.weights, draft_tokens=0)
    slot_tokens = max(args.contexts) + args.steps + DRAFT_TOKENS + 1
    context = RoleContext(backend._model, None, 2 * max(args.rows), slot_tokens, backend.threads)
    rng = random.Random(0)
    vocab = range(1000, backend.chat.vocab_size - 1000)
    cells = []
    for length in args.contexts:
        for rows in args.rows:
            for layout in args.layouts:
                if rows == 1 and layout == "spread":
                    continue  # one row sits in one slot either way
                fed = [1 + DRAFT_TOKENS if layout == "one-drafts" and i == 0 else 1 for i in range(rows)]
                slots = slots_of(layout, rows)
                for slot in slots:  # a fresh context of `length` tokens in each slot
                    context.truncate(slot, 0)
                    tokens = [rng.choice(vocab) for _ in range(length)]
                    for start in range(0, length, BATCH_TOKENS):
                        context.decode([(t, slot, False) for t in tokens[start:start + BATCH_TOKENS]])
                started = time.perf_counter()
                for _ in range(args.steps):
                    context.decode([(rng.choice(vocab), slot, True) for slot, n in zip(slots, fed) for _ in range(n)])
                    if fed[0] > 1:  # the draft rejected: its row's context stays as long as the others'
                        context.truncate(slots[0], len(context.cached[slots[0]]) - DRAFT_TOKENS)
                ms = 1000 * (time.perf_counter() - started) / args.steps
                cell = {"context_tokens": length, "rows": rows, "layout": layout, "slots": slots,
                        "ms_per_step": round(ms, 1), "ms_per_row_step": round(ms / rows, 1)}
                cells.append(cell)
                print(f"  context {length:>5} x {rows:>2} rows, {layout:>11}: {cell['ms_per_step']:>7} ms a step, "
                      f"{cell['ms_per_row_step']:>6} ms a row-step", flush=True)
    report = {"engine": backend.name, "threads": backend.threads, "steps": args.steps, "cells": cells}
    write_stamped_json(args.out, report, run_stamp, indent=1)
    print(f"decode_context: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
