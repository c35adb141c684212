"""Raw robosuite demonstrations -> robomimic datasets, by replaying them in the simulator.

A raw file (robosuite's `collect_human_demonstrations.py`, or robomimic's `demo*.hdf5`) holds only
MuJoCo states, actions and the scene XML of each demo. As robomimic's `dataset_states_to_obs.py`
does, we rebuild the env, load each demo's scene, set every recorded state to read its observation,
label rewards and dones (done = 1 at the last step and at success), and play the final action to get
the last next observation. Separately, the recorded actions are replayed open loop from the first
state to report whether they still reach success here and how far the simulation drifts.

`drop_idle=True` records each demo differently: its actions are replayed from the first state with the
idle ones left out, and the replay itself is the episode (every transition one real simulator step).
Idle = no motion commanded, the gripper command unchanged, and the robot at rest. Keyboard teleoperation
is mostly idle (robosuite's 3 human Lift demos: 91% zero-motion steps, up to 147 in a row while the
operator thinks), and a policy cloned from it learns to wait. OpenVLA drops such no-op steps too; only
steps at rest go, because the steps where the arm still coasts after a key press or the fingers still
close carry the motion the demo relies on (dropping those as well, 2 of the 3 Lift demos no longer lift
the cube). A demo whose filtered replay does not succeed is left out.

`track_path=True` goes further: each demo is executed again from its first state by a proportional OSC_POSE
tracker that follows the demo's end-effector path (position and orientation at each recorded state, a target
2 cm ahead of the hand) and switches the gripper where the demo did, once the hand has reached that point and
stopped; that execution is the episode. The path and the gripper timing are the human's, the actions are a
smooth function of where the hand is, as a scripted expert's are, instead of key pulses whose timing no
state tells (the 3 human Lift demos: 73/91/93 steps instead of 392/482/510, all still lift the cube).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import h5py
import numpy as np

from robo_rl.data.hdf5 import DatasetError, Episode, demo_sort_key, nonfinite_count, write_robomimic
from robo_rl.demos.tracking import (REST_SPEED, SPEED_KEYS, TRACK_LOOKAHEAD, Recording, check_tracker_controller,
                                    eef_pose, make_recording_env, track_path)
from robo_rl.envs.robosuite import robomimic_obs

# robomimic's low-dim keys for robosuite tasks (all that robosuite 1.4 provides; robomimic's
# `robot0_eef_vel_*` came from an older robosuite branch).
LOW_DIM_KEYS = (
    "object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "robot0_gripper_qvel",
    "robot0_joint_pos", "robot0_joint_pos_cos", "robot0_joint_pos_sin", "robot0_joint_vel",
)
ROBOSUITE_ENV_TYPE = 1  # robomimic's EnvType.ROBOSUITE_TYPE, stored in env_args["type"]


@dataclass
class ReplayReport:
    demo: str
    steps: int
    success: bool  # replaying the recorded actions from the first state reaches task success
    max_state_divergence: float  # max over steps of ||replayed state - recorded state||_2 (nan: re-executed)
    kept_steps: int | None = None  # drop_idle, track_path: steps of the recorded episode (None: the recorded demo)


@dataclass
class RawDemo:
    """One demo of a raw file: what was recorded, nothing derived."""

    name: str
    model_file: str
    states: np.ndarray  # [T, D] float64
    actions: np.ndarray  # [T, A]


def convert_robosuite(input_path: str, output_path: str, cameras: tuple[str, ...] = (), image_size: int = 84,
                      low_dim_keys: tuple[str, ...] = LOW_DIM_KEYS, valid_fraction: float = 0.1,
                      drop_idle: bool = False, track_path: bool = False) -> list[ReplayReport]:
    """Convert a raw robosuite demo file into a robomimic dataset at `output_path`.

    cameras: robosuite camera names (e.g. agentview, robot0_eye_in_hand) recorded as `<camera>_image`
    uint8 images of image_size x image_size. drop_idle: record the replay without idle steps; track_path:
    record a tracking controller's execution of each demo's path (module docstring). With either, demos
    that no longer succeed are left out. Returns one replay report per demo. On any error no output file
    is left behind.
    """
    if drop_idle and track_path:
        raise DatasetError("drop_idle and track_path each record a different re-execution of the demos; pick one")
    env_name, env_kwargs, version, demos = read_raw_robosuite(input_path)
    env_kwargs = {
        **env_kwargs,
        "has_renderer": False,
        "has_offscreen_renderer": bool(cameras),
        "ignore_done": True,
        "use_object_obs": True,
        "use_camera_obs": bool(cameras),
        "reward_shaping": False,
        "control_freq": env_kwargs.get("control_freq", 20),
    }
    if cameras:
        env_kwargs.update(camera_names=list(cameras), camera_heights=image_size, camera_widths=image_size,
                          camera_depths=False)
    # drop_idle and track_path judge rest from the joint and finger speeds, whichever keys the dataset records
    env = make_recording_env(env_name, env_kwargs, tuple(dict.fromkeys(low_dim_keys + SPEED_KEYS)))
    rgb_keys = tuple(f"{c}_image" for c in cameras)
    try:
        episodes, reports = [], []
        for demo in demos:
            _load_scene(env, input_path, demo, version)
            if drop_idle or track_path:
                execute = _replay_without_idle if drop_idle else _track_path
                episode, report = execute(env, demo, low_dim_keys, rgb_keys)
                episodes += [episode] if report.success else []  # success implies at least one kept step
            else:
                report = _replay(env, demo)
                episodes.append(_extract(env, demo, low_dim_keys, rgb_keys))
            reports.append(report)
    finally:
        env.close()
    if not episodes:
        how = "without its idle steps" if drop_idle else "by tracking its path"
        raise DatasetError(f"{input_path}: no demo still succeeds when re-executed {how}; convert it without "
                           f"{'drop_idle' if drop_idle else 'track_path'}")
    env_args = {"env_name": env_name, "type": ROBOSUITE_ENV_TYPE, "env_kwargs": env_kwargs}
    write_robomimic(output_path, episodes, env_args, valid_fraction,
                    attrs={"source_file": os.path.basename(input_path), "source_robosuite_version": version})
    return reports


def read_raw_robosuite(path: str) -> tuple[str, dict, str, list[RawDemo]]:
    """(env name, env kwargs, recorded robosuite version, demos) of a raw demo file, validated."""
    with _open_raw(path) as f:
        env_name, env_kwargs, version = _raw_header(f, path)
        names = sorted(f["data"].keys(), key=demo_sort_key)
        if not names:
            raise DatasetError(f"{path} [data]: no demos")
        demos = [_read_raw_demo(f["data"][n], path, n) for n in names]
    return env_name, env_kwargs, version, demos


def is_raw_robosuite(path: str | os.PathLike) -> bool:
    """Whether `path` holds raw demos (MuJoCo states and actions, no observations: convert_robosuite's input)
    rather than a robomimic dataset, judged by its first demo."""
    with _open_raw(path) as f:
        data = f.get("data")
        first = next(iter(data.values()), None) if isinstance(data, h5py.Group) else None
        return isinstance(first, h5py.Group) and "obs" not in first


def raw_env_name(path: str | os.PathLike) -> str:
    """The robosuite env that recorded a raw demo file, from its attrs alone."""
    with _open_raw(path) as f:
        return _raw_header(f, path)[0]


def _open_raw(path: str | os.PathLike) -> h5py.File:
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path}: cannot open as HDF5 ({e}); the file is truncated or corrupt") from e


def _raw_header(f: h5py.File, path: str | os.PathLike) -> tuple[str, dict, str]:
    """(env name, env kwargs, recorded robosuite version) of an open raw demo file."""
    if "data" not in f:
        raise DatasetError(f"{path} [data]: missing group `data`; not a robosuite demo file")
    attrs = f["data"].attrs
    if "env_info" in attrs:  # robosuite's collect_human_demonstrations.py
        env_kwargs = json.loads(attrs["env_info"])
        env_name = env_kwargs.pop("env_name", None) or str(attrs.get("env"))
    elif "env_args" in attrs:  # robomimic's raw demo*.hdf5
        env_args = json.loads(attrs["env_args"])
        env_name, env_kwargs = env_args["env_name"], dict(env_args["env_kwargs"])
    else:
        raise DatasetError(f"{path} [data]: neither `env_info` nor `env_args` attr; cannot tell which "
                           "env recorded these demos")
    return env_name, env_kwargs, str(attrs.get("repository_version", "unknown"))


def _read_raw_demo(group: h5py.Group, path: str, name: str) -> RawDemo:
    key = "states"
    try:
        for required in ("states", "actions"):
            if required not in group:
                raise DatasetError(f"{path} [data/{name}/{required}]: missing; raw demos need states and actions")
        states = group["states"][()]
        key = "actions"
        actions = group["actions"][()]
    except OSError as e:
        raise DatasetError(f"{path} [data/{name}/{key}]: unreadable ({e}); the file is truncated or corrupt") from e
    if states.ndim != 2 or actions.ndim != 2 or len(states) != len(actions) or len(actions) == 0:
        raise DatasetError(f"{path} [data/{name}]: states {states.shape} and actions {actions.shape} must be "
                           "[T, D] and [T, A] with the same T > 0")
    for key, values in (("states", states), ("actions", actions)):
        if count := nonfinite_count(values):  # clipping keeps NaN, and replaying a NaN state yields NaN obs
            raise DatasetError(f"{path} [data/{name}/{key}]: {count} values; clean or drop this demo")
    model_file = group.attrs.get("model_file")
    if model_file is None:
        raise DatasetError(f"{path} [data/{name}/model_file]: missing attr; the scene XML is needed to replay")
    model_file = model_file.decode() if isinstance(model_file, bytes) else str(model_file)
    if not model_file.lstrip().startswith("<"):
        raise DatasetError(
            f"{path} [data/{name}/model_file]: {model_file!r} is a file name, not the scene's MJCF XML. Demo "
            "files from robosuite < 1.2 keep the scene elsewhere and cannot be replayed with robosuite 1.4; "
            "use demos recorded with robosuite >= 1.2 (e.g. robomimic's demo_v141.hdf5)")
    return RawDemo(name, model_file, states.astype(np.float64), actions)


def _load_scene(env, path: str, demo: RawDemo, version: str) -> None:
    """Rebuild the sim from the demo's XML (asset paths rewritten for this install) at its first state."""
    if demo.actions.shape[1] != env.action_dim:
        raise DatasetError(f"{path} [data/{demo.name}/actions]: action dimension {demo.actions.shape[1]}, but "
                           f"the env built from the file's metadata takes {env.action_dim}; the controller "
                           "config does not match the recorded actions")
    env.reset()
    env.reset_from_xml_string(env.edit_model_xml(demo.model_file))
    env.sim.reset()
    state_dim = env.sim.get_state().flatten().shape[0]
    if demo.states.shape[1] != state_dim:
        raise DatasetError(f"{path} [data/{demo.name}/states]: {demo.states.shape[1]} columns, but this scene's "
                           f"flattened MuJoCo state has {state_dim}; the demos were recorded with robosuite "
                           f"{version}, incompatible with the installed one")
    _set_state(env, demo.states[0])


def _set_state(env, state: np.ndarray) -> dict:
    env.sim.set_state_from_flattened(state)
    env.sim.forward()
    return env._get_observations(force_update=True)


def _clip(actions: np.ndarray) -> np.ndarray:
    # Teleoperation records unclipped device deltas; robosuite's controllers clip inputs to [-1, 1]
    # before use, so clipping here stores the actions the simulator actually executed.
    return np.clip(actions, -1.0, 1.0).astype(np.float32)


def _replay(env, demo: RawDemo) -> ReplayReport:
    """Open-loop replay of the recorded actions from the (already loaded) first state."""
    success, divergence = False, 0.0
    for t, action in enumerate(_clip(demo.actions)):
        env.step(action)
        success = success or bool(env._check_success())
        if t + 1 < len(demo.states):
            divergence = max(divergence, float(np.linalg.norm(demo.states[t + 1] - env.sim.get_state().flatten())))
    return ReplayReport(demo.name, len(demo.actions), success, divergence)


def _replay_without_idle(env, demo: RawDemo, low_dim_keys: tuple[str, ...], rgb_keys: tuple[str, ...],
                         rest_speed: float = REST_SPEED) -> tuple[Episode | None, ReplayReport]:
    """Replay the demo's actions from the (already loaded) first state, skipping idle steps, until success.
    The replay is the episode (None, reported as no success, when every step was idle)."""
    actions = _clip(demo.actions)
    gripper_dims = env.robots[0].gripper.dof  # robosuite puts the gripper command last
    run = Recording(env, low_dim_keys, rgb_keys)
    previous_grip = actions[0, -gripper_dims:]  # teleoperation starts with the gripper as it is
    for action in actions:
        idle = not np.any(action[:-gripper_dims]) and np.array_equal(action[-gripper_dims:], previous_grip)
        previous_grip = action[-gripper_dims:]
        if idle and run.at_rest(rest_speed):
            continue
        if run.step(action):
            break
    return (run.episode(demo.name, demo.model_file),
            ReplayReport(demo.name, len(actions), run.success, float("nan"), kept_steps=run.steps))


def _track_path(env, demo: RawDemo, low_dim_keys: tuple[str, ...], rgb_keys: tuple[str, ...],
                lookahead: float = TRACK_LOOKAHEAD) -> tuple[Episode | None, ReplayReport]:
    """Follow the demo's end-effector path (position and orientation at each recorded state) from its first
    state with the proportional OSC_POSE tracker (tracking.py), switching the gripper command where the demo
    switched it, until success or the demo's own length. The tracked execution is the episode; its actions are
    a smooth function of where the hand is on the path."""
    check_tracker_controller(env, f"data/{demo.name}", "convert without track_path")
    actions = _clip(demo.actions)
    path = [eef_pose(_set_state(env, s)) for s in demo.states]
    _set_state(env, demo.states[0])
    run = Recording(env, low_dim_keys, rgb_keys)
    track_path(run, path, actions[:, -env.robots[0].gripper.dof:], len(actions), lookahead=lookahead)
    return (run.episode(demo.name, demo.model_file),
            ReplayReport(demo.name, len(actions), run.success, float("nan"), kept_steps=run.steps))


def _extract(env, demo: RawDemo, low_dim_keys: tuple[str, ...], rgb_keys: tuple[str, ...]) -> Episode:
    """Observations at every recorded state; reward r(s') and done for each step."""
    T = len(demo.actions)
    actions = _clip(demo.actions)
    obs = [robomimic_obs(_set_state(env, demo.states[0]), low_dim_keys, rgb_keys)]
    rewards, terminals = np.zeros(T, np.float32), np.zeros(T, bool)
    for t in range(T):
        if t + 1 < T:
            raw = _set_state(env, demo.states[t + 1])
        else:  # no recorded state after the last action: play it from the last state
            _set_state(env, demo.states[t])
            raw = env.step(actions[t])[0]
        obs.append(robomimic_obs(raw, low_dim_keys, rgb_keys))
        rewards[t] = env.reward()
        terminals[t] = t == T - 1 or bool(env._check_success())
    return Episode(
        obs={k: np.stack([o[k] for o in obs]) for k in obs[0]},
        actions=actions,
        rewards=rewards,
        terminals=terminals,
        states=demo.states,
        model_file=demo.model_file,
        name=demo.name,
    )
