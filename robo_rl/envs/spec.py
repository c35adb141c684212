"""What an environment worker needs to build its env: a small picklable description."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

@dataclass(frozen=True)
class EnvSpec:
    """One task family, as an env worker builds it.

    suite:        "robosuite" (Lift, PickPlaceCan, NutAssemblySquare, ToolHang) or "libero".
    env_name:     robosuite env class name, or LIBERO benchmark name (e.g. "libero_10").
    low_dim_keys: float32 observation keys, robomimic names (robosuite) or LIBERO dataset names.
    rgb_keys:     image observation keys; their camera is the key without its suffix.
    task_ids:     LIBERO: tasks of the suite this run uses; env i runs task_ids[i % len(task_ids)].
                  Ids index the whole suite, so `num_tasks` (the task ids an encoder must embed)
                  is max(task_ids) + 1, not len(task_ids).
    render_size:  side of the frames `render()` returns for videos (0: no offscreen renderer
                  unless images are observed).
    shaping_gamma: > 0 adds potential-based shaping to every reward (robosuite tasks): r + γ·Φ(s') − Φ(s),
                  Φ the task's own shaped progress (`RobosuiteEnv.progress`), γ this value (the critic's).
    """

    suite: str
    env_name: str
    low_dim_keys: tuple[str, ...]
    rgb_keys: tuple[str, ...] = ()
    image_size: int = 84
    horizon: int = 300
    robots: str = "Panda"
    task_ids: tuple[int, ...] = (0,)
    render_size: int = 0
    terminate_on_success: bool = True
    shaping_gamma: float = 0.0
    env_kwargs: dict = field(default_factory=dict, hash=False)

    @property
    def num_tasks(self) -> int:
        return max(self.task_ids) + 1

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(camera_of(k) for k in self.rgb_keys)


def camera_of(rgb_key: str) -> str:
    """`agentview_image` -> `agentview`; LIBERO's `eye_in_hand_rgb` -> `robot0_eye_in_hand`."""
    name = rgb_key.removesuffix("_image").removesuffix("_rgb")
    return "robot0_eye_in_hand" if name == "eye_in_hand" else name


def to_channels_first(image_hwc: np.ndarray) -> np.ndarray:
    """Raw MuJoCo render [H, W, C] (OpenGL: bottom row first) -> upright [C, H, W] uint8."""
    return np.ascontiguousarray(image_hwc[::-1].transpose(2, 0, 1))
