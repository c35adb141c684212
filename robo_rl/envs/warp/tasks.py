"""The robosuite tasks the Warp backend runs: resets, success tests and object observations, batched.

Resets replay robosuite's random draws in robosuite's order from a per-env
`np.random.RandomState(seed)`: the arm joint noise, then the task's placement sampler. The sampler is
robosuite's own object (it is plain Python over the object models), run on that RandomState, so the
placement distribution, rejection of overlapping placements and draw order are robosuite's by
construction; `reset(seed)` here puts a world in the state `RobosuiteEnv.reset(seed)` reaches on a
scene built under the same model seed.
"""
from __future__ import annotations

from contextlib import contextmanager

import mujoco
import numpy as np
import torch

from robo_rl.envs.warp.scene import RobotConstants, arm_noise


@contextmanager
def numpy_global_rng(rng: np.random.RandomState):
    """Run code that draws from numpy's global RNG (robosuite's samplers) on `rng`; the global RNG is untouched."""
    saved = np.random.get_state()
    np.random.set_state(rng.get_state())
    try:
        yield
    finally:
        rng.set_state(np.random.get_state())
        np.random.set_state(saved)


# -- quaternions (w, x, y, z), batched [..., 4] -------------------------------------------------------
def quat_xyzw(q: torch.Tensor) -> torch.Tensor:
    return q[..., [1, 2, 3, 0]]


def quat_conj(q: torch.Tensor) -> torch.Tensor:
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    aw, av, bw, bv = a[..., :1], a[..., 1:], b[..., :1], b[..., 1:]
    return torch.cat([aw * bw - (av * bv).sum(-1, keepdim=True),
                      aw * bv + bw * av + torch.linalg.cross(av, bv)], dim=-1)


def quat_rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """R(q)^T v for v [..., 3]."""
    qv = torch.cat([torch.zeros_like(v[..., :1]), v], dim=-1)
    return quat_mul(quat_mul(quat_conj(q), qv), q)[..., 1:]


class RobosuiteTask:
    """What every task shares: robosuite's reset (arm noise, then object placement)."""

    name: str

    def __init__(self, env, mjm: mujoco.MjModel):
        self.sampler = env.placement_initializer
        # qpos address of each free-jointed object (visual-only objects have no joint).
        self.object_qpos = {
            obj.name: int(mjm.jnt_qposadr[mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_JOINT, obj.joints[0])])
            for obj in env.model.mujoco_objects
            if obj.joints
        }

    def initial_qpos(self, robot: RobotConstants, qpos0: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """A reset's qpos [nq], with robosuite's `_reset_internal` draws (arm noise, then placements)."""
        qpos = qpos0.copy()
        arm = slice(robot.arm_qpos0, robot.arm_qpos0 + len(robot.init_qpos))
        qpos[arm] = robot.init_qpos + arm_noise(robot, rng)
        qpos[robot.gripper_qpos_adr] = robot.gripper_init_qpos
        with numpy_global_rng(rng):
            placements = self.sampler.sample()
        for pos, quat, obj in placements.values():
            if obj.name in self.object_qpos:
                adr = self.object_qpos[obj.name]
                qpos[adr : adr + 7] = np.concatenate([pos, quat])
        return qpos

    def success(self, xpos: torch.Tensor, eef_pos: torch.Tensor) -> torch.Tensor:
        """xpos [B, nbody, 3], eef_pos [B, 3] -> [B] bool."""
        raise NotImplementedError

    def object_obs(self, xpos: torch.Tensor, xquat: torch.Tensor, eef_pos: torch.Tensor,
                   eef_quat: torch.Tensor) -> torch.Tensor:
        """robosuite's `object-state` [B, d] from body poses (quaternions w, x, y, z) and the eef pose."""
        raise NotImplementedError


class Lift(RobosuiteTask):
    """Lift the cube: success when its centre is 4 cm above the table top."""

    name = "Lift"

    def __init__(self, env, mjm: mujoco.MjModel):
        super().__init__(env, mjm)
        self.cube = int(env.cube_body_id)
        self.lift_height = float(env.model.mujoco_arena.table_offset[2]) + 0.04

    def success(self, xpos: torch.Tensor, eef_pos: torch.Tensor) -> torch.Tensor:
        return xpos[:, self.cube, 2] > self.lift_height

    def object_obs(self, xpos, xquat, eef_pos, eef_quat) -> torch.Tensor:
        """[B, 10]: cube_pos, cube_quat (x, y, z, w), gripper_to_cube_pos."""
        cube_pos = xpos[:, self.cube]
        return torch.cat([cube_pos, quat_xyzw(xquat[:, self.cube]), eef_pos - cube_pos], dim=1)


class PickPlaceCan(RobosuiteTask):
    """robomimic's Can: PickPlace with only the can (single_object_mode 2), placed into its bin."""

    name = "PickPlaceCan"
    CLEARED_QPOS = np.array([10.0, 10.0, 10.0, 1.0, 0.0, 0.0, 0.0])  # robosuite's clear_objects

    def __init__(self, env, mjm: mujoco.MjModel):
        super().__init__(env, mjm)
        if env.single_object_mode != 2:
            raise NotImplementedError("the Warp backend replicates PickPlace with single_object_mode=2 only")
        self.obj_name = env.objects[env.object_id].name
        self.obj = int(env.obj_body_id[self.obj_name])
        self.cleared = [self.object_qpos[o.name] for o in env.objects if o.name != self.obj_name]
        # The can's target bin (robosuite's not_in_bin for bin_id = object_id).
        low = np.array(env.bin2_pos[:2], dtype=np.float64)
        if env.object_id in (0, 2):
            low[0] -= env.bin_size[0] / 2
        if env.object_id < 2:
            low[1] -= env.bin_size[1] / 2
        self.bin_low, self.bin_high = low, low + np.asarray(env.bin_size[:2]) / 2
        self.bin_z = float(env.bin2_pos[2])

    def initial_qpos(self, robot, qpos0, rng) -> np.ndarray:
        qpos = super().initial_qpos(robot, qpos0, rng)
        for adr in self.cleared:
            qpos[adr : adr + 7] = self.CLEARED_QPOS
        return qpos

    def success(self, xpos: torch.Tensor, eef_pos: torch.Tensor) -> torch.Tensor:
        """In the bin (x, y inside its quarter, z within 10 cm above its floor) and released (gripper > ~4 cm away)."""
        pos = xpos[:, self.obj]
        low, high = pos.new_tensor(self.bin_low), pos.new_tensor(self.bin_high)
        in_bin = ((pos[:, :2] > low) & (pos[:, :2] < high)).all(1)
        in_bin &= (pos[:, 2] > self.bin_z) & (pos[:, 2] < self.bin_z + 0.1)
        reach = 1.0 - torch.tanh(10.0 * torch.linalg.norm(eef_pos - pos, dim=1))
        return in_bin & (reach < 0.6)

    def object_obs(self, xpos, xquat, eef_pos, eef_quat) -> torch.Tensor:
        """[B, 14]: can pos, can quat (x, y, z, w), and the can's pose in the eef frame (pos, quat x, y, z, w)."""
        pos, quat = xpos[:, self.obj], xquat[:, self.obj]
        rel_pos = quat_rotate_inverse(eef_quat, pos - eef_pos)
        rel_quat = quat_mul(quat_conj(eef_quat), quat)
        rel_quat = rel_quat * torch.where(rel_quat[:, :1] < 0, -1.0, 1.0)  # robosuite's mat2quat: w >= 0
        return torch.cat([pos, quat_xyzw(quat), rel_pos, quat_xyzw(rel_quat)], dim=1)


TASKS = {task.name: task for task in (Lift, PickPlaceCan)}
