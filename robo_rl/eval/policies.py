"""Non-learned policies for evaluation: uniform random actions (the scripted experts: robo_rl/demos/experts.py)."""
from __future__ import annotations

import numpy as np
import torch


class RandomPolicy:
    """Uniform actions in [-1, 1]^A."""

    def __init__(self, num_envs: int, action_dim: int, seed: int = 0):
        self.shape = (num_envs, action_dim)
        self.rng = np.random.default_rng(seed)

    def act(self, obs: dict[str, torch.Tensor]) -> np.ndarray:
        return self.rng.uniform(-1.0, 1.0, self.shape).astype(np.float32)
