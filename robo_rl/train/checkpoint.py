"""Checkpoints: each one a consistent unit of model, optimizer, RNG, counters and replay buffer.

`checkpoints/step_XXXXXXXX.pt` under the run directory holds a dict {"agent", "optimizer", "rng",
"config", "obs_shapes", "num_tasks", "phase", "offline_step", "env_steps"}; an online checkpoint
also names its own replay buffer file, `buffer_XXXXXXXX.h5` beside it, with the buffer's write
counts. Every file is written atomically (temp file, then rename) and the buffer before the
checkpoint that names it, so a crash at any moment leaves the newest complete checkpoint with
exactly its own buffer; files of a torn save are ignored and pruned. The newest two are kept.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from robo_rl.data.buffer import ReplayBuffer

KEEP_LAST = 2


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, state: dict, buffer: ReplayBuffer | None = None) -> Path:
    """Write `state` (and `buffer`, if given) as checkpoint `step`; prune all but the newest KEEP_LAST."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    if buffer is not None:
        name = f"buffer_{step:08d}.h5"
        buffer.save(directory / name)
        state = {**state, "buffer": {"file": name, "write_counts": buffer.write_counts}}
    path = directory / f"step_{step:08d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    _prune(directory)
    return path


def _prune(directory: Path) -> None:
    """Keep the newest KEEP_LAST checkpoints and the buffers they name; drop everything else."""
    checkpoints = sorted(directory.glob("step_*.pt"))
    for old in checkpoints[:-KEEP_LAST]:
        old.unlink()
    kept = {f"buffer_{p.stem.removeprefix('step_')}.h5" for p in checkpoints[-KEEP_LAST:]}
    for stale in directory.glob("buffer_*.h5"):
        if stale.name not in kept:
            stale.unlink()
    for torn in directory.glob("*.tmp*"):  # temp files of a save that a crash interrupted
        torn.unlink()


def load_buffer(run_dir: str | Path, state: dict, device: str | torch.device = "cpu") -> ReplayBuffer:
    """The replay buffer saved with checkpoint `state`, verified to be the one it was saved with."""
    saved = state.get("buffer")
    if saved is None:
        raise ValueError(f"the checkpoint of step {state['offline_step'] + state['env_steps']} in {run_dir} "
                         "has no replay buffer (offline checkpoints have none)")
    path = checkpoint_dir(run_dir) / saved["file"]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: its checkpoint cannot be resumed; delete the run directory "
                                "or its newest step_*.pt to resume from the one before")
    buffer = ReplayBuffer.load(path, device=device)
    if buffer.write_counts != saved["write_counts"]:
        raise ValueError(f"{path} does not match its checkpoint (write counts {buffer.write_counts} vs "
                         f"{saved['write_counts']}); it was not saved with it")
    return buffer


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
