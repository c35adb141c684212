"""Many demos from a few: each source demo's hand path, moved with the object it handles (MimicGen,
Mandlekar et al. 2023), executed in new scenes; only executions that succeed are kept.

Each new demo starts from a fresh reset of the task (a new object placement and robot pose) and follows the
source demo whose object was turned most like the object now. The source's hand path is split where its
gripper command switches. The first segment (the approach and the grasp) is carried along with the object:
every pose T is expressed in the frame of the object's pose at the segment's start in the source demo and put
back in the frame of the object's pose now, T' = O_now · O_src⁻¹ · T. The segments after the grasp go where the
source's went, in the world frame: in robosuite's pick-and-place tasks that is where the goal is (Lift: up;
Can: the bin; Square: the peg). The tracker first moves the hand from where it is to the segment's first pose,
as MimicGen's interpolation does (a path whose offset to the hand fades along the segment instead ran the
carried can into the wall between Can's bins at 9 of 12 new scenes: it reached the wall before the point where
the source had lifted over it). The path tracker of tracking.py executes the moved path with noise on its
motion commands, as scripted demos are collected, so every step of a generated demo is a real simulator step,
and the demo is kept only if the task succeeds: nothing in the output is imagined.

The object frame is read from robosuite's object observation, whose first 7 values are the handled object's
position and xyzw quaternion (Lift's cube, Can's can, Square's nut). An object that looks the same turned about
its own z axis (the task's `object_symmetry`: 4 for Lift's cube, 0 for Can's cylinder, any turn) has as many
frames; the one turned least from the source's is used, since moving a path by a turn turns the wrist as much
(the 3 human Lift demos without it: turns past ~100° ran the Panda's last joint into its limit, and 16 of 30
executions failed). The demos must drive OSC_POSE with delta actions, as robosuite's teleoperation and
robo_rl's scripted experts do.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
from scipy.spatial.transform import Rotation

from robo_rl.data.hdf5 import DatasetError, Episode, read_hdf5, write_robomimic
from robo_rl.demos.convert import ROBOSUITE_ENV_TYPE
from robo_rl.demos.tracking import (SPEED_KEYS, Pose, Recording, check_tracker_controller, make_recording_env,
                                    track_path)
from robo_rl.envs.robosuite import robomimic_obs
from robo_rl.utils.logging import progress_bar

PATH_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "object")
# m: the tracker aims this far ahead on the moved path. 2 cm (made for human demos that coast a few mm per step)
# took moved scripted Can demos ~2x their source's steps; at 5 cm they take 1.1-1.7x, and 11 of 12 succeeded.
LOOKAHEAD = 0.05
STEP_ALLOWANCE = 2.0  # a generated execution may take this many times its source demo's steps
# A demo ends the moment it succeeds, so its path stops at the success threshold (Lift: the cube 4 cm up), and an
# execution that grasps a little lower stops just short of it. The path goes on this many steps past its end, at
# the speed and in the direction of its last steps (the 3 human Lift demos without it: 8 of the 14 executions that
# closed the gripper and failed had lifted the cube 1-1.5 cm).
OVERSHOOT_STEPS = 20


@dataclass
class GenerationReport:
    sources: int  # demos in the source file (all written to the output too)
    attempts: int  # executions started in new scenes
    generated: int  # of those, executions that succeeded (written)
    env_steps: int  # simulator steps of all attempts, successful or not: the cost in env interaction

    @property
    def success_rate(self) -> float:
        return self.generated / max(self.attempts, 1)


@dataclass
class _Source:
    path: list[Pose]  # [T] hand pose at each step
    grip: np.ndarray  # [T, G] gripper command at each step
    objects: list[Pose]  # [T] the handled object's pose at each step


def generate_demos(source_path: str, output_path: str, num_demos: int, object_symmetry: int = 1, noise: float = 0.1,
                   seed: int = 0, max_attempts: int | None = None, valid_fraction: float = 0.1,
                   progress: bool = True) -> GenerationReport:
    """Write the source demos plus `num_demos` generated ones (module docstring) to `output_path`, a robomimic
    dataset with the source's observation keys. object_symmetry: turns about its z axis that leave the handled
    object looking the same (1: none, 4: a cube, 0: any, a cylinder). noise: std of the Gaussian noise on the
    motion commands (scripted demos are collected with 0.1 too). Stops after `max_attempts` executions (default
    5·num_demos) and writes what succeeded by then; raises DatasetError if none did. No output file on any error."""
    dataset = read_hdf5(source_path)
    if dataset.format != "robomimic" or dataset.env_args.get("type") != ROBOSUITE_ENV_TYPE:
        raise DatasetError(f"{source_path}: not a robosuite dataset in robomimic format (env_args type "
                           f"{dataset.env_args.get('type')}); demos can be generated for robosuite tasks only")
    keys = dataset.episodes[0].obs.keys()
    if missing := [k for k in PATH_KEYS if k not in keys]:
        raise DatasetError(f"{source_path}: observations lack {missing}; generation moves the hand path "
                           f"({PATH_KEYS[0]}, {PATH_KEYS[1]}) with the object's pose (object); convert the raw "
                           "demos with scripts/convert_robosuite.py, which records them")
    low_dim_keys = tuple(k for k in keys if not k.endswith("_image") and k != "task_id")
    rgb_keys = tuple(k for k in keys if k.endswith("_image"))
    env_kwargs = {**dataset.env_args["env_kwargs"], "has_renderer": False, "ignore_done": True,
                  "reward_shaping": False, "use_object_obs": True}
    env = make_recording_env(dataset.env_args["env_name"], env_kwargs, tuple(dict.fromkeys(low_dim_keys + SPEED_KEYS)))
    check_tracker_controller(env, source_path, "generation follows hand paths with the OSC_POSE tracker")
    gripper_dims = env.robots[0].gripper.dof
    sources = [_source(e, gripper_dims) for e in dataset.episodes]
    max_attempts = max_attempts or 5 * num_demos
    rng = np.random.default_rng(seed)
    generated, attempts, env_steps = [], 0, 0
    bar = progress_bar(total=num_demos, desc=f"generating {dataset.env_args['env_name']} demos", disable=not progress)
    try:
        while len(generated) < num_demos and attempts < max_attempts:
            np.random.seed(seed * 1_000_003 + attempts)  # robosuite 1.4 samples placements from the global RNG
            env.reset()
            run = Recording(env, low_dim_keys, rgb_keys)
            source = _nearest_source(sources, run, object_symmetry)
            track_path(run, source.path, source.grip, int(STEP_ALLOWANCE * len(source.path)),
                       retarget=lambda segment, start, poses: _retarget(source, segment, start, poses, run,
                                                                       object_symmetry),
                       lookahead=LOOKAHEAD, noise=noise, rng=rng)
            attempts, env_steps = attempts + 1, env_steps + run.steps
            if run.success:
                generated.append(run.episode(f"demo_{len(dataset.episodes) + len(generated)}", env.sim.model.get_xml()))
                bar.update()
            bar.set_postfix(kept=f"{len(generated)}/{attempts}")
    finally:
        bar.close()
        env.close()
    if not generated:
        raise DatasetError(f"{source_path}: none of {attempts} executions of its demos moved to new scenes "
                           "succeeded; check that the demos succeed when re-executed (convert_robosuite.py "
                           "track_path=true reports it)")
    report = GenerationReport(len(dataset.episodes), attempts, len(generated), env_steps)
    sources_out = [replace(e, name=f"demo_{i}") for i, e in enumerate(dataset.episodes)]
    write_robomimic(output_path, sources_out + generated, dataset.env_args, valid_fraction,
                    attrs={"generated_from": os.path.basename(source_path), "generation_seed": seed,
                           "generation_noise": noise, "generation_attempts": attempts,
                           "generation_env_steps": env_steps,
                           "source_demos": len(dataset.episodes)})
    return report


def _source(episode: Episode, gripper_dims: int, overshoot: int = OVERSHOOT_STEPS) -> _Source:
    obs, T = episode.obs, episode.num_steps
    positions = obs["robot0_eef_pos"][:T + 1].astype(np.float64)  # [T+1, 3], the pose after the last step too
    last = min(5, T)
    velocity = (positions[-1] - positions[-1 - last]) / last  # [3] the last steps' motion per step
    positions = np.concatenate([positions, positions[-1] + np.outer(np.arange(1, overshoot + 1), velocity)])
    rotations = Rotation.from_quat(obs["robot0_eef_quat"][:T + 1])
    rotations = list(rotations) + [rotations[-1]] * overshoot
    grip = episode.actions[:, -gripper_dims:]
    grip = np.concatenate([grip, np.repeat(grip[-1:], len(positions) - T, axis=0)])
    objects = [(obs["object"][t, :3].astype(np.float64), Rotation.from_quat(obs["object"][t, 3:7]))
               for t in range(T + 1)]
    return _Source(list(zip(positions, rotations)), grip, objects)


def _object_pose(run: Recording) -> Pose:
    obs = robomimic_obs(run.raw, ("object",))["object"]
    return obs[:3].astype(np.float64), Rotation.from_quat(obs[3:7])


def _turn(now: Rotation, source: Rotation, symmetry: int) -> Rotation:
    """The least turn from the object's pose in the source to one of its equivalent poses now."""
    steps = symmetry if symmetry > 0 else 360
    about_z = Rotation.from_euler("z", np.arange(steps)[:, None] * 2 * np.pi / steps)  # [steps] about its own z
    turns = (now * about_z) * source.inv()
    return turns[int(np.argmin(turns.magnitude()))]


def _nearest_source(sources: list[_Source], run: Recording, symmetry: int) -> _Source:
    """The source whose object starts turned least from the object now (MimicGen's nearest-neighbour selection)."""
    rotation = _object_pose(run)[1]
    return min(sources, key=lambda source: _turn(rotation, source.objects[0][1], symmetry).magnitude())


def _retarget(source: _Source, segment: int, start: int, poses: list[Pose], run: Recording,
              symmetry: int) -> list[Pose]:
    """The first segment moves with the object (T' = O_now · O_src⁻¹ · T); later ones stay in the world frame."""
    if segment > 0:
        return list(poses)
    now_position, now_rotation = _object_pose(run)
    src_position, src_rotation = source.objects[start]
    turn = _turn(now_rotation, src_rotation, symmetry)
    return [(turn.apply(p - src_position) + now_position, turn * r) for p, r in poses]
