"""Scripted demonstrations: a task's expert rolled out in the simulator, its successful episodes kept.

`scripts/collect_demos.py` writes them as robomimic HDF5; training without `dataset=` collects and
caches them on first use (`robo_rl/train/sources.py`).
"""
from __future__ import annotations

import numpy as np
from tqdm import tqdm

from robo_rl.data.hdf5 import Episode
from robo_rl.demos.experts import EXPERTS
from robo_rl.envs.robosuite import robosuite_env_kwargs
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv


def collect_demos(spec: EnvSpec, expert_name: str, num_demos: int, noise: float = 0.1, seed: int = 0,
                  num_envs: int = 2, workers: str = "subprocess", max_attempts_factor: int = 3,
                  progress: bool = True):
    """Roll out a scripted expert until `num_demos` successful episodes are collected.

    Returns (episodes, expert_success_rate, env_args). Episodes carry MuJoCo states and the scene
    XML so they can be written as robomimic HDF5 and replayed. Failed attempts are discarded; the
    success rate over all attempts is reported (and stored by the caller as a file attribute).
    """
    expert = EXPERTS[expert_name](num_envs, noise=noise, seed=seed)
    episodes, attempts, successes, next_seed = [], 0, 0, seed
    max_attempts = max_attempts_factor * num_demos
    bar = tqdm(total=num_demos, desc=f"demos {spec.env_name}", disable=not progress, leave=False)
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
            for i in np.flatnonzero(success):
                if len(episodes) == num_demos:
                    break
                tr = traces[i]
                terminals = np.zeros(len(tr["actions"]), bool)
                terminals[-1] = True
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
    if len(episodes) < num_demos:
        raise RuntimeError(f"scripted {expert_name} expert collected only {len(episodes)}/{num_demos} successful "
                           f"demos in {attempts} attempts; lower the noise or raise the horizon")
    env_args = {"env_name": spec.env_name, "type": 1, "env_kwargs": robosuite_env_kwargs(spec)}
    return episodes, successes / attempts, env_args
