"""What the robosuite-based single envs (robosuite tasks, LIBERO) share: stepping and rendering."""
from __future__ import annotations

import numpy as np

from robo_rl.envs.spec import EnvSpec


class SimEnv:
    """Gym-like single env over a robosuite-style `self.env` (with `.step` and `.sim`).

    Subclasses build `self.env` and define `_obs(raw) -> dict` and `_success() -> bool`.
    `step` returns (obs, reward, terminated, truncated, success); episodes end on success when
    `spec.terminate_on_success`, and are truncated at `spec.horizon` steps.
    """

    spec: EnvSpec

    def step(self, action: np.ndarray):
        raw, reward, _, _ = self.env.step(np.clip(action, -1.0, 1.0))
        self._t += 1
        success = self._success()
        terminated = success and self.spec.terminate_on_success
        truncated = self._t >= self.spec.horizon and not terminated
        return self._obs(raw), float(reward), terminated, truncated, success

    def model_xml(self) -> str:
        """The compiled scene as MJCF (robomimic's and LIBERO's `model_file` attribute)."""
        return self.env.sim.model.get_xml()

    def sim_state(self) -> np.ndarray:
        """Flattened MuJoCo state (robomimic's `states`)."""
        return self.env.sim.get_state().flatten()

    def snapshot(self) -> dict:
        """Everything needed to continue this episode exactly: the MuJoCo state (with the solver's warm
        start) plus what robosuite keeps outside it: the gripper's accumulated command, the OSC orientation
        goal (it persists through steps whose rotation is exactly zero), each observable's sampling clock
        and last value (observations are sampled on a clock of their own, within the control step), and
        the episode's step counter."""
        env = self._robosuite_env
        robot, data = env.robots[0], env.sim.data
        clocks = {name: (o._time_since_last_sample, o._sampled, o._current_delay, np.array(o._current_observed_value))
                  for name, o in env._observables.items()}
        return {"sim": self.sim_state(), "warmstart": np.array(data.qacc_warmstart), "t": self._t,
                "gripper": np.array(robot.gripper.current_action), "goal_ori": np.array(robot.controller.goal_ori),
                "observables": clocks}

    def restore(self, snapshot: dict) -> dict:
        """Continue from a `snapshot()` (of an env of the same task); returns the raw observation."""
        env = self._robosuite_env
        self.set_sim_state(snapshot["sim"])
        env.sim.data.qacc_warmstart[:] = snapshot["warmstart"]
        robot = env.robots[0]
        robot.gripper.current_action = np.array(snapshot["gripper"])
        robot.controller.goal_ori = np.array(snapshot["goal_ori"])
        for name, (elapsed, sampled, delay, value) in snapshot["observables"].items():
            o = env._observables[name]
            o._time_since_last_sample, o._sampled, o._current_delay = elapsed, sampled, delay
            o._current_observed_value = np.array(value)
        self._t = int(snapshot["t"])
        return env._get_observations()

    def set_sim_state(self, state: np.ndarray) -> dict:
        """Set the flattened MuJoCo state and re-observe; returns the raw observation."""
        env = self._robosuite_env
        env.sim.set_state_from_flattened(np.asarray(state))
        env.sim.forward()
        # The controller caches the arm's pose and refreshes it only when flagged: without this its
        # next goal would be relative to the pose before the state was set (a centimetre-scale jump).
        env.robots[0].controller.new_update = True
        return env._get_observations(force_update=True)

    def start_mid_demo(self, state: np.ndarray, gripper_command: float) -> dict:
        """Begin an episode at a state recorded mid-demonstration; returns the raw observation.

        Besides the MuJoCo state this sets what robosuite keeps outside it: the gripper's command, which
        robosuite integrates step by step (fingers closed on a cube would otherwise reopen toward the
        reset's command), to where holding `gripper_command` leads; and the arm controller's goal, to
        the pose the state puts the arm in (else the first zero-rotation step turns the hand back).
        """
        raw = self.set_sim_state(state)
        robot = self._robosuite_env.robots[0]
        held, command = None, np.array([gripper_command])
        for _ in range(1000):  # robosuite's Panda gripper moves its command 0.01 per call: ~200 calls saturate it
            if held is not None and np.array_equal(held, robot.gripper.current_action):
                break
            held = np.array(robot.gripper.current_action)
            robot.gripper.format_action(command)
        robot.controller.update(force=True)
        robot.controller.reset_goal()
        return raw

    @property
    def _robosuite_env(self):
        """The robosuite environment object (LIBERO wraps one)."""
        return getattr(self.env, "env", self.env)

    def render(self, camera: str = "agentview", size: int | None = None) -> np.ndarray:
        """Upright RGB frame [H, W, 3] uint8 for videos."""
        size = size or self.spec.render_size or self.spec.image_size
        frame = self.env.sim.render(camera_name=camera, width=size, height=size)
        return np.ascontiguousarray(frame[::-1])

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
