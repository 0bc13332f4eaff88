"""Statistics for evaluation: bootstrap intervals, pass^k, and PRISM's reliability figures.

Pure numpy; every function is deterministic given its ``seed``.

- :func:`bootstrap` — a percentile bootstrap 95% interval of any statistic of per-example
  rows (resampling rows, so paired columns stay paired);
- :func:`pass_hat_k` — τ-bench's pass^k: the chance that k independent trials of a task all
  succeed, estimated without bias per task as C(c, k) / C(n, k), averaged over tasks;
- :func:`lifts` / :func:`mean_lift` / :func:`worst_lift` / :func:`rr0` / :func:`rel_lift95` —
  across S seeds of the whole collect → train → evaluate path: Lift_s = score(distilled_s) −
  score(base) in points, paired on the same test tasks; their mean; the minimum over
  pre-declared conditions of the mean lift within the condition; the share of seeds with a
  positive lift; and RelLift95(B), the 5th percentile over bootstrap resamples of optimizer
  runs of the held-out lift of the run a pre-scorecard gate statistic selects at budget B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb
from typing import Any, Callable, Mapping, Sequence

import numpy as np

N_RESAMPLES = 2000
"""Bootstrap resamples for the intervals of headline figures."""


@dataclass(frozen=True)
class Estimate:
    """A figure with its bootstrap interval and the number of units it was computed over."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        if self.value is None:
            return f"– (n={self.n})"
        if self.low is None:
            return f"{self.value * scale:.{digits}f} (n={self.n})"
        return (f"{self.value * scale:.{digits}f} [{self.low * scale:.{digits}f}, "
                f"{self.high * scale:.{digits}f}] (n={self.n})")


def bootstrap(
    data: np.ndarray | Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """``statistic(data)`` with a percentile bootstrap interval over the rows of ``data``.

    ``data`` is 1-D (one value per unit) or 2-D (one row per unit, columns the statistic
    combines, e.g. true positives and predicted positives for a micro precision). Empty
    data gives ``Estimate(None, None, None, 0)``; a single unit has no interval.
    """
    data = np.asarray(data, dtype=float)
    n = len(data)
    if n == 0:
        return Estimate(None, None, None, 0)
    value = float(statistic(data))
    if n == 1:
        return Estimate(value, None, None, 1)
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, n, size=(n_resamples, n))
    if statistic is np.mean and data.ndim == 1:
        samples = data[indices].mean(axis=1)  # the common case, vectorised
    else:
        samples = np.array([statistic(data[row]) for row in indices])
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return Estimate(value, float(low), float(high), n)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials ((0, 1) when n is 0)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def safe_ratio(numerator: float, denominator: float, empty: float = 1.0) -> float:
    """numerator / denominator, or ``empty`` when there is nothing to divide (0 / 0)."""
    if denominator == 0:
        return empty if numerator == 0 else float("nan")
    return numerator / denominator


def micro_prf(rows: np.ndarray) -> tuple[float, float, float]:
    """Micro precision, recall, F1 from rows of (true positives, predicted, gold).

    Nothing predicted and nothing to find scores 1 (a perfect empty answer); predicting
    nothing when there was something to find scores 0 on both (a model that never answers
    must not get a perfect precision).
    """
    tp, predicted, gold = rows[:, 0].sum(), rows[:, 1].sum(), rows[:, 2].sum()
    if predicted == 0:
        precision = 1.0 if gold == 0 else 0.0
    else:
        precision = tp / predicted
    recall = safe_ratio(tp, gold, empty=1.0)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return float(precision), float(recall), float(f1)


def ratio(rows: np.ndarray) -> float:
    """sum(column 0) / sum(column 1): a micro average (e.g. matched arguments / arguments)."""
    return float(safe_ratio(rows[:, 0].sum(), rows[:, 1].sum(), empty=float("nan")))


# -- pass^k ------------------------------------------------------------------------------

def pass_hat_k(successes: Sequence[int], trials: Sequence[int], k: int) -> float:
    """τ-bench's pass^k over tasks: mean over tasks of C(c, k) / C(n, k).

    ``successes[i]`` of ``trials[i]`` independent trials of task i succeeded. Every task
    needs at least k trials (fewer cannot estimate "all k succeed").
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(successes) != len(trials) or not len(trials):
        raise ValueError("pass^k needs one (successes, trials) pair per task, and at least one task")
    values = []
    for c, n in zip(successes, trials):
        if not 0 <= c <= n:
            raise ValueError(f"successes {c} must lie in [0, trials={n}]")
        if n < k:
            raise ValueError(f"a task has {n} trials, fewer than k={k}")
        values.append(comb(c, k) / comb(n, k))
    return float(np.mean(values))


# -- lift across seeds (PRISM) -----------------------------------------------------------

def lifts(distilled: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Lift_s in points: 100 × (mean over tasks of distilled[s] − base), paired on tasks.

    ``distilled`` is (S seeds, T tasks) of per-task scores in [0, 1]; ``base`` is (T,)
    (the unadapted base does not depend on the distillation seed) or (S, T).
    """
    distilled = np.atleast_2d(np.asarray(distilled, dtype=float))
    base = np.asarray(base, dtype=float)
    if distilled.shape[-1] != base.shape[-1]:
        raise ValueError(f"lift is paired on tasks: distilled has {distilled.shape[-1]} tasks, base {base.shape[-1]}")
    return 100.0 * (distilled - base).mean(axis=1)


def mean_lift(seed_lifts: Sequence[float]) -> float:
    return float(np.mean(seed_lifts))


def worst_lift(lifts_by_condition: Mapping[str, Sequence[float]]) -> tuple[float, str]:
    """The minimum over pre-declared conditions of the mean lift within the condition,
    with the condition that attains it."""
    if not lifts_by_condition:
        raise ValueError("WorstLift needs at least one condition")
    means = {name: float(np.mean(values)) for name, values in lifts_by_condition.items()}
    worst = min(means, key=means.get)
    return means[worst], worst


def rr0(seed_lifts: Sequence[float]) -> float:
    """Share of seeds whose lift is strictly positive."""
    values = np.asarray(seed_lifts, dtype=float)
    if values.size == 0:
        raise ValueError("RR0 needs at least one seed")
    return float((values > 0).mean())


def rel_lift95(gate_stats: Sequence[float], run_lifts: Sequence[float], *, runs_per_draw: int = 1,
               run_ids: Sequence[str] | None = None, n_resamples: int = 5000, seed: int = 0) -> float:
    """RelLift95(B): PRISM's reliable held-out lift of the harness selected under budget B.

    ``gate_stats[i]`` is optimizer run i's pre-scorecard statistic G_i (its returned
    harness's gate lift) and ``run_lifts[i]`` that harness's held-out (scorecard) lift, both
    measured once per run. Budget B buys ``runs_per_draw`` = B // (one run's budget)
    optimizer runs; each of ``n_resamples`` resamples draws that many runs with replacement,
    keeps the one with the highest G_i (ties: the smallest run id, else the first) and
    takes its held-out lift. RelLift95(B) is the 5th percentile of those lifts: at budget B,
    19 times in 20 the selected harness lifts at least this much. With one run per draw it
    is the 5th percentile of the runs' lifts. Never reads a held-out lift to select.
    """
    gate = np.asarray(gate_stats, dtype=float)
    lift = np.asarray(run_lifts, dtype=float)
    if gate.ndim != 1 or gate.shape != lift.shape or gate.size == 0:
        raise ValueError(f"RelLift95 needs one gate statistic and one held-out lift per run, "
                         f"got {gate.shape} and {lift.shape}")
    if runs_per_draw < 1:
        raise ValueError(f"runs_per_draw must be >= 1 (budget B buys at least one run), got {runs_per_draw}")
    n = gate.size
    ids = list(run_ids) if run_ids is not None else [f"{i:09d}" for i in range(n)]
    if len(ids) != n:
        raise ValueError(f"{len(ids)} run ids for {n} runs")
    # rank runs once: highest gate statistic first, ties broken by run id
    order = sorted(range(n), key=lambda i: (-gate[i], ids[i]))
    rank = np.empty(n, dtype=int)
    rank[order] = np.arange(n)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_resamples, runs_per_draw))
    chosen = draws[np.arange(n_resamples), rank[draws].argmin(axis=1)]
    return float(np.percentile(lift[chosen], 5))
