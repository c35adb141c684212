"""The robosuite scene, compiled once on the CPU, and the robot constants the batched env needs.

robosuite builds the MJCF (arena, Panda + gripper, objects) and its controller; we read every number
we replicate (gains, limits, initial joints, noise, gripper speed) from those live objects rather than
copying them, so the batched env follows whatever robosuite version is installed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np


# robosuite.utils.control_utils.nullspace_torques(joint_kp=10), critically damped.
NULLSPACE_KP = 10.0


def configure_warp() -> None:
    """Persistent kernel cache (cold compile of MuJoCo Warp's kernels takes minutes on CPU) and quiet logs.

    Takes effect only if Warp has not been initialised yet in this process. Override the directory
    with `ROBO_RL_WARP_CACHE`.
    """
    import warp as wp

    cache = Path(os.environ.get("ROBO_RL_WARP_CACHE", Path.home() / ".cache" / "robo_rl" / "warp"))
    cache.mkdir(parents=True, exist_ok=True)
    wp.config.kernel_cache_dir = str(cache)
    wp.config.quiet = True
    wp.init()


@dataclass(frozen=True)
class RobotConstants:
    """Panda arm + gripper as robosuite controls and resets it."""

    kp: np.ndarray  # [6]
    kd: np.ndarray  # [6]
    action_scale: np.ndarray  # [6] metres / radians of goal offset per unit action
    torque_min: np.ndarray  # [7]
    torque_max: np.ndarray  # [7]
    eef_site: int  # grip site: controller reference point and `robot0_eef_pos`
    eef_body: int  # hand body: `robot0_eef_quat`
    arm_jnt0: int
    arm_dof0: int
    arm_qpos0: int
    arm_act0: int
    init_qpos: np.ndarray  # [7] arm joints before noise
    init_noise: dict  # robosuite's initialization_noise: {"type": "gaussian" | "uniform", "magnitude": float}
    gripper_qpos_adr: np.ndarray  # [2]
    gripper_init_qpos: np.ndarray  # [2]
    gripper_act: np.ndarray  # [2] actuator ids
    gripper_ctrl_bias: np.ndarray  # [2] centre of the actuators' ctrlrange
    gripper_ctrl_weight: np.ndarray  # [2] half-width of the actuators' ctrlrange
    gripper_speed: float
    substeps: int  # physics steps per control step (robosuite: control_freq 20, timestep 0.002 -> 25)


def _contiguous_start(indices, what: str) -> int:
    indices = [int(i) for i in indices]
    if indices != list(range(indices[0], indices[0] + len(indices))):
        raise NotImplementedError(f"the arm's {what} indices {indices} are not contiguous")
    return indices[0]


def robot_constants(env, mjm: mujoco.MjModel) -> RobotConstants:
    """Read robot/controller constants from a robosuite env; refuse configurations we do not replicate."""
    robot = env.robots[0]
    ctrl = robot.controller
    unsupported = {
        "controller": type(ctrl).__name__ != "OperationalSpaceController" or not ctrl.use_ori,
        "control_delta=False": not ctrl.use_delta,
        "uncouple_pos_ori=False": not ctrl.uncoupling,
        "impedance_mode": ctrl.impedance_mode != "fixed",
        "interpolation": ctrl.interpolator_pos is not None or ctrl.interpolator_ori is not None,
        "position/orientation limits": ctrl.position_limits is not None or ctrl.orientation_limits is not None,
        "multiple robots": len(env.robots) != 1,
        "gripper": type(robot.gripper).__name__ != "PandaGripper",
    }
    bad = [name for name, is_bad in unsupported.items() if is_bad]
    if bad:
        raise NotImplementedError(f"the Warp backend replicates OSC_POSE with a Panda gripper only; got {bad}")
    in_mid = (ctrl.input_max + ctrl.input_min) / 2
    out_mid = (ctrl.output_max + ctrl.output_min) / 2
    if np.any(in_mid != 0) or np.any(out_mid != 0):
        raise NotImplementedError("asymmetric controller input/output ranges are not replicated")
    action_scale = np.abs(ctrl.output_max - ctrl.output_min) / np.abs(ctrl.input_max - ctrl.input_min)

    ctrlrange = mjm.actuator_ctrlrange[robot._ref_joint_gripper_actuator_indexes]
    low, high = robot.torque_limits
    return RobotConstants(
        kp=np.asarray(ctrl.kp, np.float32),
        kd=np.asarray(ctrl.kd, np.float32),
        action_scale=action_scale.astype(np.float32),
        torque_min=np.asarray(low, np.float32),
        torque_max=np.asarray(high, np.float32),
        eef_site=int(robot.eef_site_id),
        eef_body=mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_BODY, robot.robot_model.eef_name),
        arm_jnt0=_contiguous_start(robot._ref_joint_indexes, "joint"),
        arm_dof0=_contiguous_start(robot._ref_joint_vel_indexes, "dof"),
        arm_qpos0=_contiguous_start(robot._ref_joint_pos_indexes, "qpos"),
        arm_act0=_contiguous_start(robot._ref_joint_actuator_indexes, "actuator"),
        init_qpos=np.asarray(robot.init_qpos, np.float64),
        init_noise=dict(robot.initialization_noise),
        gripper_qpos_adr=np.asarray(robot._ref_gripper_joint_pos_indexes, np.int64),
        gripper_init_qpos=np.asarray(robot.gripper.init_qpos, np.float64),
        gripper_act=np.asarray(robot._ref_joint_gripper_actuator_indexes, np.int32),
        gripper_ctrl_bias=(0.5 * (ctrlrange[:, 1] + ctrlrange[:, 0])).astype(np.float32),
        gripper_ctrl_weight=(0.5 * (ctrlrange[:, 1] - ctrlrange[:, 0])).astype(np.float32),
        gripper_speed=float(robot.gripper.speed),
        substeps=int(round(env.control_timestep / env.model_timestep)),
    )


def arm_noise(constants: RobotConstants, rng: np.random.RandomState) -> np.ndarray:
    """robosuite `Robot.reset`'s joint noise [7], drawn first in a reset."""
    kind, magnitude = constants.init_noise["type"], constants.init_noise["magnitude"]
    n = len(constants.init_qpos)
    if kind == "gaussian":
        return rng.randn(n) * magnitude
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, n) * magnitude
    raise ValueError(f"unknown initialization_noise type {kind!r}")
