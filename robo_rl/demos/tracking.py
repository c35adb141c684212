"""Drive a robosuite hand along a path of poses and record what the simulator executes.

`track_path` is a proportional OSC_POSE tracker: each step it aims at the first pose of the path farther than
`lookahead` from the hand, and it switches the gripper command where the path's command switches, once the hand
has reached that point and stopped (or has stopped just short of it and gets no closer). `Recording` keeps the
executed steps as an `Episode`. Used to re-execute human demos smoothly (convert.py, track_path) and to execute
demos moved to new object placements (generate.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from robo_rl.data.hdf5 import DatasetError, Episode
from robo_rl.envs.robosuite import robomimic_obs
from robo_rl.utils.rendering import configure_mujoco

Pose = tuple[np.ndarray, Rotation]  # hand position [3] (m) and orientation, world frame
# retarget(segment, index of its first pose, its poses) -> the poses to follow instead, asked for when the segment
# starts (after the previous gripper switch has settled), so they can depend on where things are then
Retarget = Callable[[int, int, Sequence[Pose]], list[Pose]]

# Joint and finger speeds (rad/s, m/s) below which the robot counts as at rest: a Panda coasting after a
# key press moves its joints at 0.05-0.5, and the rest the human Lift demos pause at is below 0.01.
REST_SPEED = 0.02
SPEED_KEYS = ("robot0_joint_vel", "robot0_gripper_qvel")
# The target is the first point of the path farther than this from the hand, so the hand moves ~5 mm per
# control step (measured on the human Lift demos; a key pulse moves it 6 mm, then it coasts for tens of steps).
TRACK_LOOKAHEAD = 0.02  # m
GRIP_REACH = 0.004  # m: the hand is this close to where the path switches the gripper before it switches
GRIP_SETTLE_SPEED = 0.05  # joint/finger speed below which the hand counts as stopped there
GRIP_HOLD_STEPS = 8  # control steps held still after a switch while the fingers close or open
# A hand that rests this many steps this close to the switch point without reaching GRIP_REACH gets no closer
# (the fingers on a can's rim, a held can on a bin's floor: 2-5 mm short in demos moved to new scenes) and
# switches where it is.
GRIP_STALL_STEPS = 10
GRIP_STALL_REACH = 0.02  # m


def make_recording_env(env_name: str, env_kwargs: dict, low_dim_keys: tuple[str, ...]):
    """A robosuite env with every key of `low_dim_keys` it can compute switched on."""
    configure_mujoco()
    import robosuite

    env = robosuite.make(env_name, **env_kwargs)
    # robosuite 1.4 computes some robomimic keys (robot0_joint_pos) but leaves them switched off.
    for key in low_dim_keys:
        if key in env.observation_names:
            env.modify_observable(observable_name=key, attribute="active", modifier=True)
    return env


def eef_pose(raw: dict) -> Pose:
    return raw["robot0_eef_pos"].copy(), Rotation.from_quat(raw["robot0_eef_quat"])  # robosuite quats are xyzw


class Recording:
    """Real simulator steps from the env's current state, recorded as executed, until success."""

    def __init__(self, env, low_dim_keys: tuple[str, ...], rgb_keys: tuple[str, ...]):
        self.env, self.keys = env, (low_dim_keys, rgb_keys)
        self.raw = env._get_observations(force_update=True)
        self.obs, self.states, self.actions, self.rewards = [robomimic_obs(self.raw, *self.keys)], [], [], []
        self.success = False

    @property
    def steps(self) -> int:
        return len(self.actions)

    def at_rest(self, speed: float) -> bool:
        """Every joint and finger moves slower than `speed` (rad/s, m/s)."""
        return max(np.abs(self.raw[k]).max() for k in SPEED_KEYS) < speed

    def step(self, action: np.ndarray) -> bool:
        """Execute and record one action; True once the task succeeds."""
        self.states.append(self.env.sim.get_state().flatten())
        self.raw = self.env.step(action)[0]
        self.obs.append(robomimic_obs(self.raw, *self.keys))
        self.actions.append(action)
        self.rewards.append(self.env.reward())
        self.success = bool(self.env._check_success())
        return self.success

    def episode(self, name: str | None, model_file: str | None) -> Episode | None:
        """The recorded steps as an episode that ends at its last step (None without steps)."""
        T = self.steps
        if not T:
            return None
        return Episode(
            obs={k: np.stack([o[k] for o in self.obs]) for k in self.obs[0]},
            actions=np.stack(self.actions),
            rewards=np.asarray(self.rewards, np.float32),
            terminals=np.arange(T) == T - 1,  # success ends the recording; else the last step ends it
            states=np.stack(self.states),
            model_file=model_file,
            name=name,
        )


def check_tracker_controller(env, where: str, fix: str) -> None:
    controller = env.robots[0].controller
    if controller.name != "OSC_POSE" or not controller.use_delta:
        raise DatasetError(f"{where}: the path tracker drives the OSC_POSE controller with delta actions; these "
                           f"demos use {controller.name} (delta={controller.use_delta}); {fix}")


def track_path(run: Recording, path: Sequence[Pose], grip: np.ndarray, max_steps: int,
               retarget: Retarget | None = None, lookahead: float = TRACK_LOOKAHEAD, noise: float = 0.0,
               rng: np.random.Generator | None = None) -> None:
    """Drive the hand along `path` [T] with the gripper command `grip` [T, G] of each point, from the env's
    current state, until success or `max_steps` executed steps. The path is split into segments where `grip`
    switches; when a segment starts, `retarget(segment, start, poses)` may replace its poses (None: as given).
    noise: std of Gaussian noise added to the motion commands on the way to each switch point (the hand must come
    to rest there), as the scripted experts add it (recorded as executed), so that demos also show the way back
    to the path from beside it."""
    env = run.env
    controller = env.robots[0].controller
    # action units per metre / radian: OSC_POSE scales its input range onto its output range of motion per step
    gain = np.abs(controller.input_max - controller.input_min) / np.abs(controller.output_max - controller.output_min)
    switches = [t for t in range(1, len(grip)) if not np.array_equal(grip[t], grip[t - 1])] + [len(path) - 1]
    goals = list(path)

    def start_segment(segment: int, start: int) -> None:
        if retarget is not None:
            goals[start:switches[segment] + 1] = retarget(segment, start, path[start:switches[segment] + 1])

    start_segment(0, 0)
    target, segment, command, hold, stalled = 0, 0, grip[0], 0, 0
    while run.steps < max_steps:
        position, rotation = eef_pose(run.raw)
        end = switches[segment]  # the target does not pass the next gripper switch
        while target < end and np.linalg.norm(goals[target][0] - position) < lookahead:
            target += 1
        action = np.zeros(env.action_dim, np.float32)
        goal_position, goal_rotation = goals[target]
        action[:3] = goal_position - position
        action[3:6] = (goal_rotation * rotation.inv()).as_rotvec()  # OSC_POSE applies it in the world frame
        action[:6] = np.clip(action[:6] * gain, -1.0, 1.0)
        at_switch = target == end < len(path) - 1 and run.at_rest(GRIP_SETTLE_SPEED)
        distance = np.linalg.norm(goal_position - position)
        stalled = stalled + 1 if at_switch and distance < GRIP_STALL_REACH else 0
        if at_switch and (distance < GRIP_REACH or stalled >= GRIP_STALL_STEPS):
            command, segment, hold, stalled = grip[end], segment + 1, GRIP_HOLD_STEPS, 0
        if hold:
            action[:6], hold = 0.0, hold - 1
            if not hold:
                start_segment(segment, end)
        if noise and target < end:  # not where the hand must settle for the gripper to switch
            action[:6] = np.clip(action[:6] + noise * rng.standard_normal(6), -1.0, 1.0)
        action[6:] = command
        if run.step(action):
            break
