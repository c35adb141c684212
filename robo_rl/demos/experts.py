"""Scripted experts for robosuite tasks, batched over envs, with noise for demo diversity.

Each expert maps a batch of observations (robomimic keys, numpy or torch [B, ...]) to OSC_POSE
delta actions [B, 7] in [-1, 1]: position (±1 = ±5 cm per step), axis-angle rotation, gripper
(-1 open, +1 closed). Experts keep a per-env phase, so call `reset(env_ids)` when episodes start.
"""
from __future__ import annotations

import numpy as np

from robo_rl.core import ACTION_DIM

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


class PickPlaceExpert:
    """Top-down grasp of the task object, then lift it (Lift) or carry it to a bin and release (Can).

    The object's pose is the first 7 entries of robomimic's `object` key (position, quat xyzw) for
    both tasks. Phases advance per env when the end effector reaches its waypoint.
    """

    HOVER, DESCEND, GRASP, LIFT, CARRY, LOWER, RELEASE, RETREAT = range(8)
    place_target: np.ndarray | None = None  # bin position the object goes to; None: lifting is the task
    carry_height = 0.2                      # above the grasp height while lifting / carrying

    def __init__(self, num_envs: int, noise: float = 0.0, seed: int = 0):
        self.num_envs, self.noise = num_envs, noise
        self.rng = np.random.default_rng(seed)
        self.phase = np.zeros(num_envs, dtype=np.int64)
        self.timer = np.zeros(num_envs, dtype=np.int64)
        self.hover_height = np.full(num_envs, 0.08)
        self.grasp_pos = np.zeros((num_envs, 3))

    def reset(self, env_ids=None) -> None:
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        self.phase[ids] = self.HOVER
        self.timer[ids] = 0
        # Diversity: each demo hovers at its own height before descending.
        self.hover_height[ids] = 0.06 + 0.04 * self.rng.random(len(ids))

    def _waypoints(self, obj: np.ndarray) -> np.ndarray:
        """Target eef position [B, 3] of each env's current phase."""
        target = obj.copy()
        target[:, 2] += np.where(self.phase == self.HOVER, self.hover_height, 0.0)
        carrying = self.phase >= self.LIFT
        target[carrying] = self.grasp_pos[carrying] + np.array([0.0, 0.0, self.carry_height])
        if self.place_target is not None:
            over_bin = self.phase >= self.CARRY
            target[over_bin, :2] = self.place_target[:2]
            target[self.phase == self.LOWER, 2] = self.place_target[2] + 0.18  # drop from just above the rim
            target[self.phase == self.RETREAT, 2] = self.place_target[2] + 0.3
        return target

    def act(self, obs: dict) -> np.ndarray:
        obj = _np(obs["object"])[:, :3]
        obj_yaw = _yaw_from_quat_xyzw(_np(obs["object"])[:, 3:7])
        eef = _np(obs["robot0_eef_pos"])
        eef_yaw = _yaw_from_quat_xyzw(_np(obs["robot0_eef_quat"]))
        target = self._waypoints(obj)
        delta = target - eef

        action = np.zeros((self.num_envs, ACTION_DIM))
        action[:, :3] = np.clip(delta * _POS_GAIN, -1, 1)
        action[(self.phase == self.GRASP) | (self.phase == self.RELEASE), :3] = 0.0  # hold still
        # Square the fingers with a face of the object (a cube looks the same every 90 degrees).
        yaw_error = _wrap(obj_yaw - eef_yaw, np.pi / 2)
        action[:, 5] = np.where(self.phase <= self.DESCEND, np.clip(2.0 * yaw_error, -1, 1), 0.0)
        closed = (self.phase >= self.GRASP) & (self.phase <= self.LOWER)
        action[:, 6] = np.where(closed, 1.0, -1.0)

        self.timer += 1
        reached = np.linalg.norm(delta, axis=1) < 0.03  # loose: carrying a load leaves a steady-state error
        advance = (
            ((self.phase == self.HOVER) & (np.linalg.norm(delta[:, :2], axis=1) < 0.01) & (np.abs(delta[:, 2]) < 0.02))
            | ((self.phase == self.DESCEND) & (np.abs(delta[:, 2]) < 0.01))
            | ((self.phase == self.GRASP) & (self.timer >= 8))
            | ((self.phase == self.LIFT) & reached & (self.place_target is not None))
            | ((self.phase == self.CARRY) & (np.linalg.norm(delta[:, :2], axis=1) < 0.02))
            | ((self.phase == self.LOWER) & reached)
            | ((self.phase == self.RELEASE) & (self.timer >= 6))
        )
        self.grasp_pos = np.where((advance & (self.phase == self.GRASP))[:, None], eef, self.grasp_pos)
        self.phase = np.where(advance, self.phase + 1, self.phase)
        self.timer = np.where(advance, 0, self.timer)

        if self.noise > 0:
            action[:, :6] += self.noise * self.rng.standard_normal((self.num_envs, 6))
        return np.clip(action, -1.0, 1.0).astype(np.float32)


class LiftExpert(PickPlaceExpert):
    """Lift: grasp the cube and raise it (success at 4 cm; the episode ends there)."""


class CanExpert(PickPlaceExpert):
    """PickPlaceCan: grasp the can in bin 1, carry it over its quadrant of bin 2, release, retreat."""

    place_target = np.array([0.1975, 0.4025, 0.8])  # robosuite's target_bin_placements for the can
    carry_height = 0.25


EXPERTS = {"lift": LiftExpert, "can": CanExpert}


def make_expert(task_cfg, num_envs: int, noise: float = 0.0, seed: int = 0):
    """The scripted expert of a task config (`task.expert`), or a clear error when there is none."""
    name = task_cfg.get("expert")
    if name not in EXPERTS:
        raise ValueError(f"task {task_cfg.name!r} has no scripted expert (available: {sorted(EXPERTS)}); "
                         f"pass a dataset with dataset=PATH")
    return EXPERTS[name](num_envs, noise=noise, seed=seed)
