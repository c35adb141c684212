"""Conventions every layer shares: what an observation and an action are. Imports nothing of robo_rl.

Observations are dicts key -> array, batched along the first dim(s):
  low-dim keys     float32 [..., D]          (robomimic or LIBERO names: `object`, `robot0_eef_pos`, `joint_states`)
  image keys       uint8 [..., C, H, W]      channels-first, upright; a key is an image by its suffix
  TASK_KEY         int64 [...]               index of the task in its suite (LIBERO), 0 for single tasks
Actions are [..., ACTION_DIM] float32 in [-1, 1]: robosuite's OSC_POSE controller (Δ position,
Δ axis-angle rotation, gripper), for every env backend and every dataset robo_rl learns from.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

Obs = dict[str, torch.Tensor]  # key -> [B, ...] (or [B, T, ...]) tensor

IMAGE_KEY_SUFFIXES = ("_image", "_rgb")  # robomimic `agentview_image`, LIBERO `agentview_rgb`
TASK_KEY = "task_id"

ACTION_DIM = 7  # OSC_POSE: Δposition (3), Δaxis-angle (3), gripper (1)


def is_image_key(key: str) -> bool:
    return key.endswith(IMAGE_KEY_SUFFIXES)


def obs_shapes(obs: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Per-step observation shapes key -> shape from a batch (or an episode) of observations [N, ...]."""
    return {k: tuple(v.shape[1:]) for k, v in obs.items()}
