"""Scripted experts for LIBERO suites: each task's expert is a short sequence of skills (robo_rl/demos/libero_skills.py)
read from its BDDL goal, e.g. `(And (Turnon flat_stove_1) (On moka_pot_1 flat_stove_1_cook_region))` -> turn the
stove's knob, then pick the moka pot and place it on the cook region.

What the skills need to know about LIBERO's objects and fixtures is in the tables below, measured on the scenes
and on LIBERO's asset XMLs (libero/libero/assets): how each object is grasped (GRASPS), where an object goes in
or on each kind of target (PLACEMENTS), and how each articulated part is worked (KNOBS, DRAWERS, DOORS).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from robo_rl.core import ACTION_DIM, TASK_KEY
from robo_rl.demos.libero_skills import (
    LIBERO_OBS_KEYS, Door, Drawer, Grasp, Knob, PickPlaceSkill, PushClosedSkill, Spot, TwistKnobSkill,
)
from robo_rl.demos.pick_place import as_numpy
from robo_rl.envs.libero import GoalLayout, task_problem

# Keyed by object category; measured on each object's collision geoms, standing as LIBERO places it. The hand is
# 21 cm long across its fingers (7 cm the other way), its palm 2.4 cm above their tips' middle: most choices below
# keep that span off a neighbour.
GRASPS = {
    # Cans and boxes: at their centre (their origin), across the narrow side. The flat boxes (4-4.6 cm across) with
    # the fingers only 6 cm apart as they come down. Milk and juice cartons (13 cm tall; the init states hold them
    # in the air) fall next to the cream cheese and the butter at the start of LIBERO-10's living-room episodes,
    # often within the hand's span: those two are taken 2 cm off centre along their length with the hand turned
    # 0.3 rad, from above the cartons' tops, and where a carton still kept the fingers off, again the next way
    # (task "put both the cream cheese box and the butter in the basket", init states 0-19: 20 of 20 succeed so,
    # 13 with the boxes taken centred and square).
    "alphabet_soup": Grasp(origin_height=0.038),
    "tomato_sauce": Grasp(origin_height=0.038),
    "cream_cheese": Grasp(offset=(-0.02, 0.0, 0.0), yaw=-0.3, origin_height=0.009, opening=0.06,
                          hover_heights=(0.15, 0.18), fallbacks=(((-0.025, 0.0, 0.0), -0.5), ((0.0, 0.0, 0.0), 0.0))),
    "butter": Grasp(offset=(0.02, 0.0, 0.0), yaw=-0.3, origin_height=0.0085, opening=0.06,
                    hover_heights=(0.15, 0.18), fallbacks=(((-0.01, 0.0, 0.0), 0.5), ((0.0, 0.0, 0.0), 0.0))),
    "chocolate_pudding": Grasp(origin_height=0.0135, opening=0.065),
    # Mugs (9-10 cm wide, more than the fingers open): by the handle's outer bar, across its 1.8 cm. The
    # white-and-yellow one with the hand turned 0.6 rad off square, off the red mug beside it in the living room.
    "porcelain_mug": Grasp(offset=(-0.057, 0.0, 0.065)),
    "white_yellow_mug": Grasp(offset=(0.062, 0.0, 0.065), yaw=-0.6),
    # The moka pot: by its handle's outer bar, 7 cm from its axis (its body is 6.8 cm wide, a few millimetres short
    # of the fingers' reach), high enough that the palm clears the handle's top; from above its 15 cm.
    "moka_pot": Grasp(offset=(0.0, 0.070, 0.03), yaw=np.pi / 2, origin_height=0.066, hover_heights=(0.1, 0.14)),
    # The bowl (10.7 cm): by its 2.6 mm rim on the side facing the robot, one finger inside (from the side the hand
    # would reach the wine rack), the hand heading left, as it pushes a drawer closed next.
    "akita_black_bowl": Grasp(offset=(-0.047, 0.0, 0.030), yaw=np.pi / 2, symmetry=2 * np.pi, round=True,
                              min_grip=0.001),
    # The book (upright, 2.9 x 11 x 13.4 cm, its origin 1.2 cm off its middle): across its thickness, 3.5 cm below
    # its top.
    "black_book": Grasp(held_point=(0.0, -0.012, 0.0), offset=(0.0, 0.0, 0.10), yaw=np.pi / 2),
}


@dataclass(frozen=True)
class Placement:
    """Where objects go on one kind of target: the support's height above the anchor (`surface`, m; the anchor is
    the goal region's site, or the target object's origin), the spots [K, 2] that the k-th object put there takes
    (xy from the anchor in the target fixture's frame), the object's yaws there in that frame (None: any), how
    high over where it was taken it is carried, and how far above the support it is let go. `grasp_yaw`: the hand's
    heading from the object's that placing it there needs (None: the grasp's own)."""

    surface: float
    spots: tuple[tuple[float, float], ...] = ((0.0, 0.0),)
    yaws: tuple[float, ...] | None = None
    grasp_yaw: float | None = None
    carry_height: float = 0.15
    clearance: float = 0.015
    tolerance: float = 0.01


# Keyed by the target's category (a region's: its fixture's; tables share one).
PLACEMENTS = {
    # The contain region's site is 7 cm above the basket's floor; two items side by side.
    "basket": Placement(surface=-0.067, spots=((0.0, -0.02), (0.0, 0.02)), carry_height=0.22, clearance=0.04),
    # The cook region's site is the burner's centre, its plate 2.5 cm up; two pots side by side.
    "flat_stove": Placement(surface=0.0255, spots=((-0.05, 0.0), (0.05, 0.0)), carry_height=0.2),
    # The plate's origin is at its bottom, its dish a few millimetres up; LIBERO's On needs 3 cm of the centre.
    "plate": Placement(surface=0.005, carry_height=0.12),
    # A table region's site is 2.5 cm below the table top.
    "table": Placement(surface=0.025, carry_height=0.1),
    # The drawer's floor is 2.6 cm below its region's site; the spot is the part of the open drawer outside the
    # cabinet (the region's site is the drawer's middle, half of it still inside).
    "white_cabinet": Placement(surface=-0.026, spots=((0.0, -0.02),), carry_height=0.12, clearance=0.01),
    # The heating region's floor is 7.2 cm below its site; the mug goes in only as deep as keeps the hand that holds
    # its handle outside the door frame (LIBERO's In needs the origin 8.4 cm from the site), handle to the door, the
    # hand square to it (its 21 cm along the oven's front), as low as it clears the floor (the oven is 14.4 cm tall
    # inside, the mug 10.3 cm); 2.5 cm right of the oven's middle, where the hand passes between the open door (on
    # the left) and the control panel (on the right) when the door is open wider than 1.35 rad (93% of LIBERO's
    # openings, 1.3-2.1 rad).
    "microwave": Placement(surface=-0.072, spots=((-0.025, -0.07),), yaws=(-np.pi / 2,), grasp_yaw=0.0,
                           carry_height=0.065, clearance=0.01),
    # The back compartment's floor is 7.2 cm below its site, 6 x 13.4 cm inside: the book upright along it.
    "desk_caddy": Placement(surface=-0.072, yaws=(0.0, np.pi), carry_height=0.22, tolerance=0.005),
}

# The stove's knob: at the stove's origin, its ridge (2.4 x 7 x 4.8 cm) along the stove's x at 0; on from 0.5 rad
# (LIBERO's FlatStove.turn_on).
KNOBS = {"flat_stove": Knob(grip=(0.0, 0.0, 0.033), ridge_yaw=0.0, on_angle=0.5)}
# The cabinet's drawers: fronts 8.9 cm in front of their region's site, 22 cm wide, their handles 9 cm wide in the
# middle; pushed 7 cm left of the middle, the robot's forearm clears the cabinet's top corner. Closed above 0 m
# (LIBERO's WhiteCabinet.is_close), the slide stops at 0.01.
DRAWERS = {"white_cabinet": Drawer(push_point=(-0.07, -0.089, -0.01), closed=0.0005, push_to=0.012, pitch=1.0,
                                   upright_below=-0.1)}
# The microwave's door: hinged at its left front corner, 25.9 cm wide, its outer face 2.5 cm off the hinge line and
# its handle 6.4 cm out at 23.8 cm; pushed at 17 cm, inside the handle; closed above -0.005 rad (LIBERO's
# Microwave.is_close), the hinge stops at 0.
DOORS = {"microwave": Door(hinge=(-0.1725, -0.088, 0.096), face=0.025, radius=0.17, closed=-0.003, push_to=0.05)}
DOOR_LEAD = 0.35    # rad the pushing hand leads the door by
DRAWER_LEAD = 0.03  # m


def _category(problem: dict, name: str) -> str:
    """The category of an object or fixture of a parsed problem (`moka_pot_1` -> `moka_pot`)."""
    for group in ("objects", "fixtures"):
        for category, names in problem[group].items():
            if name in names:
                return category
    raise KeyError(f"{name!r} is neither an object nor a fixture of LIBERO problem {problem['problem_name']}")


def _target_category(problem: dict, target: str) -> str:
    """The PLACEMENTS key of a goal's target: its own category for an object, its fixture's for a region."""
    region = problem["regions"].get(target)
    category = _category(problem, region["target"] if region else target)
    return "table" if category.endswith("table") else category


SkillFactory = Callable[[np.random.Generator], object]


def plan(problem: dict) -> list[SkillFactory]:
    """The skills that reach a task's goal, in order, as factories of fresh skills (one env's; given a generator
    for their random choices): knobs turned on first, then each object placed (in the goal's order), then what the
    goal closes (after what goes inside it)."""
    layout = GoalLayout.of(problem)
    first, placements, last = [], [], []
    placed_on: dict[str, int] = {}
    for predicate, *arguments in problem["goal_state"]:
        if predicate in ("in", "on"):
            placements.append(_pick_place(problem, layout, *arguments, index=placed_on.get(arguments[1], 0)))
            placed_on[arguments[1]] = placed_on.get(arguments[1], 0) + 1
        elif predicate == "turnon":
            first.append(_twist(problem, layout, arguments[0]))
        elif predicate == "close":
            last.append(_close(problem, layout, arguments[0]))
        else:
            raise ValueError(f"no skill for the goal predicate {predicate!r} of {problem['problem_name']}")
    return first + placements + last


def _fixture_slot(problem: dict, layout: GoalLayout, name: str) -> int:
    """The object slot of `name`, or of the fixture a region `name` belongs to."""
    region = problem["regions"].get(name)
    owner = region["target"] if region else name
    if owner not in layout.objects:
        raise ValueError(f"{owner!r} is not an object of interest of {problem['problem_name']}: no pose to act on")
    return layout.objects.index(owner)


def _pick_place(problem: dict, layout: GoalLayout, obj: str, target: str, index: int) -> SkillFactory:
    grasp = GRASPS[_category(problem, obj)]
    placement = PLACEMENTS[_target_category(problem, target)]
    if placement.grasp_yaw is not None:
        grasp = dataclasses.replace(grasp, yaw=placement.grasp_yaw)
    x, y = placement.spots[index % len(placement.spots)]
    offset = np.array([x, y, placement.surface + placement.clearance + grasp.origin_height])
    frame = _fixture_slot(problem, layout, target) if placement.yaws is not None else None
    if target in layout.regions:
        spot = Spot(offset, region=layout.regions.index(target), frame=frame, yaws=placement.yaws)
    else:
        spot = Spot(offset, object=layout.objects.index(target), frame=frame, yaws=placement.yaws)
    slot = layout.objects.index(obj)
    return lambda rng: PickPlaceSkill(slot, grasp, spot, placement.carry_height, placement.tolerance,
                                      seed=int(rng.integers(2**31)))


def _twist(problem: dict, layout: GoalLayout, name: str) -> SkillFactory:
    knob = KNOBS[_category(problem, name)]
    fixture, joint = _fixture_slot(problem, layout, name), layout.articulated.index(name)
    return lambda rng: TwistKnobSkill(fixture, joint, knob)


def _close(problem: dict, layout: GoalLayout, name: str) -> SkillFactory:
    fixture, joint = _fixture_slot(problem, layout, name), layout.articulated.index(name)
    category = _category(problem, layout.objects[fixture])
    if name in problem["regions"]:  # a drawer: its region's site moves with it
        part, region, lead = DRAWERS[category], layout.regions.index(name), DRAWER_LEAD
    else:
        part, region, lead = DOORS[category], None, DOOR_LEAD
    return lambda rng: PushClosedSkill(part, joint, fixture, region, lead)


class LiberoGoalExpert:
    """Scripted expert for every task of a LIBERO suite, batched over envs that may run different tasks: each env
    follows its task's plan (read from `task_id` in the observation), one skill after another; a finished plan
    holds still with the fingers open. Noise (for demo diversity) is added to the motion of every action."""

    obs_keys = LIBERO_OBS_KEYS

    def __init__(self, num_envs: int, suite: str, noise: float = 0.0, seed: int = 0):
        self.num_envs, self.suite, self.noise = num_envs, suite, noise
        self.rng = np.random.default_rng(seed)
        self.plans: dict[int, list[SkillFactory]] = {}
        self.skills: list[list | None] = [None] * num_envs  # each env's skills still to run; None: not started
        self.task = np.full(num_envs, -1)

    def reset(self, env_ids=None) -> None:
        for i in range(self.num_envs) if env_ids is None else env_ids:
            self.skills[i] = None

    def _start(self, env: int, task_id: int) -> None:
        if task_id not in self.plans:
            self.plans[task_id] = plan(task_problem(self.suite, task_id))
        self.skills[env] = [make(self.rng) for make in self.plans[task_id]]
        self.task[env] = task_id

    def act(self, obs: dict) -> np.ndarray:
        """OSC_POSE actions [B, 7] for a batch of observations; advances each env's skills."""
        task_ids = as_numpy(obs[TASK_KEY]).astype(np.int64)
        action = np.zeros((self.num_envs, ACTION_DIM))
        action[:, 6] = -1.0
        for env in range(self.num_envs):
            if self.skills[env] is None or self.task[env] != task_ids[env]:
                self._start(env, int(task_ids[env]))
            skills = self.skills[env]
            if skills:
                action[env] = skills[0].act({k: obs[k][env:env + 1] for k in self.obs_keys})[0]
                if skills[0].done[0]:
                    skills.pop(0)
        if self.noise > 0:
            action[:, :6] += self.noise * self.rng.standard_normal((self.num_envs, 6))
        return np.clip(action, -1.0, 1.0).astype(np.float32)
