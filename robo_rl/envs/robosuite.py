"""A single robosuite env (OSC_POSE, Panda) with robomimic's observation keys.

robomimic renames `object-state` to `object` and flips camera images upright; we do the same so
that env observations line up with Robomimic HDF5 datasets key for key.
"""
from __future__ import annotations

import numpy as np

from robo_rl.core import TASK_KEY
from robo_rl.envs.base import SimEnv
from robo_rl.envs.spec import EnvSpec, camera_of, to_channels_first
from robo_rl.utils.rendering import configure_mujoco

# robomimic's name for robosuite's observation (when they differ).
_ROBOSUITE_KEY = {"object": "object-state"}

ROBOSUITE_TASKS = ("Lift", "PickPlaceCan", "NutAssemblySquare", "ToolHang")


def robomimic_obs(raw: dict, low_dim_keys, rgb_keys=()) -> dict[str, np.ndarray]:
    """robosuite observation dict -> robomimic keys: low-dim float32, images upright [C, H, W] uint8."""
    obs = {k: np.asarray(raw[_ROBOSUITE_KEY.get(k, k)], dtype=np.float32) for k in low_dim_keys}
    for key in rgb_keys:
        obs[key] = to_channels_first(raw[f"{camera_of(key)}_image"])
    return obs


def robosuite_env_kwargs(spec: EnvSpec) -> dict:
    """The kwargs robomimic stores under `env_args.env_kwargs` for this spec."""
    configure_mujoco()
    from robosuite.controllers import load_controller_config

    cameras = list(spec.cameras)
    kwargs = dict(
        robots=[spec.robots],
        controller_configs=load_controller_config(default_controller="OSC_POSE"),
        has_renderer=False,
        has_offscreen_renderer=bool(cameras) or spec.render_size > 0,
        ignore_done=True,
        use_object_obs=True,
        use_camera_obs=bool(cameras),
        camera_names=cameras or ["agentview"],
        camera_heights=spec.image_size,
        camera_widths=spec.image_size,
        camera_depths=False,
        control_freq=20,
        reward_shaping=False,
        hard_reset=False,  # reloading the MJCF on every reset costs ~0.5 s and changes nothing here
    )
    kwargs.update(spec.env_kwargs)
    return kwargs


# robosuite draws parts of the scene (the Lift cube's size) from numpy's global RNG once, while it builds
# the MJCF: building under a fixed seed gives every env, in every process and run, the same scene, so a
# reset seed alone fixes an episode's initial state (paired evaluation, reproducible seeds, the Warp env).
MODEL_SEED = 0


def make_robosuite_env(spec: EnvSpec, model_seed: int = MODEL_SEED):
    """The robosuite env for `spec`, built under `model_seed` (the global RNG is restored after)."""
    configure_mujoco()
    import robosuite

    state = np.random.get_state()
    np.random.seed(model_seed)
    try:
        return robosuite.make(spec.env_name, **robosuite_env_kwargs(spec))
    finally:
        np.random.set_state(state)


class RobosuiteEnv(SimEnv):
    """Gym-like single env. `step` returns (obs, reward, terminated, truncated, success).

    With `spec.shaping_gamma` = γ > 0 the reward is shaped by potentials (Ng, Harada & Russell 1999):
    r + γ·Φ(s') − Φ(s), Φ = `progress()`, Φ = 0 after the success that ends an episode. Such shaping leaves
    the optimal policy of the sparse task unchanged (the shaping terms of an episode telescope to −Φ(s_0)),
    yet from the first step it pays for moving toward the object, which the sparse success alone never
    does until an episode happens to succeed. robosuite's own shaped reward cannot be used as is: it pays
    every step spent near the object, so with episodes that end on success, hovering there outearns success.
    """

    def __init__(self, spec: EnvSpec, env_index: int = 0):
        if spec.env_name not in ROBOSUITE_TASKS:
            raise ValueError(f"unknown robosuite task {spec.env_name!r}; choose one of {ROBOSUITE_TASKS}")
        self.spec = spec
        self.task_id = 0
        self.instruction = spec.env_name
        self.env_kwargs = robosuite_env_kwargs(spec)
        self.env = make_robosuite_env(spec)
        self._t = 0
        self._potential = 0.0  # Φ of the current state, with shaping

    # -- observations -------------------------------------------------------------------------
    def _obs(self, raw: dict) -> dict[str, np.ndarray]:
        obs = robomimic_obs(raw, self.spec.low_dim_keys, self.spec.rgb_keys)
        obs[TASK_KEY] = np.int64(self.task_id)
        return obs

    # -- control ------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None) -> dict[str, np.ndarray]:
        if seed is not None:
            np.random.seed(seed)  # robosuite 1.4 samples object placements from the global RNG
        raw = self.env.reset()
        self._t = 0
        options = options or {}
        if options.get("state") is not None:  # a dataset's `states` entry
            raw = self.set_sim_state(options["state"])
        if options.get("demo_state") is not None:  # a demo's state mid-way, with the gripper command held there
            raw = self.start_mid_demo(options["demo_state"], options["gripper_command"])
        if options.get("snapshot") is not None:  # a mid-episode `snapshot()`: continues that episode
            raw = self.restore(options["snapshot"])
        if self.spec.shaping_gamma:
            self._potential = self.progress()
        return self._obs(raw)

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, success = super().step(action)
        if self.spec.shaping_gamma:
            potential = 0.0 if terminated else self.progress()
            reward += self.spec.shaping_gamma * potential - self._potential
            self._potential = potential
        return obs, reward, terminated, truncated, success

    def progress_at(self, states: np.ndarray) -> np.ndarray:
        """Φ of each flattened MuJoCo state [T, D] -> [T] (this env is left at the last one)."""
        potentials = np.empty(len(states))
        for t, state in enumerate(states):
            self.set_sim_state(state)
            potentials[t] = self.progress()
        return potentials

    def progress(self) -> float:
        """Φ(s): what robosuite's shaped reward pays at this state beyond its sparse reward (Lift: reaching
        1 − tanh(10·distance) plus 0.25 while grasping; Can and Square: their staged reach, grasp, lift and
        hover rewards), on the normalised scale where success pays 1."""
        env = self.env
        sparse = env.reward()
        env.reward_shaping = True
        try:
            return float(env.reward()) - float(sparse)
        finally:
            env.reward_shaping = False

    def _success(self) -> bool:
        return bool(self.env._check_success())
