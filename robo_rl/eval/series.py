"""Evaluations of one run's checkpoints as a series over online env steps: does search help more as the run
goes on? `scripts/plot_evals.py` draws it.

The input is directories that `evaluate.py checkpoint=... compare=[none,...]` wrote (eval.json with `actors`
and the checkpoint's `env_steps`); the curve checkpoints a run keeps (`checkpoints/curve/step_*.pt`) are the
natural ones to evaluate. Several evaluations of one checkpoint on different episodes (`seed=` apart by at
least the episode count: `evaluate.py seed=S` plays env seeds 10000 + S + i) are pooled into one point: each
actor's success over all their episodes (the suite mean over tasks, Wilson 95% interval over the episodes), and
each actor's gain over `none`, paired episode by episode within each evaluation, with the t interval over all
pairs. An episode evaluated twice (the same task, init state and seed in two evaluations of one checkpoint) would
count twice, so it is an error.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402

from robo_rl.eval.rollout import summarize_episodes  # noqa: E402
from robo_rl.eval.stats import paired_difference  # noqa: E402
from robo_rl.utils.schema import ConfigError  # noqa: E402

BASELINE = "none"  # gains are paired differences against the policy alone


def load_series(eval_dirs: Sequence[str | Path]) -> dict:
    """Evaluation directories -> the series, its points in env-step order:

    {"env_steps": [...], "checkpoints": [...], "episodes": [...] (per point),
     "actors": {name: {"success": [...], "success_ci": [[lo, hi], ...]}},
     "gains": {name: {"mean": [...], "ci_low": [...], "ci_high": [...]}}}   (name: every actor but `none`)
    An actor missing at a point has None there."""
    by_checkpoint: dict[str, list[tuple[Path, dict]]] = defaultdict(list)
    for directory in eval_dirs:
        path = Path(directory) / "eval.json"  # present: PlotEvalsConfig checks it at the door
        result = json.loads(path.read_text())
        if "actors" not in result or "env_steps" not in result:
            raise ConfigError(f"{path} is not a comparison of a checkpoint: write it with `evaluate.py checkpoint=CKPT "
                              "compare=[none,best_of_n,qwm]` (an eval.json older than 2026-12-05 lacks env_steps: "
                              "evaluate again)")
        by_checkpoint[result["checkpoint"]].append((path, result))
    points = sorted((_pool(evals) for evals in by_checkpoint.values()), key=lambda p: p["env_steps"])
    steps = [p["env_steps"] for p in points]
    if clashes := sorted({s for s in steps if steps.count(s) > 1}):
        raise ConfigError(f"more than one checkpoint at env steps {clashes} "
                          f"({[p['checkpoint'] for p in points if p['env_steps'] in clashes]}): plot one run at a time")
    names = list(dict.fromkeys(name for p in points for name in p["actors"]))
    return {
        "env_steps": steps,
        "checkpoints": [p["checkpoint"] for p in points],
        "episodes": [p["episodes"] for p in points],
        "actors": {n: {k: [p["actors"].get(n, {}).get(k) for p in points] for k in ("success", "success_ci")}
                   for n in names},
        "gains": {n: {k: [p["gains"].get(n, {}).get(k) for p in points] for k in ("mean", "ci_low", "ci_high")}
                  for n in names if n != BASELINE},
    }


def _pool(evals: list[tuple[Path, dict]]) -> dict:
    """The evaluations of one checkpoint -> one point: pooled success per actor, pooled paired gains."""
    first_path, first = evals[0]
    names = list(first["actors"])
    seen: dict[tuple, Path] = {}
    records: dict[str, list[dict]] = defaultdict(list)
    pairs: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))  # actor's and none's success, paired
    for path, result in evals:
        if list(result["actors"]) != names:
            raise ConfigError(f"{path} compares {list(result['actors'])}, {first_path} {names}: pool evaluations "
                              "of the same actors")
        episodes = {n: {_key(e): e for e in result["actors"][n]["per_episode"]} for n in names}
        for key in episodes[names[0]]:
            if key in seen:
                raise ConfigError(f"{path} and {seen[key]} both hold the episode {key} (task, init state, seed, "
                                  "digest) of one checkpoint: evaluate.py seed=S plays env seeds 10000 + S + i, so "
                                  "add episodes with a seed= at least the episode count above the last one")
            seen[key] = path
        for n in names:
            records[n] += episodes[n].values()
            if n != BASELINE and BASELINE in episodes:
                for k in (k for k in episodes[n] if k in episodes[BASELINE]):  # in episode order: reproducible sums
                    pairs[n][0].append(float(episodes[n][k]["success"]))
                    pairs[n][1].append(float(episodes[BASELINE][k]["success"]))
    summaries = {n: summarize_episodes(rs, None) for n, rs in records.items()}  # as evaluate.py summarises
    actors = {n: {"success": x["success_rate"], "success_ci": x["success_ci"]} for n, x in summaries.items()}
    gains = {n: paired_difference(a, b) for n, (a, b) in pairs.items() if len(a) >= 2}
    return {"checkpoint": first["checkpoint"], "env_steps": first["env_steps"], "actors": actors, "gains": gains,
            "episodes": len(records[names[0]])}


def _key(episode: dict) -> tuple:
    return episode["task_id"], episode["init_state_id"], episode["seed"], episode["init_digest"]


def plot_series(series: dict, png: str | Path, title: str = "") -> None:
    """Two panels against online env steps: each actor's success (Wilson 95% bars) and its paired gain over
    the policy alone (t interval bars; the zero line is "search neither helps nor hurts")."""
    steps = np.asarray(series["env_steps"])
    offset = 0.006 * (steps.max() - steps.min() if len(steps) > 1 else 1.0)  # actors side by side at a point
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for i, (name, a) in enumerate(series["actors"].items()):
        have = [j for j, s in enumerate(a["success"]) if s is not None]
        x = steps[have] + (i - 1) * offset
        y = np.asarray([a["success"][j] for j in have])
        lo, hi = (np.asarray([a["success_ci"][j][k] for j in have]) for k in (0, 1))
        top.errorbar(x, y, yerr=[y - lo, hi - y], fmt="o-", capsize=3, label=name, color=f"C{i}")
        if name in series["gains"]:
            g = series["gains"][name]
            have = [j for j, m in enumerate(g["mean"]) if m is not None]
            m = np.asarray([g["mean"][j] for j in have])
            lo, hi = (np.asarray([g[k][j] for j in have]) for k in ("ci_low", "ci_high"))
            bottom.errorbar(steps[have] + (i - 1) * offset, m, yerr=[m - lo, hi - m], fmt="o-", capsize=3,
                            label=f"{name} - {BASELINE}", color=f"C{i}")
    top.set(ylabel="success rate", ylim=(-0.02, 1.02), title=title or None)
    bottom.axhline(0.0, color="gray", ls=":")
    bottom.set(xlabel="online env steps of the checkpoint", ylabel=f"paired gain over {BASELINE}")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    episodes = sorted(set(series["episodes"]))
    fig.text(0.01, 0.005, f"episodes per point: {', '.join(map(str, episodes))} (paired across actors)", fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
