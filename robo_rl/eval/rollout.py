"""Evaluation rollouts: N episodes of one or several actors over a VecEnv, success table, videos.

Episodes are jobs (task, init-state index, seed) handed to whichever env is free, so B envs stay
busy until the last job; envs whose job queue is empty stop stepping. For LIBERO suites each task
gets `episodes // n_tasks` (at least 1) episodes starting from its fixed initial states.

Several actors are compared on paired episodes in one pass: episode i is the same job (task, init
state, seed + i) for every actor, and its record holds `init_digest` (a hash of its first
observation) to check that. Jobs run episode-major (episode 0 of every actor, then episode 1, ...)
and each step calls every actor once, on the observations of its own envs.

An episode cut short by a dead env worker is not scored: it is run again from its start (same
seed and init state) on the restarted env; `worker_restarts` counts these.
"""
from __future__ import annotations

import hashlib
import inspect
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from robo_rl.eval.stats import paired_difference, success_ci
from robo_rl.eval.video import annotate, write_mp4


EVAL_SEED_OFFSET = 10_000


def eval_seed(seed: int) -> int:
    """First env seed of the evaluation episodes of a run seeded `seed` (episode i: eval_seed(seed) + i).

    One convention for training's evaluations and `scripts/evaluate.py`: `evaluate.py seed=S` plays the
    episodes of the final evaluation of the training run with seed=S. Training's envs reset with
    `seed + 7919·k` (k >= 1), never this seed."""
    return EVAL_SEED_OFFSET + seed


class Policy(Protocol):
    """obs [n, ...] of the envs `env_ids` -> actions [n, A]. Policies whose `act` has no env_ids
    (random, scripted experts: state per batch row) get every env's obs [B, ...] and answer [B, A]."""

    def act(self, obs: dict[str, torch.Tensor], env_ids: list[int] | None = None) -> torch.Tensor | np.ndarray:
        ...


@dataclass
class _Job:
    actor: str
    index: int
    task_id: int
    init_state_id: int | None
    seed: int
    record: bool
    init_digest: str = ""
    ret: float = 0.0
    length: int = 0
    success: bool = False
    frames: list = field(default_factory=list)


def _jobs(actors: list[str], task_ids, episodes: int, seed: int, use_init_states: bool,
          num_videos: int) -> list[_Job]:
    per_task = max(1, episodes // len(task_ids)) if use_init_states else None
    if per_task is None:
        pairs = [(task_ids[i % len(task_ids)], None) for i in range(episodes)]
    else:
        pairs = [(t, j) for t in task_ids for j in range(per_task)]
    return [_Job(a, i, t, s, seed + i, i < num_videos) for i, (t, s) in enumerate(pairs) for a in actors]


def init_digest(obs: dict[str, torch.Tensor], row: int) -> str:
    """Short sha1 of env `row`'s observation: float32 (floats) or raw (integers) bytes of each key, sorted."""
    digest = hashlib.sha1()
    for key in sorted(obs):
        x = obs[key][row].numpy()
        digest.update(np.ascontiguousarray(x.astype(np.float32) if x.dtype.kind == "f" else x).tobytes())
    return digest.hexdigest()[:12]


def _act(policy: Policy, obs: dict[str, torch.Tensor], env_ids: list[int]) -> np.ndarray:
    """Actions [n, A] of `policy` for the envs env_ids, from the obs of all envs [B, ...]."""
    if "env_ids" in inspect.signature(policy.act).parameters:
        return np.asarray(policy.act({k: v[env_ids] for k, v in obs.items()}, env_ids=env_ids))
    return np.asarray(policy.act(obs))[env_ids]


def evaluate(
    env,
    policy: Policy,
    episodes: int,
    seed: int = 0,
    video_dir: str | Path | None = None,
    num_videos: int = 2,
    wrist_video: bool = False,
    progress: bool = True,
) -> dict:
    """One policy (named "policy" in video names): its evaluate_actors summary plus "wall_s", "worker_restarts"."""
    result = evaluate_actors(env, {"policy": policy}, episodes, seed, video_dir, num_videos, wrist_video, progress)
    return {**result["actors"]["policy"], "wall_s": result["wall_s"], "worker_restarts": result["worker_restarts"]}


def evaluate_actors(
    env,
    actors: dict[str, Policy],
    episodes: int,
    seed: int = 0,
    video_dir: str | Path | None = None,
    num_videos: int = 2,
    wrist_video: bool = False,
    progress: bool = True,
) -> dict:
    """Run `episodes` paired episodes of every actor in one pass over `env` (which must not auto-reset).

    Returns {"actors": {name: summary}, "gains": {name: paired_difference(name, "none")} and
    "search_gain" (= gains["qwm"]) when a "none" actor and at least 2 episodes allow them, "wall_s",
    "worker_restarts" (env workers replaced since `env` was built; their episodes were rerun)}.
    A summary is {"success_rate", "success_ci": [lo, hi] (Wilson 95%), "episodes" (= "num_episodes"),
    "mean_return", "mean_length", "per_task": {task: rate}, "ms_per_decision" (wall time in `act` per
    env decision), "per_episode": [{index, task_id, init_state_id, seed, init_digest, return, length,
    success}], "videos": [the first num_videos episodes, e.g. qwm_episode000_task0_success.mp4]}.
    """
    spec = env.spec
    use_init_states = spec.suite == "libero"
    jobs = _jobs(list(actors), list(spec.task_ids), episodes, seed, use_init_states, num_videos if video_dir else 0)
    queue, running, done = list(jobs), [None] * env.num_envs, []
    current_task = [spec.task_ids[i % len(spec.task_ids)] for i in range(env.num_envs)]
    act_s, decisions = dict.fromkeys(actors, 0.0), dict.fromkeys(actors, 0)

    def assign(env_ids: list[int], reset_idle: bool = False) -> dict:
        """Give each env in env_ids its next job (preferring its current task: no scene rebuild).
        reset_idle: also reset the envs left without a job (the first batch needs every env's obs)."""
        starts = []
        for i in env_ids:
            same_task = [j for j in queue if j.task_id == current_task[i]]
            running[i] = (same_task or queue or [None])[0]
            if running[i] is not None:
                queue.remove(running[i])
                current_task[i] = running[i].task_id
                starts.append(i)
        idle = [i for i in env_ids if running[i] is None] if reset_idle else []
        if not starts and not idle:
            return obs
        for name, policy in actors.items():
            if (ids := [i for i in starts if running[i].actor == name]) and hasattr(policy, "reset"):
                policy.reset(ids)
        options = [{"task_id": running[i].task_id, "init_state_id": running[i].init_state_id} for i in starts]
        seeds = [running[i].seed for i in starts] + [None] * len(idle)
        new_obs = env.reset_envs(starts + idle, seed=seeds, options=options + [None] * len(idle))
        for i in starts:
            running[i].init_digest = init_digest(new_obs, i)
        return new_obs

    t0 = time.time()
    obs = assign(list(range(env.num_envs)), reset_idle=True)
    bar = tqdm(total=len(jobs), desc="eval", disable=not progress, leave=False)
    while any(j is not None for j in running):
        actions = np.zeros((env.num_envs, env.action_dim), np.float32)
        for name, policy in actors.items():
            if ids := [i for i, j in enumerate(running) if j is not None and j.actor == name]:
                t = time.perf_counter()
                actions[ids] = _act(policy, obs, ids)
                act_s[name] += time.perf_counter() - t
                decisions[name] += len(ids)
        result = env.step(actions, active=np.array([j is not None for j in running]))
        obs = result.obs
        if any(j is not None and j.record for j in running):
            _record_frames(env, running, result, wrist_video)
        finished = []
        for i, job in enumerate(running):
            if job is None:
                continue
            if bool(result.lost[i]):  # the worker died: run the episode again
                queue.insert(0, _Job(job.actor, job.index, job.task_id, job.init_state_id, job.seed, job.record))
                finished.append(i)
                continue
            job.ret += float(result.reward[i])
            job.length += 1
            job.success |= bool(result.success[i])
            if bool(result.terminated[i] or result.truncated[i]):
                done.append(job)
                finished.append(i)
                bar.update(1)
                bar.set_postfix({a: f"{np.mean([j.success for j in done if j.actor == a] or [0]):.2f}" for a in actors})
        if finished:
            obs = assign(finished)
    bar.close()
    by_actor = {a: sorted((j for j in done if j.actor == a), key=lambda j: j.index) for a in actors}
    out = {"actors": {a: _summary(by_actor[a], video_dir, 1000 * act_s[a] / decisions[a]) for a in actors}}
    if "none" in actors and len(by_actor["none"]) >= 2:
        base = [j.success for j in by_actor["none"]]
        out["gains"] = {a: paired_difference([j.success for j in by_actor[a]], base) for a in actors if a != "none"}
        if "qwm" in out["gains"]:
            out["search_gain"] = out["gains"]["qwm"]
    return {**out, "wall_s": time.time() - t0, "worker_restarts": getattr(env, "num_restarts", 0)}


def _record_frames(env, running, result, wrist_video: bool) -> None:
    ids = [i for i, j in enumerate(running) if j is not None and j.record]
    frames = env.render(ids, camera="agentview")
    if wrist_video:
        frames = np.concatenate([frames, env.render(ids, camera="robot0_eye_in_hand")], axis=2)
    for i, frame in zip(ids, frames):
        job = running[i]
        text = f"t={job.length + 1} {'success' if (job.success or bool(result.success[i])) else ''}"
        job.frames.append(annotate(frame, text, job.success or bool(result.success[i])))


def _summary(jobs: list[_Job], video_dir, ms_per_decision: float) -> dict:
    per_task = defaultdict(list)
    for j in jobs:
        per_task[j.task_id].append(j.success)
    videos = []
    for j in jobs:
        if j.record and j.frames:
            name = f"{j.actor}_episode{j.index:03d}_task{j.task_id}_{'success' if j.success else 'fail'}.mp4"
            videos.append(str(write_mp4(Path(video_dir) / name, j.frames)))
    successes = [j.success for j in jobs]
    return {
        "success_rate": float(np.mean(successes)),
        "success_ci": list(success_ci(successes)),
        "episodes": len(jobs),
        "num_episodes": len(jobs),
        "mean_return": float(np.mean([j.ret for j in jobs])),
        "mean_length": float(np.mean([j.length for j in jobs])),
        "per_task": {str(t): float(np.mean(s)) for t, s in sorted(per_task.items())},
        "ms_per_decision": ms_per_decision,
        "per_episode": [
            {"index": j.index, "task_id": j.task_id, "init_state_id": j.init_state_id, "seed": j.seed,
             "init_digest": j.init_digest, "return": j.ret, "length": j.length, "success": j.success}
            for j in jobs
        ],
        "videos": videos,
    }
