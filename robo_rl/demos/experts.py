"""Scripted experts for robosuite tasks, LIBERO-Object and LIBERO-10, batched over envs, with noise for demo diversity.

Each expert maps a batch of observations (robomimic keys, or LIBERO's for LIBERO suites; numpy or torch
[B, ...]) to OSC_POSE delta actions [B, 7] in [-1, 1]: position (±1 = ±5 cm per step), axis-angle rotation, gripper
(-1 open, +1 closed). Experts keep a per-env phase, so call `reset(env_ids)` when episodes start. LIBERO-10's
expert strings skills together as each task's goal says (robo_rl/demos/libero_tasks.py).
"""
from __future__ import annotations

from functools import partial

import numpy as np

from robo_rl.demos.libero_tasks import LiberoGoalExpert
from robo_rl.demos.pick_place import PickPlaceExpert, as_numpy, quat_from_axis_angle
from robo_rl.envs.libero import OBJECT_FEATURES


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
    # The nut hangs 6 cm from the hand that holds its handle, turning with the hand, and the hole leaves 7 mm to
    # spare: over the peg the nut's centre is steered, not the hand.
    steer_object = True


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
        objects = as_numpy(obs["object"])
        basket = objects[:, OBJECT_FEATURES:OBJECT_FEATURES + 3]
        self.place_target = basket.copy()
        self.place_target[:, 2] += self.grasp_pos[:, 2] + self.release_clearance
        eef = as_numpy(obs["ee_states"])
        return (objects[:, :3], objects[:, 3:7], eef[:, :3], quat_from_axis_angle(eef[:, 3:6]),
                as_numpy(obs["gripper_states"]))

    def _grasp_point(self, obj_pos: np.ndarray, obj_quat: np.ndarray) -> np.ndarray:
        """The item's centre, raised for tall items to top_grip below their top (an item on the floor is twice
        as tall as its centre is high)."""
        grasp = obj_pos.copy()
        grasp[:, 2] = np.maximum(obj_pos[:, 2], 2 * obj_pos[:, 2] - self.top_grip)
        return grasp


EXPERTS = {"lift": LiftExpert, "can": CanExpert, "square": SquareExpert, "libero_object": LiberoObjectExpert,
           "libero_10": partial(LiberoGoalExpert, suite="libero_10")}


def make_expert(task_cfg, num_envs: int, noise: float = 0.0, seed: int = 0):
    """The scripted expert of a task config (`task.expert`), or a clear error when there is none."""
    name = getattr(task_cfg, "expert", None)
    if name not in EXPERTS:
        raise ValueError(f"task {task_cfg.name!r} has no scripted expert (available: {sorted(EXPERTS)}); "
                         f"pass a dataset with dataset=PATH")
    return EXPERTS[name](num_envs, noise=noise, seed=seed)
