"""Checkpoints: written atomically (temp file, then rename), so a crash never leaves a torn file.

A checkpoint is a dict: {"step", "phase", "agent", "optimizers", "rng", "config", "obs_shapes",
"action_dim", "num_tasks", ...}. `checkpoints/step_XXXXXXXX.pt` under the run directory; the
newest two are kept. The replay buffer is saved beside it (`buffer.h5` via ReplayBuffer.save).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

KEEP_LAST = 2


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, state: dict) -> Path:
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:08d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(directory.glob("step_*.pt"))[:-KEEP_LAST]:
        old.unlink()
    return path


def latest_checkpoint(path: str | Path) -> Path | None:
    """`path` itself if it is a file, else the newest checkpoint of the run directory (or None)."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(checkpoint_dir(path).glob("step_*.pt"))
    return found[-1] if found else None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path} (expected a .pt file or a run directory "
                                f"with checkpoints/step_*.pt)")
    # weights_only=False: checkpoints hold optimizer state, RNG states and the config (our own files)
    return torch.load(found, map_location=device, weights_only=False)


def agent_from_checkpoint(state: dict, device: str | torch.device = "cpu"):
    """The trained SORLAgent of a checkpoint: architecture from the checkpoint's own config, then its weights."""
    from omegaconf import OmegaConf

    from robo_rl.agents.sorl import SORLAgent
    from robo_rl.train.common import ACTION_DIM, agent_config

    trained = OmegaConf.create(state["config"])
    agent = SORLAgent(state["obs_shapes"], ACTION_DIM, state["num_tasks"], agent_config(trained.agent), device)
    agent.load_state_dict(state["agent"])
    return agent


def actor_from_checkpoint(state: dict, cfg):
    """The checkpoint's agent wrapped for acting as `cfg` says (planner, agent.sample_steps, agent.best_of_n)."""
    from robo_rl.train.common import make_actor

    return make_actor(cfg, agent_from_checkpoint(state, cfg.device), cfg.planner)
