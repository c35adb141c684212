"""Checkpoints, and the agent, planner and actor that a config or a checkpoint describes.

Training and evaluation build through this one module, so an agent rebuilt from a checkpoint is built
the way the run that trained it built it (robomimic's `policy_from_checkpoint` idea):

    build_agent(cfg.agent, obs_shapes, num_tasks, device)   SORLAgent from the `agent` group (+ instruction embeddings)
    build_planner(cfg.planner, gamma)                       QWM search from the `planner` group (None for `none`)
    build_actor(agent, cfg.planner, gamma, seed)            the agent acting, through the search or alone
    agent_from_checkpoint(state) / actor_from_checkpoint(state, cfg)   the same from a checkpoint's own config

The search discounts with the critic's discount, `train.gamma` (of the run, or of the checkpoint's config).

A checkpoint, `checkpoints/step_XXXXXXXX.pt` under the run directory, is the dict `training_state` makes:
    {"agent", "optimizer", "rng", "config", "obs_shapes", "num_tasks", "phase", "offline_step", "env_steps",
     "lost_steps"}
and an online checkpoint also {"buffer": {"file": "buffer_XXXXXXXX.h5", "write_counts": [...]}}: its own
replay buffer, saved beside it; one written when a signal stopped the run also holds "continuation", the
episodes in progress a resumed run carries on (robo_rl/train/online.py). Every file is written atomically (temp file, then rename) and the buffer
before the checkpoint that names it, so a crash at any moment leaves the newest complete checkpoint with
exactly its own buffer; files of a torn save are ignored and pruned. The newest two are kept.

Every online point of the learning curve (`budget.eval_every`, and the final evaluation) also keeps the agent
it evaluated, `checkpoints/curve/step_XXXXXXXX.pt`, never pruned: `agent_snapshot`'s keys {"agent", "config",
"obs_shapes", "num_tasks", "phase", "offline_step", "env_steps"}, without the optimizer and RNG states only
resuming needs (0.4 of the size: 14 MB at budget=cpu_long on Can). `evaluate.py checkpoint=<that file>
compare=[...]` evaluates any point of a run again, on as many paired episodes as it takes
(`scripts/plot_evals.py` draws such evaluations).

Checkpoints are safe to open: they hold only tensors and plain Python values (numpy arrays of RNG states and
simulator snapshots travel as tensors, `_to_safe`), so `torch.load(weights_only=True)` reads them and a file
someone sends you cannot run code. `read_checkpoint` refuses, in one line, a file that is truncated or corrupt,
not a robo_rl checkpoint, or written before this format (`scripts/upgrade_checkpoint.py` converts those).
"""
from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl.agents.sorl import SORLAgent, SORLConfig
from robo_rl.core import ACTION_DIM
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.planning.actor import AgentActor
from robo_rl.planning.qwm import QWMConfig, QWMPlanner
from robo_rl.utils.schema import ConfigError, from_dict, to_plain
from robo_rl.utils.seeding import rng_state, set_rng_state

KEEP_LAST = 2
SNAPSHOT_KEYS = ("agent", "config", "obs_shapes", "num_tasks", "phase", "offline_step", "env_steps")
NDARRAY = "__ndarray__"  # marks a numpy array stored as a tensor (`_to_safe`)
CURVE_DIR = "curve"  # under checkpoints/: the agents the learning curve's points evaluated
# Agent settings that change how a trained agent acts, not its weights: evaluate.py may override them.
ACTING_SETTINGS = ("sample_steps", "best_of_n", "execute_steps")


# -- building from config groups ---------------------------------------------------------------
def _group(node: Any) -> dict:
    """A config group (typed, OmegaConf or a dict) as a plain dict without its `name`."""
    raw = to_plain(node)
    raw.pop("name", None)
    return raw


def agent_settings(agent_cfg: Any, compile: bool = False) -> SORLConfig:
    """SORLConfig of an `agent` group (typed and range-checked); `compile` is the top-level `compile=`."""
    raw = _group(agent_cfg)
    if raw.pop("compile", False):  # a typed agent group holds SORLConfig's compile=False
        raise ConfigError("agent.compile: torch.compile is the top-level setting `compile=`; remove agent.compile")
    return from_dict(SORLConfig, {**raw, "compile": compile}, "agent")


def build_agent(agent_cfg: Any, obs_shapes: dict[str, tuple[int, ...]], num_tasks: int,
                device: str | torch.device = "cpu", compile: bool = False,
                instruction_embeddings: torch.Tensor | None = None) -> SORLAgent:
    """The SORLAgent an `agent` group describes, for observations `obs_shapes` and task ids < num_tasks.

    instruction_embeddings [num_tasks, D]: the fixed table of an `agent.encoder.task=language` agent (row t:
    task t's instruction); None leaves it for a checkpoint's state_dict to fill.
    """
    agent = SORLAgent(obs_shapes, ACTION_DIM, num_tasks, agent_settings(agent_cfg, compile), device=device)
    if instruction_embeddings is not None:
        agent.set_instruction_embeddings(instruction_embeddings)
    return agent


def build_planner(planner_cfg: Any, gamma: float) -> QWMPlanner | None:
    """The search a `planner` group describes (typed, OmegaConf or a dict), discounting by `gamma` (the critic's,
    train.gamma); None for no group or `name: none`."""
    if planner_cfg is None:
        return None
    settings = to_plain(planner_cfg)
    if settings.pop("name") == "none":
        return None
    return QWMPlanner(from_dict(QWMConfig, settings, "planner"), gamma)


def build_actor(agent: SORLAgent, planner_cfg: Any, gamma: float, seed: int,
                best_of_n: int | None = None, param_noise_std: float = 0.0, num_groups: int = 1) -> AgentActor:
    """`agent` acting through the search `planner_cfg` describes (None or `none`: the policy alone).

    The policy samples with the agent's `sample_steps`; best_of_n defaults to the agent's `best_of_n`.
    """
    planner = build_planner(planner_cfg, gamma)
    if planner is not None and agent.world_model is None:
        raise ValueError("planner=qwm needs an agent with a world model (agent.world_model=true)")
    return AgentActor(agent, planner, best_of_n=best_of_n, param_noise_std=param_noise_std,
                      num_groups=num_groups, seed=seed)


# -- checkpoint files --------------------------------------------------------------------------
def agent_snapshot(cfg: Any, agent: SORLAgent, phase: str, offline_step: int, env_steps: int) -> dict:
    """What rebuilds and evaluates the agent (a curve checkpoint, module docstring): weights, config, counters."""
    return {
        "agent": agent.state_dict(),
        "config": to_plain(cfg),
        "obs_shapes": agent.encoder.obs_shapes,
        "num_tasks": agent.encoder.num_tasks,
        "phase": phase,
        "offline_step": offline_step,
        "env_steps": env_steps,
    }


def training_state(cfg: Any, agent: SORLAgent, phase: str, offline_step: int, env_steps: int) -> dict:
    """What a checkpoint holds (module docstring): everything to resume `phase` ("offline" | "online")."""
    return {**agent_snapshot(cfg, agent, phase, offline_step, env_steps),
            "optimizer": agent.optimizer.state_dict(), "rng": rng_state()}


def restore_training_state(agent: SORLAgent, state: dict) -> None:
    """Weights, optimizer and RNG states of checkpoint `state` into `agent` (built as the checkpoint's was)."""
    agent.load_state_dict(state["agent"])
    agent.optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


class CheckpointWriteError(OSError):
    """A checkpoint or its replay buffer could not be written (a full disk, an I/O error); the message names the
    file, the space free and the space a checkpoint takes."""


def save_checkpoint(run_dir: str | Path, step: int, state: dict, buffer: ReplayBuffer | None = None) -> Path:
    """Write `state` (and `buffer`, if given) as checkpoint `step`, keeping the newest KEEP_LAST.

    The older ones go first, all but the newest, which stays whole until this one has landed: at most KEEP_LAST
    checkpoints take disk space at any moment. A write that fails (OSError: ENOSPC, EIO, ...) removes its own
    partial files and raises CheckpointWriteError; the newest complete checkpoint and its buffer stay usable.
    """
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:08d}.pt"
    _prune(directory, KEEP_LAST - 1)
    name = _buffer_name(path) if buffer is not None else None
    writing = path
    try:
        if buffer is not None:
            writing = directory / name
            buffer.save(writing)
            state = {**state, "buffer": {"file": name, "write_counts": buffer.write_counts}}
        writing = path
        _save_atomically(state, path)
    except OSError as e:
        if name and not path.exists():  # a buffer no checkpoint names (a checkpoint of this step names its own)
            (directory / name).unlink(missing_ok=True)
        kept = sorted(directory.glob("step_*.pt"))
        free = shutil.disk_usage(directory).free
        raise CheckpointWriteError(
            e.errno, f"could not write {writing} "
            f"({os.strerror(e.errno) if e.errno else e}): {_megabytes(free)} free "
            f"there, a checkpoint of this run takes {_megabytes(_pair_size(kept[-1]) if kept else None)}; "
            f"{kept[-1].name if kept else 'no earlier checkpoint'} is intact: free space, then resume=true "
            f"continues from it") from None
    return path


def checkpoint_size(agent: SORLAgent, buffer: ReplayBuffer | None) -> int:
    """Bytes a checkpoint of `agent` (weights, Adam's two moments) and `buffer` (all its slots filled) takes, at most."""
    weights = sum(t.numel() * t.element_size() for t in agent.state_dict().values())
    return 3 * weights + (buffer.nbytes if buffer is not None else 0)


def check_room_for_checkpoints(run_dir: str | Path, size: int) -> None:
    """CheckpointWriteError unless run_dir's disk holds KEEP_LAST checkpoints of `size` bytes beside the ones it
    holds already (a run refuses to start where its checkpoints could not be written)."""
    directory = checkpoint_dir(run_dir)
    held = sum(f.stat().st_size for f in directory.glob("*") if f.is_file()) if directory.exists() else 0
    free = shutil.disk_usage(Path(run_dir)).free
    if free + held < KEEP_LAST * size:
        raise CheckpointWriteError(
            errno.ENOSPC, f"hydra.run.dir={run_dir}: {_megabytes(free)} free on its disk, but the run keeps "
            f"{KEEP_LAST} checkpoints of up to {_megabytes(size)} each (weights, optimizer and the replay buffer); "
            "free space or pass a hydra.run.dir on a disk with room")


def _pair_size(checkpoint: Path) -> int:
    """Bytes of a checkpoint file and the buffer file it names."""
    buffer = checkpoint.with_name(_buffer_name(checkpoint))
    return checkpoint.stat().st_size + (buffer.stat().st_size if buffer.exists() else 0)


def _megabytes(size: int | None) -> str:
    return "an unknown size" if size is None else f"{size / 2**20:,.1f} MB"


def save_curve_checkpoint(run_dir: str | Path, step: int, snapshot: dict) -> Path:
    """Keep `snapshot` (agent_snapshot) as checkpoints/curve/step_<step>.pt, written atomically, never pruned."""
    directory = checkpoint_dir(run_dir) / CURVE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:08d}.pt"
    _save_atomically(snapshot, path)
    return path


def _save_atomically(state: dict, path: Path) -> None:
    """torch.save to a temp file, then rename: a crash leaves the old file or none, never a torn one, and a write
    that fails leaves no temp file behind."""
    tmp = path.with_suffix(".pt.tmp")
    data = io.BytesIO()
    torch.save(_to_safe(state), data)  # in memory first: torch's own file writer turns a failed write (ENOSPC) into a
    try:                     # RuntimeError without its errno; Python's write raises the OSError itself
        with tmp.open("wb") as f:
            f.write(data.getbuffer())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _buffer_name(checkpoint: Path) -> str:
    """The replay buffer file saved with checkpoint `step_N.pt`: `buffer_N.h5`."""
    return f"buffer_{checkpoint.stem.removeprefix('step_')}.h5"


def _prune(directory: Path, keep: int = KEEP_LAST) -> None:
    """Keep the newest `keep` checkpoints and the buffers they name; drop everything else."""
    checkpoints = sorted(directory.glob("step_*.pt"))
    for old in checkpoints[:-keep]:
        old.unlink()
    kept = {_buffer_name(p) for p in checkpoints[-keep:]}
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


def check_resume(resume: bool | str, run_dir: str | Path) -> None:
    """ConfigError where `resume` and what run_dir holds disagree: resume=true needs a checkpoint there, a fresh
    run (resume=false) a directory without one (it would mix its checkpoints and metrics with the old run's)."""
    found = latest_checkpoint(run_dir)
    if resume is True and found is None:
        raise ConfigError(f"resume=true: no checkpoint in hydra.run.dir={run_dir}; pass the directory of the run to "
                          "continue, or resume=auto to resume one if it is there and start fresh if not")
    if resume is False and found is not None:
        raise ConfigError(f"hydra.run.dir={run_dir} already holds a run ({found.name}): pass resume=true to "
                          "continue it, or a new hydra.run.dir")


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    """The checkpoint at `path` (a .pt file, or a run directory's newest), read safely (`read_checkpoint`)."""
    found = latest_checkpoint(path)
    if found is None:
        raise ConfigError(f"checkpoint={path}: no checkpoint there; pass a step_*.pt file or a run directory "
                          "with checkpoints/step_*.pt")
    return read_checkpoint(found, device)


def read_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    """A checkpoint file's dict, loaded with weights_only=True (tensors and plain values only: opening it runs no
    code). ConfigError, in one line naming the file, for one that is truncated or corrupt, not a robo_rl
    checkpoint, or written before checkpoints were safe to open."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e):
            raise ConfigError(f"checkpoint={path}: not readable as a torch file; it is corrupt, or not a "
                              "checkpoint") from None
        raise ConfigError(f"checkpoint={path}: written by an older robo_rl, with pickled numpy state that a safe "
                          "load refuses; if you trust the file, convert it once: python scripts/upgrade_checkpoint.py "
                          f"{path}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise ConfigError(f"checkpoint={path}: not readable ({_first_line(e)}); it is truncated or corrupt (a copy "
                          "that did not finish?), or not a checkpoint") from None
    missing = [k for k in SNAPSHOT_KEYS if k not in state] if isinstance(state, dict) else list(SNAPSHOT_KEYS)
    if missing:
        raise ConfigError(f"checkpoint={path}: not a robo_rl checkpoint (no {', '.join(missing)}); pass a "
                          "checkpoints/step_*.pt that train_qwm.py or pretrain_offline.py wrote")
    return _from_safe(state)


def _first_line(error: BaseException) -> str:
    """The error's first sentence (torch's zip reader appends a paragraph of advice)."""
    return (str(error).strip().split(". ")[0].splitlines() or [type(error).__name__])[0][:120]


def _to_safe(value):
    """`value` with numpy arrays as {NDARRAY: tensor} and numpy scalars as Python ones (recursively through dicts,
    lists, tuples): what torch.load(weights_only=True) reads back. Containers holding no numpy stay the same
    objects (a state_dict keeps its type and metadata)."""
    if isinstance(value, np.ndarray):
        return {NDARRAY: torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, np.generic):
        return value.item()
    return _map_container(value, _to_safe)


def _from_safe(value):
    """The inverse of `_to_safe`."""
    if isinstance(value, dict) and value.keys() == {NDARRAY}:
        return value[NDARRAY].cpu().numpy()
    return _map_container(value, _from_safe)


def _map_container(value, fn):
    """fn over a dict's values or a list's / tuple's items; `value` itself when fn changed none of them."""
    if isinstance(value, dict):
        mapped = {k: fn(v) for k, v in value.items()}
        return value if all(mapped[k] is v for k, v in value.items()) else mapped
    if isinstance(value, (list, tuple)):
        mapped = [fn(v) for v in value]
        return value if all(m is v for m, v in zip(mapped, value)) else type(value)(mapped)
    return value


def upgrade_checkpoint(path: str | Path) -> None:
    """Rewrite an older robo_rl checkpoint (pickled numpy state) in the safe format, in place. Unpickles it:
    only for files you trust."""
    _save_atomically(torch.load(path, map_location="cpu", weights_only=False), Path(path))
    read_checkpoint(path)  # the rewritten file opens safely


# -- rebuilding from a checkpoint ----------------------------------------------------------------
def agent_from_checkpoint(state: dict, device: str | torch.device = "cpu",
                          acting: Mapping[str, object] | None = None) -> SORLAgent:
    """The trained SORLAgent of a checkpoint: architecture from the checkpoint's own config, then its
    weights (with the instruction embeddings of a language-conditioned agent: no text model needed).
    `acting` overrides the ACTING_SETTINGS (sample_steps, best_of_n, execute_steps) it acts with."""
    agent = build_agent({**state["config"]["agent"], **(acting or {})}, state["obs_shapes"], state["num_tasks"], device)
    agent.load_state_dict(state["agent"])
    return agent


def actor_from_checkpoint(state: dict, cfg: Any, **actor_kwargs) -> AgentActor:
    """The checkpoint's agent acting as `cfg` says: through `cfg.planner` (discounted by the checkpoint's
    train.gamma), with cfg.agent's acting settings (sample_steps, best_of_n, execute_steps), seeded by cfg.seed."""
    agent = agent_from_checkpoint(state, cfg.device, {k: getattr(cfg.agent, k) for k in ACTING_SETTINGS})
    return build_actor(agent, cfg.planner, state["config"]["train"]["gamma"], cfg.seed, **actor_kwargs)
