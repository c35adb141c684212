"""Evaluation rollouts: N episodes of one or several actors over a VecEnv, success table, videos.

Episodes are jobs (task, init-state index, seed) handed to whichever env is free, so B envs stay
busy until the last job; envs whose job queue is empty stop stepping. For LIBERO suites each task
gets `episodes // n_tasks` (at least 1) episodes, episode j of task t starting from init state j of
`get_task_init_states(t)` (LIBERO's protocol; the env settles the scene first, robo_rl/envs/libero.py).

Several actors are compared on paired episodes in one pass: episode i is the same job (task, init
state, seed + i) for every actor, and its record holds `init_digest` (a hash of its first
observation) to check that. Jobs run episode-major (episode 0 of every actor, then episode 1, ...)
and each step calls every actor once, on the observations of its own envs.

An episode cut short by a dead env worker is not scored: it is run again from its start (same
seed and init state) on the restarted env; `worker_restarts` counts these. An episode whose worker dies
a second time is recorded as failed, with the reason (`failure`), so one crashing state cannot stall a
suite. With an `EpisodeJournal` (robo_rl/eval/journal.py) each finished episode is appended to it as it
ends, and the jobs it already holds are not played again: a killed evaluation resumes where it stopped.
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

from robo_rl.eval.journal import EpisodeJournal, episode_key
from robo_rl.eval.stats import paired_difference, success_ci
from robo_rl.eval.video import annotate, write_mp4
from robo_rl.utils.logging import progress_bar


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
    retried: bool = False  # a dead worker already cut this job short once
    init_digest: str = ""
    ret: float = 0.0
    length: int = 0
    success: bool = False
    frames: list = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return episode_key(self.actor, self.task_id, self.init_state_id, self.seed)

    def again(self) -> _Job:
        """The same job from its start, marked as retried."""
        return _Job(self.actor, self.index, self.task_id, self.init_state_id, self.seed, self.record, retried=True)


def _jobs(actors: list[str], task_ids, episodes: int, seed: int, use_init_states: bool,
          num_videos: int) -> list[_Job]:
    """Paired jobs, episode-major. Recorded as video: the first num_videos episodes, or with init states
    (LIBERO) the first episode of each task when num_videos > 0. With init states, episode j of task t is
    episode t * per_task + j whichever tasks are evaluated, so an evaluation split by task (task.task_ids)
    plays the very jobs (same seeds) of the whole suite's."""
    if not use_init_states:
        return [_Job(a, i, task_ids[i % len(task_ids)], None, seed + i, i < num_videos)
                for i in range(episodes) for a in actors]
    per_task = max(1, episodes // len(task_ids))
    return [_Job(a, t * per_task + j, t, j, seed + t * per_task + j, j == 0 and num_videos > 0)
            for t in task_ids for j in range(per_task) for a in actors]


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
    journal: EpisodeJournal | None = None,
) -> dict:
    """One policy (named "policy" in video names): its evaluate_actors summary plus "wall_s", "worker_restarts"."""
    result = evaluate_actors(env, {"policy": policy}, episodes, seed, video_dir, num_videos, wrist_video, progress,
                             journal)
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
    journal: EpisodeJournal | None = None,
) -> dict:
    """Run `episodes` paired episodes of every actor in one pass over `env` (which must not auto-reset).

    Returns {"actors": {name: summary}, "gains": {name: paired_difference(name, "none")} and
    "search_gain" (= gains["qwm"]) when a "none" actor and at least 2 episodes allow them, "wall_s",
    "worker_restarts" (env workers replaced since `env` was built; their episodes were rerun)}.
    A summary is {"success_rate" (the mean over tasks of each task's success rate: the suite mean),
    "success_ci": [lo, hi] (Wilson 95% over all episodes), "episodes" (= "num_episodes"), "failed_episodes"
    (lost to a dead worker twice), "mean_return", "mean_length", "per_task": [{task_id, instruction,
    success_rate, success_ci, episodes}], "ms_per_decision" (wall time in `act` per env decision of this
    call; None when the journal held every episode), "per_episode": [{actor, index, task_id, init_state_id,
    seed, instruction, init_digest, return, length, success, failure, video}], "videos": [the recorded
    episodes, e.g. qwm_episode000_task0_success.mp4]}.
    journal: episodes it holds are taken from it, not played; each episode played is appended to it.
    """
    spec = env.spec
    use_init_states = spec.suite == "libero"
    jobs = _jobs(list(actors), list(spec.task_ids), episodes, seed, use_init_states, num_videos if video_dir else 0)
    finished = journal.records if journal is not None else {}
    done = [finished[j.key] for j in jobs if j.key in finished]  # records, as the journal holds them
    if done:
        print(f"[eval] {len(done)} of {len(jobs)} episodes already in {journal.path}: not played again", flush=True)
    queue, running = [j for j in jobs if j.key not in finished], [None] * env.num_envs
    current_task = [spec.task_ids[i % len(spec.task_ids)] for i in range(env.num_envs)]
    act_s, decisions = dict.fromkeys(actors, 0.0), dict.fromkeys(actors, 0)
    instructions: dict[int, str] = {}

    def finish(job: _Job, failure: str | None = None) -> None:
        record = _record(job, instructions[job.task_id], video_dir, failure)
        if journal is not None:
            journal.append(record)
        done.append(record)
        bar.update(1)
        bar.set_postfix({a: f"{np.mean([r['success'] for r in done if r['actor'] == a] or [0]):.2f}" for a in actors})

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
        if any(running[i].task_id not in instructions for i in starts):
            names = env.get("instruction")
            instructions.update({running[i].task_id: names[i] for i in starts})
        for i in starts:
            running[i].init_digest = init_digest(new_obs, i)
        return new_obs

    t0 = time.time()
    bar = progress_bar(total=len(jobs), initial=len(done), desc="eval", disable=not progress, leave=False)
    obs = assign(list(range(env.num_envs)), reset_idle=True) if queue else None
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
        freed = []
        for i, job in enumerate(running):
            if job is None:
                continue
            if bool(result.lost[i]):  # the worker died: run the episode again, once
                if job.retried:
                    finish(job, failure=f"env worker died twice in this episode, last: {env.lost_reasons[i]}")
                else:
                    queue.insert(0, job.again())
                freed.append(i)
                continue
            job.ret += float(result.reward[i])
            job.length += 1
            job.success |= bool(result.success[i])
            if bool(result.terminated[i] or result.truncated[i]):
                finish(job)
                freed.append(i)
        if freed:
            obs = assign(freed)
    bar.close()
    by_actor = {a: sorted((r for r in done if r["actor"] == a), key=lambda r: r["index"]) for a in actors}
    out = {"actors": {a: summarize_episodes(by_actor[a], 1000 * act_s[a] / decisions[a] if decisions[a] else None)
                      for a in actors}}
    if "none" in actors and len(by_actor["none"]) >= 2:
        base = [r["success"] for r in by_actor["none"]]
        out["gains"] = {a: paired_difference([r["success"] for r in by_actor[a]], base) for a in actors if a != "none"}
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


def _record(job: _Job, instruction: str, video_dir, failure: str | None) -> dict:
    """A finished episode as eval.json and the journal hold it; its video (if recorded) written now."""
    video = None
    if job.record and job.frames:
        name = f"{job.actor}_episode{job.index:03d}_task{job.task_id}_{'success' if job.success else 'fail'}.mp4"
        video = str(write_mp4(Path(video_dir) / name, job.frames))
        job.frames = []
    return {"actor": job.actor, "index": job.index, "task_id": job.task_id, "init_state_id": job.init_state_id,
            "seed": job.seed, "instruction": instruction, "init_digest": job.init_digest, "return": job.ret,
            "length": job.length, "success": job.success, "failure": failure, "video": video}


def summarize_episodes(records: list[dict], ms_per_decision: float | None) -> dict:
    """An actor's summary in eval.json from its episode records (`per_episode`): the success rate as the mean
    over tasks of each task's rate, its Wilson interval over all episodes, per-task rows, returns, lengths."""
    by_task = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(r)
    per_task = [{"task_id": t, "instruction": rs[0]["instruction"], "success_rate": float(np.mean([r["success"] for r in rs])),
                 "success_ci": list(success_ci([r["success"] for r in rs])), "episodes": len(rs)}
                for t, rs in sorted(by_task.items())]
    successes = [r["success"] for r in records]
    return {
        "success_rate": float(np.mean([p["success_rate"] for p in per_task])),
        "success_ci": list(success_ci(successes)),
        "episodes": len(records),
        "num_episodes": len(records),
        "failed_episodes": sum(r["failure"] is not None for r in records),
        "mean_return": float(np.mean([r["return"] for r in records])),
        "mean_length": float(np.mean([r["length"] for r in records])),
        "per_task": per_task,
        "ms_per_decision": ms_per_decision,
        "per_episode": records,
        "videos": [r["video"] for r in records if r["video"]],
    }
