"""Evaluation intervals against worked examples computed by hand."""
import math

import pytest

from robo_rl.eval.stats import paired_difference, success_ci

Z = 1.959964  # standard normal 0.975 quantile


def test_wilson_interval_of_7_successes_in_10():
    # Wilson: (k + z²/2 ± z·sqrt(k(n−k)/n + z²/4)) / (n + z²) with k = 7, n = 10
    center, half = (7 + Z**2 / 2) / (10 + Z**2), Z * math.sqrt(7 * 3 / 10 + Z**2 / 4) / (10 + Z**2)
    assert (center - half, center + half) == pytest.approx((0.3968, 0.8922), abs=1e-4)
    assert success_ci([True] * 7 + [False] * 3) == pytest.approx((center - half, center + half), abs=1e-5)


def test_wilson_interval_at_the_edges_stays_inside_0_1():
    lo, hi = success_ci([False] * 4)  # 0 of 4: [0, z²/(n + z²)]
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(Z**2 / (4 + Z**2), abs=1e-5)
    lo, hi = success_ci([True] * 4)
    assert lo == pytest.approx(4 / (4 + Z**2), abs=1e-5) and hi == pytest.approx(1.0)
    narrower = success_ci([True] * 7 + [False] * 3, confidence=0.5)
    assert 0.3968 < narrower[0] < 0.7 < narrower[1] < 0.8922
    with pytest.raises(ValueError, match="at least one episode"):
        success_ci([])


def test_paired_difference_t_interval():
    a = [1, 1, 0, 1, 0, 1, 1, 1]
    b = [0, 1, 0, 0, 1, 0, 1, 0]  # d = [1, 0, 0, 1, -1, 1, 0, 1]
    # mean 3/8; squared deviations 4·0.625² + 3·0.375² + 1.375² = 3.875, sd = sqrt(3.875/7) = 0.744024;
    # t(0.975, 7) = 2.364624: half width 2.364624·0.744024/sqrt(8) = 0.622019
    result = paired_difference(a, b)
    assert result["episodes"] == 8 and result["mean"] == pytest.approx(0.375)
    assert result["ci_low"] == pytest.approx(0.375 - 0.622019, abs=1e-5)
    assert result["ci_high"] == pytest.approx(0.375 + 0.622019, abs=1e-5)
    assert paired_difference([True] * 8, [bool(x) for x in b])["mean"] == pytest.approx(1 - 3 / 8)


def test_paired_difference_degenerate_cases():
    same = paired_difference([True, False, True], [False, True, False])  # d = [1, -1, 1]: sd > 0
    assert same["ci_low"] < same["mean"] < same["ci_high"]
    constant = paired_difference([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])  # every d_i = 1: sd = 0
    assert constant == {"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0, "episodes": 3}
    assert paired_difference([0.1] * 5, [0.0] * 5)["ci_low"] == paired_difference([0.1] * 5, [0.0] * 5)["ci_high"]
    with pytest.raises(ValueError, match="at least 2 paired episodes"):
        paired_difference([True], [False])
    with pytest.raises(ValueError, match="paired episodes"):
        paired_difference([True, False], [True])
