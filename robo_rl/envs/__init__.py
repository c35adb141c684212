"""Batched environments: `make_vec_env(cfg)` builds the backend the config asks for."""
from __future__ import annotations

from typing import Any

from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import StepResult, VecEnv

__all__ = ["EnvSpec", "StepResult", "VecEnv", "env_spec", "make_vec_env"]


def env_spec(cfg: Any, render: bool = False) -> EnvSpec:
    """EnvSpec for `cfg.task` observed through `cfg.env.modality` (a script's typed config, robo_rl/config.py);
    `render` adds a video renderer. Training configs with `train.reward_shaping` shape its rewards with the
    critic's discount."""
    task, env, train = cfg.task, cfg.env, getattr(cfg, "train", None)
    if env.modality not in task.obs_keys:
        raise ValueError(f"env.modality={env.modality!r} is not defined for task {task.name!r}; "
                         f"choose one of {list(task.obs_keys)}")
    keys = task.obs_keys[env.modality]
    task_ids = task.task_ids
    if task_ids is None:  # every task of a LIBERO suite
        from robo_rl.envs.libero import load_suite

        task_ids = range(load_suite(task.env_name).n_tasks)
    return EnvSpec(
        suite=task.suite,
        env_name=task.env_name,
        low_dim_keys=tuple(keys.low_dim),
        rgb_keys=tuple(keys.rgb),
        image_size=env.image_size,
        horizon=task.horizon,
        task_ids=tuple(task_ids),
        render_size=env.render_size if render else 0,
        shaping_gamma=train.gamma if train is not None and train.reward_shaping else 0.0,
    )


def make_vec_env(cfg: Any, num_envs: int | None = None, render: bool = False, autoreset: bool = True):
    """The configured backend with `num_envs` (default `cfg.env.num_envs`) envs."""
    spec = env_spec(cfg, render)
    num_envs = num_envs or cfg.env.num_envs
    if cfg.env.backend == "warp":
        from robo_rl.envs.warp import WarpVecEnv

        return WarpVecEnv(spec, num_envs, device=cfg.device, autoreset=autoreset)
    if cfg.env.backend == "ray":
        from robo_rl.envs.ray_runners import RayVecEnv

        return RayVecEnv(spec, num_envs, cfg.env.runners, cfg.env.runner_cpus,
                         autoreset=autoreset, step_timeout=cfg.env.step_timeout)
    inline = min(cfg.env.inline_envs, num_envs) if cfg.env.backend == "subprocess" else 0
    return VecEnv(spec, num_envs, workers=cfg.env.backend, autoreset=autoreset, step_timeout=cfg.env.step_timeout,
                  inline_envs=inline)
