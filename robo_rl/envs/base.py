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

    def sim_state(self) -> np.ndarray:
        """Flattened MuJoCo state (robomimic's `states`)."""
        return self.env.sim.get_state().flatten()

    def render(self, camera: str = "agentview", size: int | None = None) -> np.ndarray:
        """Upright RGB frame [H, W, 3] uint8 for videos."""
        size = size or self.spec.render_size or self.spec.image_size
        frame = self.env.sim.render(camera_name=camera, width=size, height=size)
        return np.ascontiguousarray(frame[::-1])

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
