"""Scripted experts for robosuite tasks and LIBERO-Object, batched over envs, with noise for demo diversity.

Each expert maps a batch of observations (robomimic keys, or LIBERO's for LIBERO-Object; numpy or torch
[B, ...]) to OSC_POSE delta actions [B, 7] in [-1, 1]: position (±1 = ±5 cm per step), axis-angle rotation, gripper
(-1 open, +1 closed). Experts keep a per-env phase, so call `reset(env_ids)` when episodes start.
"""
from __future__ import annotations

import numpy as np

from robo_rl.core import ACTION_DIM
from robo_rl.envs.libero import OBJECT_FEATURES

# OSC_POSE maps action 1.0 to 5 cm of eef motion per control step; gains below are per metre.
_POS_GAIN = 1.0 / 0.05


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _yaw_from_quat_xyzw(quat: np.ndarray) -> np.ndarray:
    x, y, z, w = quat[..., 0], quat[..., 1], quat[..., 2], quat[..., 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _rotate(quat: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A body-frame vector v [3] in the world frame of each pose quat [B, 4] (xyzw): [B, 3]."""
    q, w = quat[:, :3], quat[:, 3:]
    t = 2 * np.cross(q, v)
    return v + w * t + np.cross(q, t)


def _quat_from_axis_angle(axis_angle: np.ndarray) -> np.ndarray:
    """Axis-angle [B, 3] (LIBERO's `ee_ori`, the end of `ee_states`) -> quaternion xyzw [B, 4]."""
    angle = np.linalg.norm(axis_angle, axis=1, keepdims=True)
    axis = axis_angle / np.maximum(angle, 1e-8)
    return np.concatenate([axis * np.sin(angle / 2), np.cos(angle / 2)], axis=1)


def _tilt(eef_quat: np.ndarray) -> np.ndarray:
    """Rotation about world x and y [B, 2] that points the fingers straight down again, from the eef pose
    quat [B, 4] (xyzw): OSC holds no orientation of its own, so the hand tilts as the arm moves and a held
    nut tilts with it."""
    approach = _rotate(eef_quat, np.array([0.0, 0.0, 1.0]))  # the fingers' direction [B, 3]
    # approach x (0, 0, -1): the axis that turns the fingers down, its length the sine of their tilt
    return np.stack([-approach[:, 1], approach[:, 0]], axis=1)


def _wrap(angle: np.ndarray, period: float) -> np.ndarray:
    """Angle into [-period/2, period/2): a cube looks the same every 90 degrees."""
    return (angle + period / 2) % period - period / 2


class PickPlaceExpert:
    """Top-down grasp of the task object, then lift it (Lift) or carry it over its target and release (Can, Square).

    The object's pose is the first 7 entries of robomimic's `object` key (position, quat xyzw) in these
    tasks. Phases advance per env when the end effector reaches its waypoint.
    """

    obs_keys = ("object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")  # what `act` reads

    HOVER, DESCEND, GRASP, LIFT, CARRY, LOWER, RELEASE, RETREAT = range(8)
    grasp_offset = np.zeros(3)              # where the fingers close, in the object's frame
    grasp_symmetry = np.pi / 2              # the fingers fit the object at yaws this far apart (a cube: 90 degrees)
    carry_height = 0.2                      # above the grasp height while lifting / carrying
    place_target: np.ndarray | None = None  # where the object goes ([3], or [B, 3] one per env); None: lifting is the task
    place_yaws: np.ndarray | None = None    # yaws [K] the object may have over its target (the nearest); None: any
    place_tolerance = 0.02                  # the object's xy distance from its target at which lowering starts
    release_height = 0.0                    # above place_target when the object is let go
    hold_upright = False                    # undo the hand's tilt (Can reaches its bin's far corner only tilted)
    hover_heights = (0.06, 0.10)            # the range each episode draws its height above the grasp point from

    def __init__(self, num_envs: int, noise: float = 0.0, seed: int = 0):
        self.num_envs, self.noise = num_envs, noise
        self.rng = np.random.default_rng(seed)
        self.phase = np.zeros(num_envs, dtype=np.int64)
        self.timer = np.zeros(num_envs, dtype=np.int64)
        self.hover_height = np.full(num_envs, 0.08)
        self.grasp_pos = np.zeros((num_envs, 3))
        self.last_eef = np.full((num_envs, 3), np.nan)  # eef position [B, 3] at the previous step

    def reset(self, env_ids=None) -> None:
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        self.phase[ids] = self.HOVER
        self.timer[ids] = 0
        self.last_eef[ids] = np.nan
        # Diversity: each demo hovers at its own height before descending.
        low, high = self.hover_heights
        self.hover_height[ids] = low + (high - low) * self.rng.random(len(ids))

    def _observe(self, obs: dict) -> tuple[np.ndarray, ...]:
        """(object position [B, 3], object quat xyzw [B, 4], eef position [B, 3], eef quat xyzw [B, 4],
        finger joints [B, 2]) from robomimic's observation keys."""
        obj = _np(obs["object"])
        return (obj[:, :3], obj[:, 3:7], _np(obs["robot0_eef_pos"]), _np(obs["robot0_eef_quat"]),
                _np(obs["robot0_gripper_qpos"]))

    def _grasp_point(self, obj_pos: np.ndarray, obj_quat: np.ndarray) -> np.ndarray:
        """Where the fingers close [B, 3], from the object's position [B, 3] and quat [B, 4]."""
        return obj_pos + _rotate(obj_quat, self.grasp_offset)

    def _waypoints(self, grasp_point: np.ndarray, obj_pos: np.ndarray, eef: np.ndarray) -> np.ndarray:
        """Target eef position [B, 3] of each env's current phase, from the grasp point, the object's centre and
        the eef position (each [B, 3]). The hand holds a cube or a can at its centre: it goes to place_target."""
        target = grasp_point.copy()
        target[:, 2] += np.where(self.phase == self.HOVER, self.hover_height, 0.0)
        carrying = self.phase >= self.LIFT
        target[carrying] = self.grasp_pos[carrying] + np.array([0.0, 0.0, self.carry_height])
        if self.place_target is not None:
            place = np.broadcast_to(self.place_target, target.shape)  # one target for all envs, or one each
            over_target = self.phase >= self.CARRY
            target[over_target, :2] = place[over_target, :2]
            lowering, retreating = self.phase == self.LOWER, self.phase == self.RETREAT
            target[lowering, 2] = place[lowering, 2] + self.release_height
            target[retreating, 2] = place[retreating, 2] + 0.3
        return target

    def _yaw_error(self, obj_quat: np.ndarray, eef_quat: np.ndarray) -> np.ndarray:
        """Rotation about world z [B] still to make: fingers squared with the object before the grasp,
        the held object turned to the nearest of `place_yaws` while it is carried and lowered."""
        obj_yaw = _yaw_from_quat_xyzw(obj_quat)
        to_grasp = _wrap(obj_yaw - _yaw_from_quat_xyzw(eef_quat), self.grasp_symmetry)
        error = np.where(self.phase <= self.DESCEND, to_grasp, 0.0)
        if self.place_yaws is not None:
            to_place = _wrap(self.place_yaws[None, :] - obj_yaw[:, None], 2 * np.pi)  # [B, K]
            nearest = to_place[np.arange(len(obj_yaw)), np.abs(to_place).argmin(axis=1)]
            placing = (self.phase == self.CARRY) | (self.phase == self.LOWER)
            error = np.where(placing, nearest, error)
        return error

    def act(self, obs: dict) -> np.ndarray:
        """OSC_POSE actions [B, 7] for a batch of observations; advances each env's phase."""
        obj_pos, obj_quat, eef, eef_quat, finger_qpos = self._observe(obs)
        grasp_point = self._grasp_point(obj_pos, obj_quat)
        delta = self._waypoints(grasp_point, obj_pos, eef) - eef
        yaw_error = self._yaw_error(obj_quat, eef_quat)

        action = np.zeros((self.num_envs, ACTION_DIM))
        action[:, :3] = np.clip(delta * _POS_GAIN, -1, 1)
        action[(self.phase == self.GRASP) | (self.phase == self.RELEASE), :3] = 0.0  # hold still
        if self.hold_upright:
            action[:, 3:5] = np.clip(2.0 * _tilt(eef_quat), -1, 1)
        action[:, 5] = np.clip(2.0 * yaw_error, -1, 1)
        closed = (self.phase >= self.GRASP) & (self.phase <= self.LOWER)
        action[:, 6] = np.where(closed, 1.0, -1.0)

        self._next_phase(delta, yaw_error, eef, finger_qpos)
        if self.noise > 0:
            action[:, :6] += self.noise * self.rng.standard_normal((self.num_envs, 6))
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _next_phase(self, delta: np.ndarray, yaw_error: np.ndarray, eef: np.ndarray,
                    finger_qpos: np.ndarray) -> None:
        """Advance the envs whose waypoint is reached, from the eef's distance to it [B, 3], the yaw still to
        turn [B], the eef position [B, 3] and the finger joints [B, 2] (+w/2, -w/2 for an opening w)."""
        self.timer += 1
        # The arm lags its commands: descending while it still swings over the object lands the fingers beside it.
        settled = np.linalg.norm(eef - self.last_eef, axis=1) < 0.003
        self.last_eef = eef.copy()  # obs arrays may be buffers the env overwrites
        reached = np.linalg.norm(delta, axis=1) < 0.03  # loose: carrying a load leaves a steady-state error
        over_target = (np.linalg.norm(delta[:, :2], axis=1) < self.place_tolerance) & (np.abs(yaw_error) < 0.05)
        advance = (
            ((self.phase == self.HOVER) & (np.linalg.norm(delta[:, :2], axis=1) < 0.01) & (np.abs(delta[:, 2]) < 0.02)
             & settled)
            | ((self.phase == self.DESCEND) & (np.abs(delta[:, 2]) < 0.01))
            | ((self.phase == self.GRASP) & (self.timer >= 8))
            | ((self.phase == self.LIFT) & reached & (self.place_target is not None))
            | ((self.phase == self.CARRY) & over_target)
            | ((self.phase == self.LOWER) & reached)
            | ((self.phase == self.RELEASE) & (self.timer >= 6))
        )
        self.grasp_pos = np.where((advance & (self.phase == self.GRASP))[:, None], eef, self.grasp_pos)
        self.phase = np.where(advance, self.phase + 1, self.phase)
        # Fingers that closed on nothing (a missed grasp, a dropped object) start over from above the object.
        holding = (self.phase >= self.LIFT) & (self.phase <= self.LOWER)
        empty = holding & (finger_qpos[:, 0] - finger_qpos[:, 1] < 0.01)
        self.phase = np.where(empty, self.HOVER, self.phase)
        self.timer = np.where(advance | empty, 0, self.timer)


class LiftExpert(PickPlaceExpert):
    """Lift: grasp the cube and raise it (success at 4 cm; the episode ends there)."""


class CanExpert(PickPlaceExpert):
    """PickPlaceCan: grasp the can in bin 1, carry it over its quadrant of bin 2, release, retreat."""

    place_target = np.array([0.1975, 0.4025, 0.8])  # robosuite's target_bin_placements for the can
    carry_height = 0.25
    release_height = 0.18  # drop from just above the rim


class SquareExpert(PickPlaceExpert):
    """NutAssemblySquare: grasp the square nut by its handle, carry it over the square peg, turn it square
    with the peg, lower it around the peg and let go (success: nut low on the peg, hand off the nut)."""

    # The handle spans 2.9-7.9 cm along the nut's x (robosuite's square-nut.xml); gripped 6.2 cm out, the
    # fingers stay clear of the nut's wall, which ends at 4.4 cm.
    grasp_offset = np.array([0.062, 0.0, 0.0])
    grasp_symmetry = np.pi                      # fingers across the handle, either way round
    place_target = np.array([0.23, 0.1, 0.85])  # robosuite's peg1 (pegs_arena.xml): the nut is let go around it
    # The hole fits the square peg every 90 degrees, but not with the handle pointing away from the robot
    # (yaw 0): the hand would have to reach 6 cm past the peg, beyond the arm's reach.
    place_yaws = np.array([np.pi / 2, np.pi, -np.pi / 2])
    place_tolerance = 0.004                     # the hole is 4.6 cm wide, the peg 3.2 cm
    hold_upright = True                         # a tilted nut jams on the peg

    def _waypoints(self, grasp_point: np.ndarray, obj_pos: np.ndarray, eef: np.ndarray) -> np.ndarray:
        """As PickPlaceExpert's, but over the peg the nut's centre, not the hand, is steered to place_target:
        the nut hangs 6 cm from the hand that holds its handle, turning with the hand, and the hole leaves
        7 mm to spare. After the release the same offset keeps the hand where it let go."""
        target = super()._waypoints(grasp_point, obj_pos, eef)
        over_peg = self.phase >= self.CARRY
        target[over_peg, :2] += (eef - obj_pos)[over_peg, :2]
        lowering = self.phase == self.LOWER
        target[lowering, 2] += (eef - obj_pos)[lowering, 2]
        return target


class LiberoObjectExpert(PickPlaceExpert):
    """LIBERO-Object (all ten tasks: "pick up the X and place it in the basket"): grasp the item from above,
    carry it over the basket and let it go low inside.

    Reads LIBERO's keys: `object` (the poses of env=state; the item's first, the basket's second), `ee_states`
    (position, axis-angle) and `gripper_states`. Measured over the suite's scenes: the items stand upright on
    the floor (z = 0), axis-aligned, their origin at their centre, 1.7-14.6 cm tall (butter to ketchup), and
    the narrow side of each is across its own local x axis in the world's xy plane; the basket is 14 cm deep.
    """

    obs_keys = ("object", "ee_states", "gripper_states")
    grasp_symmetry = np.pi        # the fingers close across the item's narrow side, either way round
    hover_heights = (0.16, 0.20)  # above the neighbours (up to 14.6 cm) before going straight down
    carry_height = 0.2            # the item's bottom 20 cm up: over the basket's 14 cm rim
    hold_upright = True           # a tilted hand swings a tall bottle into the basket's rim
    top_grip = 0.035              # tall items are held this far below their top, short ones at their centre
    release_clearance = 0.05      # the item's bottom above the basket's floor when it is let go

    def _observe(self, obs: dict) -> tuple[np.ndarray, ...]:
        """As PickPlaceExpert's, from LIBERO's keys; also aims the release at this step's basket: the hand
        held as high over the basket's bottom as it held the item over the floor, plus release_clearance."""
        objects = _np(obs["object"])
        basket = objects[:, OBJECT_FEATURES:OBJECT_FEATURES + 3]
        self.place_target = basket.copy()
        self.place_target[:, 2] += self.grasp_pos[:, 2] + self.release_clearance
        eef = _np(obs["ee_states"])
        return objects[:, :3], objects[:, 3:7], eef[:, :3], _quat_from_axis_angle(eef[:, 3:6]), _np(obs["gripper_states"])

    def _grasp_point(self, obj_pos: np.ndarray, obj_quat: np.ndarray) -> np.ndarray:
        """The item's centre, raised for tall items to top_grip below their top (an item on the floor is twice
        as tall as its centre is high)."""
        grasp = obj_pos.copy()
        grasp[:, 2] = np.maximum(obj_pos[:, 2], 2 * obj_pos[:, 2] - self.top_grip)
        return grasp


EXPERTS = {"lift": LiftExpert, "can": CanExpert, "square": SquareExpert, "libero_object": LiberoObjectExpert}


def make_expert(task_cfg, num_envs: int, noise: float = 0.0, seed: int = 0):
    """The scripted expert of a task config (`task.expert`), or a clear error when there is none."""
    name = task_cfg.get("expert")
    if name not in EXPERTS:
        raise ValueError(f"task {task_cfg.name!r} has no scripted expert (available: {sorted(EXPERTS)}); "
                         f"pass a dataset with dataset=PATH")
    return EXPERTS[name](num_envs, noise=noise, seed=seed)
