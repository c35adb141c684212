"""The phase machine every scripted pick-and-place shares: hover over the object, descend, close the fingers,
lift, carry over the target, lower, let go, retreat; and the pose arithmetic the experts use.

Actions are OSC_POSE deltas [B, 7] in [-1, 1]: position (±1 = ±5 cm per step), axis-angle rotation, gripper
(-1 open, +1 closed). Quaternions are xyzw (robosuite's order). The fingers close along the hand's own y axis:
across an object whose yaw is the hand's yaw, they close across its local y.
"""
from __future__ import annotations

import numpy as np

from robo_rl.core import ACTION_DIM

# OSC_POSE maps action 1.0 to 5 cm of eef motion per control step; gains below are per metre.
POS_GAIN = 1.0 / 0.05


def as_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def yaw_from_quat_xyzw(quat: np.ndarray) -> np.ndarray:
    """Heading of the local x axis about world z [...], from quaternions [..., 4] (xyzw)."""
    x, y, z, w = quat[..., 0], quat[..., 1], quat[..., 2], quat[..., 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def rotate(quat: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A body-frame vector v [3] (or one per pose, [B, 3]) in the world frame of each pose quat [B, 4] (xyzw): [B, 3]."""
    q, w = quat[:, :3], quat[:, 3:]
    t = 2 * np.cross(q, v)
    return v + w * t + np.cross(q, t)


def rotate_yaw(yaw: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectors v [B, 3] (or one, [3]) turned by yaw [B] about world z: [B, 3]."""
    v = np.broadcast_to(v, (len(yaw), 3))
    c, s = np.cos(yaw), np.sin(yaw)
    return np.stack([c * v[:, 0] - s * v[:, 1], s * v[:, 0] + c * v[:, 1], v[:, 2]], axis=1)


def quat_from_axis_angle(axis_angle: np.ndarray) -> np.ndarray:
    """Axis-angle [B, 3] (LIBERO's `ee_ori`, the end of `ee_states`) -> quaternion xyzw [B, 4]."""
    angle = np.linalg.norm(axis_angle, axis=1, keepdims=True)
    axis = axis_angle / np.maximum(angle, 1e-8)
    return np.concatenate([axis * np.sin(angle / 2), np.cos(angle / 2)], axis=1)


def tilt(eef_quat: np.ndarray) -> np.ndarray:
    """Rotation about world x and y [B, 2] that points the fingers straight down again, from the eef pose
    quat [B, 4] (xyzw): OSC holds no orientation of its own, so the hand tilts as the arm moves and a held
    object tilts with it."""
    approach = rotate(eef_quat, np.array([0.0, 0.0, 1.0]))  # the fingers' direction [B, 3]
    # approach x (0, 0, -1): the axis that turns the fingers down, its length the sine of their tilt
    return np.stack([-approach[:, 1], approach[:, 0]], axis=1)


def wrap(angle: np.ndarray, period: float) -> np.ndarray:
    """Angle into [-period/2, period/2): a cube looks the same every 90 degrees."""
    return (angle + period / 2) % period - period / 2


class PickPlaceExpert:
    """Top-down grasp of the task object, then lift it (Lift) or carry it over its target and release (Can, Square).

    The object's pose is the first 7 entries of robomimic's `object` key (position, quat xyzw) in these
    tasks. Phases advance per env when the end effector reaches its waypoint; `done` [B] marks the envs whose
    hand is back up after letting go.
    """

    obs_keys = ("object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")  # what `act` reads

    HOVER, DESCEND, GRASP, LIFT, CARRY, LOWER, RELEASE, RETREAT = range(8)
    grasp_offset = np.zeros(3)              # where the fingers close, in the object's frame
    grasp_symmetry = np.pi / 2              # the fingers fit the object at yaws this far apart (a cube: 90 degrees)
    carry_height = 0.2                      # above the grasp height while lifting / carrying
    place_target: np.ndarray | None = None  # where the object goes ([3], or [B, 3] one per env); None: lifting is the task
    place_yaws: np.ndarray | None = None    # yaws [K] the object may have over its target (the nearest; or [B, K]); None: any
    place_tolerance = 0.02                  # the object's xy distance from its target at which lowering starts
    release_height = 0.0                    # above place_target when the object is let go
    retreat_height = 0.3                    # above place_target where the hand goes after letting go
    steer_object = False                    # over the target, steer the object (not the hand) to place_target
    hold_upright = False                    # undo the hand's tilt (Can reaches its bin's far corner only tilted)
    hover_heights = (0.06, 0.10)            # the range each episode draws its height above the grasp point from
    min_grip = 0.01                         # finger opening (m) below which the fingers hold nothing
    approach_opening: float | None = None   # finger opening (m) while coming down on the object; None: wide open

    def __init__(self, num_envs: int, noise: float = 0.0, seed: int = 0):
        self.num_envs, self.noise = num_envs, noise
        self.rng = np.random.default_rng(seed)
        self.phase = np.zeros(num_envs, dtype=np.int64)
        self.timer = np.zeros(num_envs, dtype=np.int64)
        self.hover_height = np.full(num_envs, 0.08)
        self.grasp_pos = np.zeros((num_envs, 3))
        self.last_eef = np.full((num_envs, 3), np.nan)  # eef position [B, 3] at the previous step
        self.last_grip = np.full(num_envs, np.nan)       # finger opening [B] at the previous step
        self.done = np.zeros(num_envs, dtype=bool)

    def reset(self, env_ids=None) -> None:
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        self.phase[ids] = self.HOVER
        self.timer[ids] = 0
        self.last_eef[ids] = np.nan
        self.last_grip[ids] = np.nan
        self.done[ids] = False
        # Diversity: each demo hovers at its own height before descending.
        low, high = self.hover_heights
        self.hover_height[ids] = low + (high - low) * self.rng.random(len(ids))

    def _observe(self, obs: dict) -> tuple[np.ndarray, ...]:
        """(object position [B, 3], object quat xyzw [B, 4], eef position [B, 3], eef quat xyzw [B, 4],
        finger joints [B, 2]) from robomimic's observation keys."""
        obj = as_numpy(obs["object"])
        return (obj[:, :3], obj[:, 3:7], as_numpy(obs["robot0_eef_pos"]), as_numpy(obs["robot0_eef_quat"]),
                as_numpy(obs["robot0_gripper_qpos"]))

    def _grasp_point(self, obj_pos: np.ndarray, obj_quat: np.ndarray) -> np.ndarray:
        """Where the fingers close [B, 3], from the object's position [B, 3] and quat [B, 4]."""
        return obj_pos + rotate(obj_quat, self.grasp_offset)

    def _grasp_yaw(self, obj_quat: np.ndarray) -> np.ndarray:
        """The hand's yaw [B] that grasps the object (up to grasp_symmetry), from its quat [B, 4]: the object's own."""
        return yaw_from_quat_xyzw(obj_quat)

    def _waypoints(self, grasp_point: np.ndarray, obj_pos: np.ndarray, eef: np.ndarray) -> np.ndarray:
        """Target eef position [B, 3] of each env's current phase, from the grasp point, the object's centre and
        the eef position (each [B, 3]). The hand holds a cube or a can at its centre: it goes to place_target.
        With steer_object, over the target the object's centre is steered there instead: an object held off
        centre (a nut by its handle) hangs from the hand and turns with it. After the release the same offset
        keeps the hand where it let go."""
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
            target[retreating, 2] = place[retreating, 2] + self.retreat_height
            if self.steer_object:
                target[over_target, :2] += (eef - obj_pos)[over_target, :2]
                target[lowering, 2] += (eef - obj_pos)[lowering, 2]
        return target

    def _yaw_error(self, obj_quat: np.ndarray, eef_quat: np.ndarray) -> np.ndarray:
        """Rotation about world z [B] still to make: fingers squared with the object before the grasp,
        the held object turned to the nearest of `place_yaws` while it is carried and lowered."""
        to_grasp = wrap(self._grasp_yaw(obj_quat) - yaw_from_quat_xyzw(eef_quat), self.grasp_symmetry)
        error = np.where(self.phase <= self.DESCEND, to_grasp, 0.0)
        if self.place_yaws is not None:
            obj_yaw = yaw_from_quat_xyzw(obj_quat)
            place_yaws = np.broadcast_to(self.place_yaws, (len(obj_yaw), np.shape(self.place_yaws)[-1]))
            to_place = wrap(place_yaws - obj_yaw[:, None], 2 * np.pi)  # [B, K]
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
        action[:, :3] = np.clip(delta * POS_GAIN, -1, 1)
        action[(self.phase == self.GRASP) | (self.phase == self.RELEASE), :3] = 0.0  # hold still
        if self.hold_upright:
            action[:, 3:5] = np.clip(2.0 * tilt(eef_quat), -1, 1)
        action[:, 5] = np.clip(2.0 * yaw_error, -1, 1)
        closed = (self.phase >= self.GRASP) & (self.phase <= self.LOWER)
        action[:, 6] = np.where(closed, 1.0, -1.0)
        if self.approach_opening is not None:
            # The gripper moves its fingers a fixed step per control step in the sign of the command, and holds
            # them at 0: open or close towards the opening, hold within 5 mm of it.
            opening_error = finger_qpos[:, 0] - finger_qpos[:, 1] - self.approach_opening
            approaching = self.phase <= self.DESCEND
            action[approaching, 6] = np.where(np.abs(opening_error) < 0.005, 0.0, np.sign(opening_error))[approaching]

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
        # Settled while descending or lowering: the fingertips are on the table (a flat box's centre is below their
        # reach), or the hand on a container's rim (LIBERO's basket is narrower than the hand).
        settled = np.linalg.norm(eef - self.last_eef, axis=1) < 0.003
        self.last_eef = eef.copy()  # obs arrays may be buffers the env overwrites
        # The fingers take ~10 steps to close from wide open: on a thin rim they meet only at the very end.
        grip = finger_qpos[:, 0] - finger_qpos[:, 1]
        gripped = (np.abs(grip - self.last_grip) < 0.001) | (self.timer >= 20)
        self.last_grip = grip
        reached = np.linalg.norm(delta, axis=1) < 0.03  # loose: carrying a load leaves a steady-state error
        over_target = (np.linalg.norm(delta[:, :2], axis=1) < self.place_tolerance) & (np.abs(yaw_error) < 0.05)
        self.done = (self.phase == self.RETREAT) & (reached | (settled & (self.timer >= 10)))  # or as high as it goes
        advance = (
            ((self.phase == self.HOVER) & (np.linalg.norm(delta[:, :2], axis=1) < 0.01) & (np.abs(delta[:, 2]) < 0.02)
             & settled)
            | ((self.phase == self.DESCEND) & ((np.abs(delta[:, 2]) < 0.01) | (settled & (self.timer >= 10))))
            | ((self.phase == self.GRASP) & (self.timer >= 8) & gripped)
            | ((self.phase == self.LIFT) & reached & (self.place_target is not None))
            | ((self.phase == self.CARRY) & over_target)
            | ((self.phase == self.LOWER) & (reached | (settled & (self.timer >= 10))))
            | ((self.phase == self.RELEASE) & (self.timer >= 6))
        )
        self.grasp_pos = np.where((advance & (self.phase == self.GRASP))[:, None], eef, self.grasp_pos)
        self.phase = np.where(advance, self.phase + 1, self.phase)
        # Fingers that closed on nothing (a missed grasp, a dropped object) start over from above the object.
        holding = (self.phase >= self.LIFT) & (self.phase <= self.LOWER)
        empty = holding & (grip < self.min_grip)
        self.phase = np.where(empty, self.HOVER, self.phase)
        self.timer = np.where(advance | empty, 0, self.timer)
