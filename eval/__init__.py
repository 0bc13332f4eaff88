"""Evaluation of distilled roles: per role, end to end, statistics, report.

- :mod:`eval.roles` — ``heart eval roles``: held-out role inputs re-served and scored;
- :mod:`eval.e2e` — ``heart eval e2e``: the whole loop on held-out tasks, the benchmark's checker;
- :mod:`eval.metrics` — the per-role metrics (pure functions over parsed outputs);
- :mod:`eval.stats` — bootstrap intervals, pass^k, Lift / MeanLift / WorstLift / RR0 / RelLift95;
- :mod:`eval.report` — ``heart report``: markdown tables and PNG plots;
- :mod:`eval.heldout` — test-split role datasets from a collection run;
- :mod:`eval.serving` — a role input's serving schema and parser (the one format-aware module);
- :mod:`eval.formats` — older trace formats mapped onto the Appendix D names;
- :mod:`eval.models` — what ``--roles base|ADAPTERS_DIR|teacher:SPEC`` serves;
- :mod:`eval.optimize` — ``heart optimize``: harness search around a fixed model and PRISM's protocol.
"""
