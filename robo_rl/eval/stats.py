"""Intervals for evaluation results: a success rate, and the paired difference of two actors.

Paired: episode i of both actors starts from the same state (same task, init state and seed), so
the per-episode differences d_i = a_i − b_i cancel the episode's difficulty and the t interval on
their mean is much tighter than two independent success intervals would suggest.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def success_ci(successes: Sequence[bool], confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the success rate of n ≥ 1 episodes (sensible at 0 or n successes)."""
    if len(successes) == 0:
        raise ValueError("success_ci needs at least one episode")
    ci = stats.binomtest(int(sum(map(bool, successes))), len(successes)).proportion_ci(
        confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def paired_difference(a: Sequence[bool | float], b: Sequence[bool | float], confidence: float = 0.95) -> dict:
    """Mean of d_i = a_i − b_i over n ≥ 2 paired episodes and its Student-t interval.

    Returns {"mean", "ci_low", "ci_high", "episodes"}: mean ± t_{(1+c)/2, n−1}·sd/√n; when every d_i is
    equal (sd = 0) the interval is [mean, mean].
    """
    if len(a) != len(b):
        raise ValueError(f"paired_difference needs one b per a (paired episodes), got {len(a)} and {len(b)}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_difference needs at least 2 paired episodes for a t interval, got {n}")
    mean = float(d.mean())
    half = 0.0 if np.all(d == d[0]) else float(stats.t.ppf((1 + confidence) / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "episodes": n}
