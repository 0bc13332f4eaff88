"""eval.stats on cases with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from heart_distill.eval.stats import bootstrap, lifts, mean_lift, micro_prf, pass_hat_k, rel_lift95, rr0, worst_lift


def test_bootstrap_of_a_constant_has_a_zero_width_interval():
    e = bootstrap([1.0] * 20)
    assert (e.value, e.low, e.high, e.n) == (1.0, 1.0, 1.0, 20)


def test_bootstrap_interval_brackets_the_mean_and_matches_the_normal_approximation():
    e = bootstrap([0.0, 1.0] * 50, n_resamples=4000)
    assert e.value == 0.5 and e.n == 100
    # binomial SE = 0.05: the 95% percentile interval is about 0.5 ± 0.098
    assert 0.38 < e.low < 0.43 and 0.57 < e.high < 0.62


def test_bootstrap_empty_and_single():
    assert bootstrap([]).value is None and bootstrap([]).n == 0
    single = bootstrap([0.3])
    assert single.value == 0.3 and single.low is None and single.n == 1


def test_bootstrap_is_deterministic_given_the_seed():
    data = np.arange(30) % 7
    assert bootstrap(data, seed=3) == bootstrap(data, seed=3)


def test_micro_prf_known_values():
    rows = np.array([[1, 2, 2], [0, 0, 1], [1, 1, 1]], dtype=float)  # tp=2, predicted=3, gold=4
    p, r, f = micro_prf(rows)
    assert p == pytest.approx(2 / 3) and r == pytest.approx(0.5) and f == pytest.approx(4 / 7)
    assert micro_prf(np.zeros((2, 3))) == (1.0, 1.0, 1.0)  # nothing to find, nothing predicted
    assert micro_prf(np.array([[0, 0, 2]], dtype=float)) == (0.0, 0.0, 0.0)  # silent when it had to act
    assert micro_prf(np.array([[0, 2, 0]], dtype=float)) == (0.0, 1.0, 0.0)  # acting when nothing was due


def test_pass_hat_k_is_the_unbiased_all_k_succeed_estimator():
    # task A: 3 of 4 succeed → C(3,2)/C(4,2) = 0.5; task B: 4 of 4 → 1
    assert pass_hat_k([3, 4], [4, 4], 2) == pytest.approx(0.75)
    assert pass_hat_k([3, 4], [4, 4], 1) == pytest.approx((0.75 + 1) / 2)  # pass^1 = success rate
    assert pass_hat_k([3, 4], [4, 4], 4) == pytest.approx(0.5)  # only B succeeds every time
    with pytest.raises(ValueError, match="fewer than k"):
        pass_hat_k([1], [1], 2)


def test_lift_is_paired_on_tasks_in_points():
    distilled = np.array([[1, 1, 0, 0], [1, 1, 1, 0]])
    base = np.array([0, 1, 0, 0])
    assert lifts(distilled, base).tolist() == [25.0, 50.0]
    with pytest.raises(ValueError, match="paired"):
        lifts(distilled, np.array([0, 1]))


def test_mean_worst_rr0():
    assert mean_lift([10, -4, 0]) == pytest.approx(2.0)
    assert worst_lift({"bfcl": [10, 20], "agentdojo": [-5, 5]}) == (0.0, "agentdojo")
    assert rr0([1, -1, 0, 2]) == 0.5


def test_rel_lift95_at_one_run_is_the_low_tail_of_the_runs_lifts():
    assert rel_lift95([0.0] * 3, [5.0] * 3) == 5.0
    # 20 synthetic runs with lifts -9..10: one run per draw, the 5th percentile of draws
    lifts = np.arange(-9.0, 11.0)
    assert rel_lift95(np.zeros(20), lifts, n_resamples=20000) == pytest.approx(np.percentile(lifts, 5), abs=1.0)


def test_rel_lift95_selects_by_the_gate_statistic_never_by_the_held_out_lift():
    # the run with the best gate statistic has the worst held-out lift: more budget, more often chosen
    gates, held_out = [1.0, 2.0, 3.0, 9.0], [10.0, 10.0, 10.0, -5.0]
    assert rel_lift95(gates, held_out, runs_per_draw=1) == -5.0
    assert rel_lift95(gates, held_out, runs_per_draw=4) == -5.0
    # better gate, better lift: a larger budget B raises the lower tail
    gates, held_out = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [-4.0, -2.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert rel_lift95(gates, held_out, runs_per_draw=4) > rel_lift95(gates, held_out, runs_per_draw=1)


def test_rel_lift95_breaks_gate_ties_by_run_id_and_refuses_mismatched_input():
    assert rel_lift95([1.0, 1.0], [7.0, -7.0], runs_per_draw=8, run_ids=["b", "a"]) == -7.0
    with pytest.raises(ValueError, match="one gate statistic and one held-out lift per run"):
        rel_lift95([1.0], [1.0, 2.0])
