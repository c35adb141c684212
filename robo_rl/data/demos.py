"""Scripted experts for robosuite tasks, batched over envs, with noise for demo diversity.

Each expert maps a batch of observations (robomimic keys, numpy or torch [B, ...]) to OSC_POSE
delta actions [B, 7] in [-1, 1]: position (±1 = ±5 cm per step), axis-angle rotation, gripper
(-1 open, +1 closed). Experts keep a per-env phase, so call `reset(env_ids)` when episodes start.
"""
from __future__ import annotations

import numpy as np

# OSC_POSE maps action 1.0 to 5 cm of eef motion per control step; gains below are per metre.
_POS_GAIN = 1.0 / 0.05


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _yaw_from_quat_xyzw(quat: np.ndarray) -> np.ndarray:
    x, y, z, w = quat[..., 0], quat[..., 1], quat[..., 2], quat[..., 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _wrap(angle: np.ndarray, period: float) -> np.ndarray:
    """Angle into [-period/2, period/2): a cube looks the same every 90 degrees."""
    return (angle + period / 2) % period - period / 2


class LiftExpert:
    """Top-down grasp of the Lift cube: hover, descend, close, lift.

    Phases per env: 0 hover above the cube, 1 descend, 2 close the gripper, 3 lift.
    """

    HOVER, DESCEND, GRASP, LIFT = range(4)
    required_keys = ("object", "robot0_eef_pos", "robot0_eef_quat")

    def __init__(self, num_envs: int, noise: float = 0.0, seed: int = 0):
        self.num_envs, self.noise = num_envs, noise
        self.rng = np.random.default_rng(seed)
        self.phase = np.zeros(num_envs, dtype=np.int64)
        self.timer = np.zeros(num_envs, dtype=np.int64)
        self.hover_height = np.full(num_envs, 0.08)

    def reset(self, env_ids=None) -> None:
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        self.phase[ids] = self.HOVER
        self.timer[ids] = 0
        # Diversity: each demo hovers at its own height before descending.
        self.hover_height[ids] = 0.06 + 0.04 * self.rng.random(len(ids))

    def act(self, obs: dict) -> np.ndarray:
        cube = _np(obs["object"])[:, :3]
        cube_yaw = _yaw_from_quat_xyzw(_np(obs["object"])[:, 3:7])
        eef = _np(obs["robot0_eef_pos"])
        eef_yaw = _yaw_from_quat_xyzw(_np(obs["robot0_eef_quat"]))
        target = cube.copy()
        target[:, 2] += np.where(self.phase == self.HOVER, self.hover_height, 0.0)
        target[:, 2] += np.where(self.phase == self.LIFT, 0.2, 0.0)
        delta = target - eef

        action = np.zeros((self.num_envs, 7))
        action[:, :3] = np.clip(delta * _POS_GAIN, -1, 1)
        # Square the fingers with a cube face (any of the four: the cube is symmetric every 90 degrees).
        yaw_error = _wrap(cube_yaw - eef_yaw, np.pi / 2)
        action[:, 5] = np.where(self.phase <= self.DESCEND, np.clip(2.0 * yaw_error, -1, 1), 0.0)
        action[:, 6] = np.where(self.phase >= self.GRASP, 1.0, -1.0)
        action[self.phase == self.GRASP, :3] = 0.0

        xy_err = np.linalg.norm(delta[:, :2], axis=1)
        self.timer += 1
        advance = (
            ((self.phase == self.HOVER) & (xy_err < 0.01) & (np.abs(delta[:, 2]) < 0.02))
            | ((self.phase == self.DESCEND) & (np.abs(delta[:, 2]) < 0.01))
            | ((self.phase == self.GRASP) & (self.timer >= 8))
        )
        self.phase = np.where(advance, self.phase + 1, self.phase)
        self.timer = np.where(advance, 0, self.timer)

        if self.noise > 0:
            action[:, :6] += self.noise * self.rng.standard_normal((self.num_envs, 6))
        return np.clip(action, -1.0, 1.0).astype(np.float32)


EXPERTS = {"lift": LiftExpert}


def make_expert(task_cfg, num_envs: int, noise: float = 0.0, seed: int = 0):
    """The scripted expert of a task config (`task.expert`), or a clear error when there is none."""
    name = task_cfg.get("expert")
    if name not in EXPERTS:
        raise ValueError(f"task {task_cfg.name!r} has no scripted expert (available: {sorted(EXPERTS)}); "
                         f"pass a dataset with dataset=PATH")
    return EXPERTS[name](num_envs, noise=noise, seed=seed)
