"""A simulator oracle for action scorers: the true value of an action, measured by restoring MuJoCo.

A search can only pick well if its scores rank candidate actions the way their real consequences
do. The simulator can tell us those consequences: save the full MuJoCo state of a visited state,
execute a candidate action there, let a rollout policy finish the episode, and average its success
and discounted return over R rollouts. Scorers (critic best-of-N, QWM's tree value, ...) are then
judged by the true value of what they pick and by how well their scores rank the candidates
(`benchmarks/search_oracle.py`).

States are the envs' `snapshot()`s (`robo_rl/envs/base.py`): the MuJoCo state plus what robosuite
keeps outside it, the episode's step counter included, so a restored episode still ends at its horizon. `tests/test_oracle.py` checks that a restored snapshot
replays the original actions to the same trajectory before any value here is trusted.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from einops import rearrange

from robo_rl.envs.vector import VecEnv


@dataclass
class VisitedState:
    """One state along a rollout of the visiting policy, with what followed it."""

    state: dict  # the env's `snapshot()` there
    obs: dict[str, np.ndarray]  # the observation there, one env's
    t: int  # its step index in the episode
    mc_return: float  # discounted return the visiting rollout got from here on
    success: bool  # whether that rollout succeeded later
    future_obs: list[dict[str, np.ndarray]]  # the next real observations (up to `depth` of them)
    future_actions: np.ndarray  # [d, A]: the actions that led to them


@dataclass
class _Step:
    state: dict
    obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: float


def _row(obs: dict[str, torch.Tensor], i: int) -> dict[str, np.ndarray]:
    return {k: v[i].numpy().copy() for k, v in obs.items()}


def visit_states(env: VecEnv, policy, num_states: int, seed: int, gamma: float, depth: int = 3,
                 per_episode: int = 5) -> list[VisitedState]:
    """Roll `policy` out from seeded resets and keep `per_episode` evenly spaced states of each
    episode until `num_states` are kept. `env` must not auto-reset; `policy.act(obs [B, ...]) -> [B, A]`."""
    episodes_left = -(-num_states // per_episode)
    visited: list[VisitedState] = []
    while episodes_left > 0:
        ids = list(range(min(env.num_envs, episodes_left)))
        obs = env.reset(seed=seed)  # every env, so each has an observation; the first len(ids) run
        seed, episodes_left = seed + env.num_envs, episodes_left - len(ids)
        if hasattr(policy, "reset"):
            policy.reset(ids)
        steps: list[list[_Step]] = [[] for _ in ids]
        running = np.zeros(env.num_envs, bool)
        running[ids] = True
        success = np.zeros(env.num_envs, bool)
        while running.any():
            states = env.get("snapshot")
            actions = np.asarray(policy.act(obs), dtype=np.float32)
            result = env.step(actions, active=running)
            for i in np.flatnonzero(running):
                steps[i].append(_Step(states[i], _row(obs, i), actions[i], float(result.reward[i])))
                success[i] |= bool(result.success[i])
            running &= ~result.done.numpy()
            obs = result.obs
        for i in ids:
            visited += _keep_states(steps[i], bool(success[i]), per_episode, gamma, depth)
    return visited[:num_states]


def _keep_states(steps: list[_Step], success: bool, count: int, gamma: float, depth: int) -> list[VisitedState]:
    rewards = np.array([s.reward for s in steps])
    returns = np.zeros(len(steps))  # discounted return from each step on
    running = 0.0
    for t in reversed(range(len(steps))):
        running = rewards[t] + gamma * running
        returns[t] = running
    kept = np.unique(np.linspace(0, len(steps) - 1, count).round().astype(int))
    visited = []
    for t in kept:
        future = steps[t + 1: t + 1 + depth]  # the observations the next len(future) actions reached
        actions = np.stack([s.action for s in steps[t: t + len(future)]]) if future else np.zeros((0, steps[t].action.size))
        visited.append(VisitedState(steps[t].state, steps[t].obs, int(t), float(returns[t]), success,
                                    [s.obs for s in future], actions))
    return visited


def action_values(env: VecEnv, states: Sequence[VisitedState], candidates: np.ndarray, policy, rollouts: int,
                  gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """True value of each candidate: candidates [S, N, A] (or chunks [S, N, h*A]) -> (success, return),
    each [S, N, R], one entry per rollout (R = `rollouts`; average over the last axis for the values).

    A rollout restores the state, executes the candidate (a chunk open loop), then lets `policy` act
    until the episode ends (success, or the episode's horizon). Jobs (state, candidate, rollout) are handed
    to whichever env is free, so all envs stay busy. `env` must not auto-reset.
    """
    S, N = candidates.shape[:2]
    action_dim = env.action_dim
    first_actions = rearrange(candidates, "s n (h a) -> s n h a", a=action_dim)
    jobs = [(s, n, r) for s in range(S) for n in range(N) for r in range(rollouts)]
    success, returns = np.zeros((S, N, rollouts)), np.zeros((S, N, rollouts))
    running: list[dict | None] = [None] * env.num_envs
    obs = None

    def start(env_ids: list[int]) -> None:
        nonlocal obs
        starts = []
        for i in env_ids:
            running[i] = None
            if jobs:
                s, n, r = jobs.pop()
                running[i] = {"s": s, "n": n, "r": r, "k": 0, "ret": 0.0}
                starts.append(i)
        if starts:
            obs = env.reset_envs(starts, options=[{"snapshot": states[running[i]["s"]].state} for i in starts])
            if hasattr(policy, "reset"):
                policy.reset(starts)

    start(list(range(env.num_envs)))
    while any(job is not None for job in running):
        active = np.array([job is not None for job in running])
        actions = np.asarray(policy.act(obs), dtype=np.float32).copy()
        for i, job in enumerate(running):
            if job is not None and job["k"] < first_actions.shape[2]:
                actions[i] = first_actions[job["s"], job["n"], job["k"]]
        result = env.step(actions, active=active)
        obs = result.obs
        finished = []
        for i in np.flatnonzero(active):
            job = running[i]
            job["ret"] += gamma ** job["k"] * float(result.reward[i])
            job["k"] += 1
            if bool(result.done[i]):
                success[job["s"], job["n"], job["r"]] = bool(result.success[i])
                returns[job["s"], job["n"], job["r"]] = job["ret"]
                finished.append(int(i))
        if finished:
            start(finished)
    return success, returns


def candidate_spread(outcomes: np.ndarray) -> dict:
    """How much the choice among a state's candidates matters: outcomes [S, N, R] (R >= 2 rollouts each).

    A candidate's R rollouts differ by the policy's later noise alone, so per state the one-way
    random-effects ANOVA separates the spread of the candidates' true values from that rollout noise:
    σ²_between = (MS_between − MS_within) / R. Returns "between_sd" (√ of its mean over states, clipped at
    0: what a perfect scorer could exploit), "within_sd" (the rollout noise) and "states_all_equal" (how
    many states gave every rollout of every candidate the same outcome: no choice changes anything there).
    """
    S, N, R = outcomes.shape
    if R < 2 or N < 2:
        raise ValueError(f"candidate_spread needs >= 2 candidates and >= 2 rollouts each, got N={N}, R={R}")
    means = outcomes.mean(2)  # [S, N]
    ms_between = R * means.var(1, ddof=1)
    ms_within = outcomes.var(2, ddof=1).mean(1)
    between = float(((ms_between - ms_within) / R).mean())
    return {"between_sd": float(np.sqrt(max(between, 0.0))), "within_sd": float(np.sqrt(ms_within.mean())),
            "states_all_equal": int((np.ptp(outcomes.reshape(S, -1), axis=1) == 0).sum())}


def cross_validated_best(outcomes: np.ndarray) -> float:
    """The oracle's pick without its selection bias: outcomes [S, N, R] (R >= 2) -> mean over states of the
    value, on the last R // 2 rollouts, of the candidate the first R − R // 2 rollouts rank best.

    The best of N candidates by their own R-rollout means is optimistic (the max of noisy estimates: with one
    rollout each and 8 candidates of true success 0.9 it reads ~1.0); valuing the pick on rollouts that did
    not choose it is not."""
    S, N, R = outcomes.shape
    if R < 2:
        raise ValueError(f"cross_validated_best needs >= 2 rollouts per candidate, got {R}")
    held_out = R // 2
    pick = outcomes[:, :, : R - held_out].mean(2).argmax(1)
    return float(outcomes[np.arange(S), pick, R - held_out:].mean())
