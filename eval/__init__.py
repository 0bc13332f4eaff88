"""Evaluation of distilled roles and of the whole loop (per-role metrics, end-to-end runs, statistics)."""
