"""Scripted demonstrations: a task's expert rolled out in the simulator, its successful episodes kept.

`scripts/collect_demos.py` writes them as robomimic HDF5 (robosuite tasks) or as LIBERO HDF5, one file per
task (LIBERO suites); training without `dataset=` collects and caches them on first use
(`robo_rl/train/sources.py`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from robo_rl.data.hdf5 import Episode, write_libero
from robo_rl.demos.experts import EXPERTS
from robo_rl.envs.libero import load_suite
from robo_rl.envs.robosuite import robosuite_env_kwargs
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv
from robo_rl.utils.logging import progress_bar


def collect_demos(spec: EnvSpec, expert_name: str, num_demos: int, noise: float = 0.1, seed: int = 0,
                  num_envs: int = 2, workers: str = "subprocess", max_attempts_factor: int = 3,
                  progress: bool = True, keep_failures: bool = False):
    """Roll out a scripted expert until `num_demos` successful episodes are collected.

    Returns (episodes, expert_success_rate, env_args). Episodes carry MuJoCo states and the scene
    XML so they can be written as robomimic HDF5 and replayed. Failed attempts are discarded; the
    success rate over all attempts is reported (and stored by the caller as a file attribute).
    keep_failures: keep every attempt instead, `num_demos` episodes in all; a failed one runs to the
    horizon without a terminal step (robomimic `dones` all 0), so the buffer flags it unsuccessful and
    `agent.bc_data=successes` does not clone it, while the critic learns what failing looks like.
    The envs also observe the keys the expert reads that `spec` lacks (image obs carry no object poses):
    the episodes hold them too.
    """
    expert = EXPERTS[expert_name](num_envs, noise=noise, seed=seed)
    unobserved = tuple(k for k in expert.obs_keys if k not in spec.low_dim_keys)
    spec = dataclasses.replace(spec, low_dim_keys=spec.low_dim_keys + unobserved)
    episodes, attempts, successes, next_seed = [], 0, 0, seed
    max_attempts = max_attempts_factor * num_demos
    bar = progress_bar(total=num_demos, desc=f"demos {spec.env_name}", disable=not progress, leave=False)
    with VecEnv(spec, num_envs, workers=workers, autoreset=False) as env:
        model_xml = env.get("model_xml")[0]
        while len(episodes) < num_demos and attempts < max_attempts:
            obs = env.reset(seed=next_seed)
            next_seed += num_envs
            expert.reset()
            traces = [dict(obs=[], actions=[], rewards=[], states=[]) for _ in range(num_envs)]
            for i in range(num_envs):
                traces[i]["obs"].append({k: v[i].numpy() for k, v in obs.items()})
            done, success = np.zeros(num_envs, bool), np.zeros(num_envs, bool)
            while not done.all():
                states = env.get("sim_state")
                actions = expert.act(obs)
                result = env.step(actions, active=~done)
                for i in np.flatnonzero(~done):
                    tr = traces[i]
                    tr["states"].append(states[i])
                    tr["actions"].append(actions[i])
                    tr["rewards"].append(float(result.reward[i]))
                    tr["obs"].append({k: v[i].numpy() for k, v in result.next_obs.items()})
                success |= result.success.numpy() & ~done
                done |= result.done.numpy()
                obs = result.obs
            attempts += num_envs
            successes += int(success.sum())
            for i in range(num_envs) if keep_failures else np.flatnonzero(success):
                if len(episodes) == num_demos:
                    break
                tr = traces[i]
                terminals = np.zeros(len(tr["actions"]), bool)
                terminals[-1] = success[i]
                episodes.append(Episode(
                    obs={k: np.stack([o[k] for o in tr["obs"]]) for k in tr["obs"][0]},
                    actions=np.asarray(tr["actions"], np.float32),
                    rewards=np.asarray(tr["rewards"], np.float32),
                    terminals=terminals,
                    states=np.asarray(tr["states"]),
                    model_file=model_xml,
                ))
                bar.update(1)
    bar.close()
    if len(episodes) < num_demos and not keep_failures:
        raise RuntimeError(f"scripted {expert_name} expert collected only {len(episodes)}/{num_demos} successful "
                           f"demos in {attempts} attempts; lower the noise or raise the horizon")
    env_args = {"env_name": spec.env_name, "type": 1,
                "env_kwargs": robosuite_env_kwargs(spec) if spec.suite == "robosuite" else {}}
    return episodes, successes / attempts, env_args


def collect_libero_demos(spec: EnvSpec, expert_name: str, num_demos: int, folder: str | Path, noise: float = 0.1,
                         seed: int = 0, num_envs: int = 2) -> list[Path]:
    """`num_demos` scripted demos of each task of `spec.task_ids`, one LIBERO file per task in `folder`, named as
    LIBERO names its files (`<bddl name>_demo.hdf5`); a task whose file exists is not collected again.
    Demos start from random placements (env seeds), not from the evaluation's fixed init states. Returns the
    files, in task order; each records its expert's success rate as `expert_success_rate`."""
    suite = load_suite(spec.env_name)
    paths = []
    for task_id in spec.task_ids:
        task = suite.get_task(task_id)
        path = Path(folder) / f"{Path(task.bddl_file).stem}_demo.hdf5"
        paths.append(path)
        if path.exists():
            continue
        episodes, rate, env_args = collect_demos(dataclasses.replace(spec, task_ids=(task_id,)), expert_name,
                                                 num_demos, noise=noise, seed=seed, num_envs=num_envs)
        print(f"[demos] {spec.env_name} task {task_id} ({task.language}): {len(episodes)} demos, "
              f"expert success rate {rate:.2f} -> {path}", flush=True)
        write_libero(path, episodes, task.language, f"{task.problem_folder}/{task.bddl_file}", env_args,
                     attrs={"expert_success_rate": rate, "num_demos": len(episodes)})
    return paths
