"""Evaluation rollouts: N episodes of a policy over a VecEnv, success table, videos.

Episodes are jobs (task, init-state index, seed) handed to whichever env is free, so B envs stay
busy until the last job; envs whose job queue is empty stop stepping. For LIBERO suites each task
gets `episodes // n_tasks` (at least 1) episodes starting from its fixed initial states.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from robo_rl.eval.video import annotate, write_mp4


class Policy(Protocol):
    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor | np.ndarray:  # [B, ...] -> [B, A]
        ...


@dataclass
class _Job:
    index: int
    task_id: int
    init_state_id: int | None
    seed: int
    record: bool
    ret: float = 0.0
    length: int = 0
    success: bool = False
    frames: list = field(default_factory=list)


def _jobs(task_ids, episodes: int, seed: int, use_init_states: bool, num_videos: int) -> list[_Job]:
    per_task = max(1, episodes // len(task_ids)) if use_init_states else None
    if per_task is None:
        pairs = [(task_ids[i % len(task_ids)], None) for i in range(episodes)]
    else:
        pairs = [(t, j) for t in task_ids for j in range(per_task)]
    return [_Job(i, t, s, seed + i, i < num_videos) for i, (t, s) in enumerate(pairs)]


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
    """Run `episodes` episodes; return the eval.json dict. `env` must not auto-reset.

    Returns {"success_rate", "num_episodes", "mean_return", "mean_length", "per_task": {task: rate},
    "episodes": [{task_id, init_state_id, seed, return, length, success}], "videos": [...], "wall_s"}.
    """
    spec = env.spec
    use_init_states = spec.suite == "libero"
    jobs = _jobs(list(spec.task_ids), episodes, seed, use_init_states, num_videos if video_dir else 0)
    queue, running, done = list(jobs), [None] * env.num_envs, []
    current_task = [spec.task_ids[i % len(spec.task_ids)] for i in range(env.num_envs)]

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
        if hasattr(policy, "reset"):
            policy.reset(starts)
        options = [{"task_id": running[i].task_id, "init_state_id": running[i].init_state_id} for i in starts]
        seeds = [running[i].seed for i in starts] + [None] * len(idle)
        return env.reset_envs(starts + idle, seed=seeds, options=options + [None] * len(idle))

    t0 = time.time()
    obs = assign(list(range(env.num_envs)), reset_idle=True)
    bar = tqdm(total=len(jobs), desc="eval", disable=not progress, leave=False)
    while any(j is not None for j in running):
        active = np.array([j is not None for j in running])
        actions = policy.act(obs)
        result = env.step(actions, active=active)
        obs = result.obs
        if any(j is not None and j.record for j in running):
            _record_frames(env, running, result, wrist_video)
        finished = []
        for i, job in enumerate(running):
            if job is None:
                continue
            job.ret += float(result.reward[i])
            job.length += 1
            job.success |= bool(result.success[i])
            if bool(result.terminated[i] or result.truncated[i]):
                done.append(job)
                finished.append(i)
                bar.update(1)
                bar.set_postfix(success=f"{np.mean([j.success for j in done]):.2f}")
        if finished:
            obs = assign(finished)
    bar.close()
    return _summary(sorted(done, key=lambda j: j.index), video_dir, time.time() - t0)


def _record_frames(env, running, result, wrist_video: bool) -> None:
    ids = [i for i, j in enumerate(running) if j is not None and j.record]
    frames = env.render(ids, camera="agentview")
    if wrist_video:
        frames = np.concatenate([frames, env.render(ids, camera="robot0_eye_in_hand")], axis=2)
    for i, frame in zip(ids, frames):
        job = running[i]
        text = f"t={job.length + 1} {'success' if (job.success or bool(result.success[i])) else ''}"
        job.frames.append(annotate(frame, text, job.success or bool(result.success[i])))


def _summary(jobs: list[_Job], video_dir, wall_s: float) -> dict:
    per_task = defaultdict(list)
    for j in jobs:
        per_task[j.task_id].append(j.success)
    videos = []
    for j in jobs:
        if j.record and j.frames:
            name = f"episode{j.index:03d}_task{j.task_id}_{'success' if j.success else 'fail'}.mp4"
            videos.append(str(write_mp4(Path(video_dir) / name, j.frames)))
    return {
        "success_rate": float(np.mean([j.success for j in jobs])),
        "num_episodes": len(jobs),
        "mean_return": float(np.mean([j.ret for j in jobs])),
        "mean_length": float(np.mean([j.length for j in jobs])),
        "per_task": {str(t): float(np.mean(s)) for t, s in sorted(per_task.items())},
        "episodes": [
            {"task_id": j.task_id, "init_state_id": j.init_state_id, "seed": j.seed,
             "return": j.ret, "length": j.length, "success": j.success}
            for j in jobs
        ],
        "videos": videos,
        "wall_s": wall_s,
    }
