"""``heart optimize``: PRISM's harness optimization around a fixed model, and its protocol.

- :mod:`.rollouts` — a harness rolled out over tasks through the real loop, with exact replay
  of recorded role answers and the inner-rollout budget count;
- :mod:`.clusters` — failure clusters from traces, routed to prompt / middleware / joint slots;
- :mod:`.proposers` — the deterministic (no model) and OpenAI-compatible proposers;
- :mod:`.search` — one optimizer run: the evolutionary loop and its Pareto selection;
- :mod:`.protocol` — split seeds × repeats, the scorecard once per run, four arms;
- :mod:`.report` — MeanLift, WorstLift, RR0, RelLift95(B) and the interaction;
- :mod:`.cli` — the command. The guide is docs/optimize.md.

The harness format itself (what ``heart run --harness`` loads) is :mod:`heart.harness`.
"""
