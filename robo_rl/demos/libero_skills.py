"""Skills a LIBERO task expert strings together, each a phase machine for one env over LIBERO's state observation
(`object`, `ee_states`, `gripper_states`, `joint_states`; robo_rl/envs/libero.py lays out `object`): pick an object
and place it
(`PickPlaceSkill`, the shared pick-and-place phase machine), turn a knob (`TwistKnobSkill`), push a drawer or a door
closed (`PushClosedSkill`).

Every skill takes one env's observation (a dict of [1, ...] arrays), answers an OSC_POSE action [1, 7] without
noise, and sets `done` [1] once its part of the task is finished and the hand is clear of it. Offsets "in a
fixture's frame" turn with the fixture's yaw (LIBERO sets fixtures upright); the objects' slots, the regions' and
the joints' are the `object` observation's (`GoalLayout`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from robo_rl.core import ACTION_DIM
from robo_rl.demos.pick_place import (
    POS_GAIN, PickPlaceExpert, as_numpy, quat_from_axis_angle, rotate, rotate_yaw, tilt, wrap, yaw_from_quat_xyzw,
)
from robo_rl.envs.libero import split_object_obs

LIBERO_OBS_KEYS = ("object", "ee_states", "gripper_states", "joint_states")
# The hand's last joint turns it about its fingers: a turn of the hand by +a about world z turns the joint by about
# -a (measured), and the joint stops at ±2.9 rad, where the arm's controller loses its way. Headings that look alike
# to the fingers (half turns apart) are told apart by it.
WRIST_LIMIT = 2.6


def wrist_safe_turn(turn: np.ndarray, wrist: np.ndarray, period: float | np.ndarray,
                    reserve: float = 0.0) -> np.ndarray:
    """The turn of the hand about world z [B] among `turn` [B] + k·period (period: one, or [B]) that is smallest
    while the last joint (`wrist` [B], rad) stays within WRIST_LIMIT less `reserve` (kept for a turn to come, in
    the joint's negative direction); where none does, the one that leaves the joint nearest its middle."""
    candidates = turn[:, None] + np.reshape(period, (-1, 1)) * np.arange(-2, 3)[None, :]  # [B, 5]
    after = wrist[:, None] - candidates
    fits = (after < WRIST_LIMIT) & (after > -WRIST_LIMIT + reserve)
    cost = np.where(fits, np.abs(candidates), 10.0 + np.abs(after))
    return candidates[np.arange(len(turn)), cost.argmin(axis=1)]


@dataclass
class LiberoView:
    """A batch of LIBERO state observations, split: objects [B, OBJECT_SLOTS, OBJECT_FEATURES] (position,
    quat xyzw, position relative to the hand), regions [B, REGION_SLOTS, REGION_FEATURES] (site position,
    position relative to the hand), joints [B, JOINT_SLOTS], eef position [B, 3], eef quat xyzw [B, 4], finger
    joints [B, 2], the arm's last joint (`wrist`, rad) [B]."""

    objects: np.ndarray
    regions: np.ndarray
    joints: np.ndarray
    eef: np.ndarray
    eef_quat: np.ndarray
    fingers: np.ndarray
    wrist: np.ndarray

    @classmethod
    def of(cls, obs: dict) -> LiberoView:
        ee_states = as_numpy(obs["ee_states"])
        objects, regions, joints = split_object_obs(as_numpy(obs["object"]))
        return cls(objects, regions, joints, ee_states[:, :3], quat_from_axis_angle(ee_states[:, 3:6]),
                   as_numpy(obs["gripper_states"]), as_numpy(obs["joint_states"])[:, 6])

    def yaw(self, slot: int | None) -> np.ndarray:
        """Yaw [B] of the object in `slot`; 0 for None (the world)."""
        if slot is None:
            return np.zeros(len(self.eef))
        return yaw_from_quat_xyzw(self.objects[:, slot, 3:7])


@dataclass(frozen=True)
class Grasp:
    """How the fingers take an object: where they close, `offset` [3] from its `held_point` in its frame (in the
    world's for a `round` object, which looks the same at every yaw), with the hand's heading at `yaw` from the
    object's (the world's x for a round one): the fingers close across the hand's heading. `held_point` [3] (from
    the object's origin, in its frame) is what the placing steers onto its spot: the origin, LIBERO's predicates
    test it, unless the object is off centre of it. `origin_height`: the held point above the object's bottom when
    it stands upright (m)."""

    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    held_point: tuple[float, float, float] = (0.0, 0.0, 0.0)
    yaw: float = 0.0
    symmetry: float = np.pi          # the fingers fit at headings this far apart
    round: bool = False
    origin_height: float = 0.0
    min_grip: float = 0.01           # finger opening below which the fingers hold nothing
    opening: float | None = None     # finger opening while coming down (m; None: wide open, 8 cm)
    hover_heights: tuple[float, float] = (0.06, 0.10)
    # (offset, yaw) pairs tried in turn, as `offset` and `yaw` are, after fingers close on nothing (a neighbour
    # kept the hand off the object)
    fallbacks: tuple[tuple[tuple[float, float, float], float], ...] = ()


@dataclass(frozen=True)
class Spot:
    """Where a placed object's origin is let go: `offset` [3] from an anchor, a goal region's site (`region` slot)
    or an object of interest (`object` slot), turned by the yaw of the object in slot `frame` (a fixture; None:
    the world's axes); `yaws`: the object's yaws over it (the nearest is taken) in that frame, None: any."""

    offset: np.ndarray
    region: int | None = None
    object: int | None = None
    frame: int | None = None
    yaws: tuple[float, ...] | None = None

    def position(self, view: LiberoView) -> np.ndarray:
        """[B, 3]"""
        anchor = view.regions[:, self.region, :3] if self.region is not None else view.objects[:, self.object, :3]
        return anchor + rotate_yaw(view.yaw(self.frame), self.offset)

    def object_yaws(self, view: LiberoView) -> np.ndarray | None:
        """[B, K] or None"""
        return None if self.yaws is None else view.yaw(self.frame)[:, None] + np.asarray(self.yaws)[None, :]


class PickPlaceSkill(PickPlaceExpert):
    """Grasp the object in `object_slot` as `grasp` says, carry it `carry_height` above where it was taken, over
    `spot` (its origin steered there, turned to the spot's yaws), lower it there, let go and rise."""

    obs_keys = LIBERO_OBS_KEYS
    hold_upright = True    # a held mug or pot swings with a tilted hand
    steer_object = True    # handles hold mugs and pots off centre: their origin is what has to land on the spot
    retreat_height = 0.25  # above the object's origin where it was let go

    def __init__(self, object_slot: int, grasp: Grasp, spot: Spot, carry_height: float, tolerance: float = 0.01,
                 seed: int = 0):
        self.object_slot, self.grasp, self.spot = object_slot, grasp, spot
        self.attempt = 0
        self.grasp_offset, self.grasp_turn = np.asarray(grasp.offset), grasp.yaw
        self.grasp_symmetry, self.min_grip, self.hover_heights = grasp.symmetry, grasp.min_grip, grasp.hover_heights
        self.approach_opening = grasp.opening
        self.carry_height, self.place_tolerance = carry_height, tolerance
        super().__init__(1, seed=seed)
        self.reset()

    def _observe(self, obs: dict) -> tuple[np.ndarray, ...]:
        """As PickPlaceExpert's, from LIBERO's keys; aims at this step's spot (a drawer's moves with the drawer)."""
        view = LiberoView.of(obs)
        self.place_target, self.place_yaws = self.spot.position(view), self.spot.object_yaws(view)
        self.wrist = view.wrist
        obj = view.objects[:, self.object_slot]
        held = obj[:, :3] + rotate(obj[:, 3:7], np.asarray(self.grasp.held_point))
        return held, obj[:, 3:7], view.eef, view.eef_quat, view.fingers

    def _grasp_point(self, obj_pos: np.ndarray, obj_quat: np.ndarray) -> np.ndarray:
        return obj_pos + self.grasp_offset if self.grasp.round else super()._grasp_point(obj_pos, obj_quat)

    def _waypoints(self, grasp_point: np.ndarray, obj_pos: np.ndarray, eef: np.ndarray) -> np.ndarray:
        """As PickPlaceExpert's, but the hand comes over the object no lower than it is: from a skill before, it
        may be beside a pot's or a mug's top, and a straight line down to a handle would sweep the object over."""
        target = super()._waypoints(grasp_point, obj_pos, eef)
        coming = (self.phase == self.HOVER) & (np.linalg.norm((target - eef)[:, :2], axis=1) > 0.02)
        target[coming, 2] = np.maximum(target[coming, 2], eef[coming, 2])
        return target

    def _grasp_yaw(self, obj_quat: np.ndarray) -> np.ndarray:
        heading = np.zeros(len(obj_quat)) if self.grasp.round else yaw_from_quat_xyzw(obj_quat)
        return heading + self.grasp_turn

    def _next_phase(self, delta: np.ndarray, yaw_error: np.ndarray, eef: np.ndarray,
                    finger_qpos: np.ndarray) -> None:
        """As PickPlaceExpert's; a grasp that closed on nothing is tried again the grasp's next way."""
        closed = (self.phase >= self.GRASP) & (self.phase <= self.LOWER)
        super()._next_phase(delta, yaw_error, eef, finger_qpos)
        if closed[0] and self.phase[0] == self.HOVER and self.grasp.fallbacks:
            offset, self.grasp_turn = self.grasp.fallbacks[self.attempt % len(self.grasp.fallbacks)]
            self.grasp_offset, self.attempt = np.asarray(offset), self.attempt + 1

    def _yaw_error(self, obj_quat: np.ndarray, eef_quat: np.ndarray) -> np.ndarray:
        """As PickPlaceExpert's, turning whichever way keeps the last joint in its range."""
        turn = super()._yaw_error(obj_quat, eef_quat)
        period = np.where(self.phase <= self.DESCEND, self.grasp_symmetry, 2 * np.pi)
        return np.where(turn != 0.0, wrist_safe_turn(turn, self.wrist, period), 0.0)


@dataclass(frozen=True)
class Knob:
    """A knob that turns about its vertical axis: its ridge's centre `grip` [3] from the fixture's origin in its
    frame, the ridge's long axis at heading `ridge_yaw` in that frame when the joint reads 0, turned by the joint
    (rad, counter-clockwise seen from above); it is on from `on_angle`."""

    grip: tuple[float, float, float]
    ridge_yaw: float
    on_angle: float


class TwistKnobSkill:
    """Grip a knob's ridge from above and turn the hand until the knob is `turn_past` beyond on; let go and rise.
    Done at once where the knob is on already."""

    HOVER, DESCEND, GRASP, TWIST, RELEASE, RETREAT = range(6)
    hover_height = 0.15   # over the ridge, and clear of what stands beside the knob when leaving
    turn_past = 0.35      # rad beyond on_angle, a margin: the knob stays where it is let go
    twist_speed = 0.5     # action (x 0.5 rad per step)
    max_twist_steps = 40  # a twist that turns nothing (fingers slipped off the ridge) lets go and starts over

    def __init__(self, fixture_slot: int, joint_slot: int, knob: Knob):
        self.fixture_slot, self.joint_slot, self.knob = fixture_slot, joint_slot, knob
        self.phase, self.timer, self.done = self.HOVER, 0, np.zeros(1, dtype=bool)
        self.last_eef = np.full(3, np.nan)

    def act(self, obs: dict) -> np.ndarray:
        """OSC_POSE action [1, 7] for one env's observation ([1, ...] arrays); advances the phase."""
        view = LiberoView.of(obs)
        angle = view.joints[0, self.joint_slot]
        if self.phase == self.HOVER and angle >= self.knob.on_angle:
            self.done[:] = True
        fixture_yaw = view.yaw(self.fixture_slot)
        grip = view.objects[:, self.fixture_slot, :3] + rotate_yaw(fixture_yaw, np.asarray(self.knob.grip))
        eef = view.eef
        target = grip.copy()
        if self.phase in (self.HOVER, self.RETREAT):
            target[:, 2] += self.hover_height
        delta = target - eef
        ridge_heading = fixture_yaw + self.knob.ridge_yaw + angle
        yaw_error = wrap(ridge_heading - yaw_from_quat_xyzw(view.eef_quat), np.pi)
        yaw_error = wrist_safe_turn(yaw_error, view.wrist, np.pi, reserve=self.knob.on_angle + self.turn_past)

        action = np.zeros((1, ACTION_DIM))
        action[:, :3] = np.clip(delta * POS_GAIN, -1, 1)
        action[:, 3:5] = np.clip(2.0 * tilt(view.eef_quat), -1, 1)
        if self.phase <= self.DESCEND:
            action[:, 5] = np.clip(2.0 * yaw_error, -1, 1)
        elif self.phase == self.TWIST:
            action[:, 5] = self.twist_speed
        action[:, 6] = 1.0 if self.GRASP <= self.phase <= self.TWIST else -1.0

        settled = np.linalg.norm(eef[0] - self.last_eef) < 0.003
        self.last_eef = eef[0].copy()
        self.timer += 1
        advance = {
            self.HOVER: np.linalg.norm(delta[0]) < 0.015 and abs(yaw_error[0]) < 0.05 and settled,
            self.DESCEND: abs(delta[0, 2]) < 0.008,
            self.GRASP: self.timer >= 8,
            self.TWIST: angle >= self.knob.on_angle + self.turn_past,
            self.RELEASE: self.timer >= 6,
            self.RETREAT: np.linalg.norm(delta[0]) < 0.03,
        }[self.phase]
        if advance:
            retry = self.phase == self.RELEASE and angle < self.knob.on_angle  # let go of a knob still off
            self.phase, self.timer = (self.HOVER if retry else self.phase + 1), 0
            self.done[:] = self.phase > self.RETREAT
        elif self.phase == self.TWIST and self.timer > self.max_twist_steps:
            self.phase, self.timer = self.RELEASE, 0
        return action


def turn_hand(eef_quat: np.ndarray, heading: np.ndarray, pitch: np.ndarray) -> np.ndarray:
    """Rotation (axis-angle, world frame) [B, 3] from the hand's pose quat [B, 4] (xyzw) to the hand heading along
    `heading` [B] (rad about world z) with its fingers pitched `pitch` [B] (rad) from straight down towards it."""
    forward = np.stack([np.cos(heading), np.sin(heading), np.zeros_like(heading)], axis=1)
    up = np.array([0.0, 0.0, 1.0])
    fingers = -np.cos(pitch)[:, None] * up + np.sin(pitch)[:, None] * forward  # the hand's z axis
    front = np.cos(pitch)[:, None] * forward + np.sin(pitch)[:, None] * up     # its x axis
    target = Rotation.from_matrix(np.stack([front, np.cross(fingers, front), fingers], axis=2))
    return (target * Rotation.from_quat(eef_quat).inv()).as_rotvec()


@dataclass(frozen=True)
class Drawer:
    """A drawer that slides along its fixture's +y as it closes, its joint growing: pushed at `push_point` [3] on
    its front, from its region's site in the fixture's frame, the hand heading along the push: its fingers across
    the drawer (the hand is 21 cm long that way, 7 cm the other: along the push it would reach the cabinet above)
    and the wrist, which stands out behind the hand's heading, away from the cabinet. Near closed the fingers
    pitch towards the drawer, up to `pitch` (rad) from straight down, which keeps the hand below and behind the
    drawers' handles above when the fingertips reach the closed front; further out than `upright_below` (m) they
    point straight down, which keeps the wrist clear of what stands behind the hand. Closed from `closed` (m),
    pushed to `push_to`."""

    push_point: tuple[float, float, float]
    closed: float
    push_to: float
    pitch: float
    upright_below: float

    def contact(self, view: LiberoView, region: int, joint: int, fixture: int, position: np.ndarray):
        """Where a fingertip touches the drawer's front with the joint at `position` [B] (now: view.joints), the
        front's outward normal, the hand's heading and its fingers' pitch: ([B, 3], [B, 3], [B], [B])."""
        yaw = view.yaw(fixture)
        shift = np.stack([np.zeros_like(position), position - view.joints[:, joint], np.zeros_like(position)], axis=1)
        point = view.regions[:, region, :3] + rotate_yaw(yaw, np.asarray(self.push_point) + shift)
        closing = np.clip((position - self.upright_below) / (self.closed - self.upright_below), 0.0, 1.0)
        return point, rotate_yaw(yaw, np.array([0.0, -1.0, 0.0])), yaw + np.pi / 2, self.pitch * closing


@dataclass(frozen=True)
class Door:
    """A door on a vertical hinge at `hinge` [3] from its fixture's origin (in its frame) that closes as its joint
    grows to 0: at angle θ its free edge points along (cos θ, sin θ) in the fixture's frame and its outer face,
    `face` (m) off the hinge line, faces (sin θ, -cos θ). Pushed `radius` (m) out from the hinge, the hand's
    fingers along the door and straight down; closed from `closed` (rad), pushed to `push_to`."""

    hinge: tuple[float, float, float]
    face: float
    radius: float
    closed: float
    push_to: float

    def contact(self, view: LiberoView, region: int | None, joint: int, fixture: int, position: np.ndarray):
        """As Drawer.contact: the door's outer face `radius` out from the hinge at angle `position` [B]."""
        yaw = view.yaw(fixture)
        along = np.stack([np.cos(position), np.sin(position), np.zeros_like(position)], axis=1)
        normal = np.stack([np.sin(position), -np.cos(position), np.zeros_like(position)], axis=1)
        local = np.asarray(self.hinge) + self.radius * along + self.face * normal
        point = view.objects[:, fixture, :3] + rotate_yaw(yaw, local)
        return point, rotate_yaw(yaw, normal), yaw + position + np.pi / 2, np.zeros_like(position)


class PushClosedSkill:
    """Close a drawer or a door with the closed fingers: go in front of its push point from above, push it along
    its path (the target a `lead` ahead of where it is) until the joint reads closed, back off and rise."""

    HOVER, DESCEND, PUSH, BACK, RETREAT = range(5)
    hover_height = 0.12   # above the push point while coming over it
    standoff = 0.05       # off the face while descending and after backing off
    finger = 0.012        # the closed fingertips' half thickness
    max_push_steps = 120  # a push that does not close (the hand slipped past) starts over

    def __init__(self, part: Drawer | Door, joint_slot: int, fixture_slot: int, region_slot: int | None, lead: float):
        self.part, self.joint_slot, self.fixture_slot, self.region_slot = part, joint_slot, fixture_slot, region_slot
        self.lead = lead
        self.phase, self.timer, self.done = self.HOVER, 0, np.zeros(1, dtype=bool)
        self.last_eef = np.full(3, np.nan)

    def act(self, obs: dict) -> np.ndarray:
        """OSC_POSE action [1, 7] for one env's observation ([1, ...] arrays); advances the phase."""
        view = LiberoView.of(obs)
        position = view.joints[:, self.joint_slot]
        closed = position[0] >= self.part.closed
        if self.phase == self.HOVER and closed:
            self.done[:] = True
        ahead = np.minimum(position + self.lead, self.part.push_to) if self.phase == self.PUSH else position
        point, normal, heading, pitch = self.part.contact(view, self.region_slot, self.joint_slot, self.fixture_slot,
                                                          ahead)
        off = self.finger + (self.standoff if self.phase != self.PUSH else 0.0)
        target = point + off * normal
        if self.phase in (self.HOVER, self.RETREAT):
            target[:, 2] += self.hover_height
        eef = view.eef
        delta = target - eef

        action = np.zeros((1, ACTION_DIM))
        action[:, :3] = np.clip(delta * POS_GAIN, -1, 1)
        action[:, 3:6] = np.clip(2.0 * turn_hand(view.eef_quat, heading, pitch), -1, 1)
        action[:, 6] = 1.0  # a fist: closed fingers neither catch on the handle nor splay

        settled = np.linalg.norm(eef[0] - self.last_eef) < 0.003
        self.last_eef = eef[0].copy()
        self.timer += 1
        advance = {
            self.HOVER: np.linalg.norm(delta[0]) < 0.02 and settled,
            self.DESCEND: np.linalg.norm(delta[0]) < 0.01,
            self.PUSH: closed,
            self.BACK: np.linalg.norm(delta[0]) < 0.02,
            self.RETREAT: np.linalg.norm(delta[0]) < 0.03,
        }[self.phase]
        if advance:
            self.phase, self.timer = self.phase + 1, 0
            self.done[:] = self.phase > self.RETREAT
        elif self.phase == self.PUSH and self.timer > self.max_push_steps:
            self.phase, self.timer = self.HOVER, 0
        return action
