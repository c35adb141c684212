"""What the offline and online phases share: data sources, builders, evaluation, checkpoint state."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from robo_rl.agents.sorl import SORLAgent, SORLConfig
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.config import ConfigError, check_dataset
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.data.hdf5 import Episode, read_hdf5, write_robomimic
from robo_rl.envs import env_spec, make_vec_env
from robo_rl.envs.spec import EnvSpec
from robo_rl.eval.rollout import evaluate_actors
from robo_rl.nets.encoders import EncoderConfig
from robo_rl.planning.actor import AgentActor
from robo_rl.planning.qwm import QWMConfig, QWMPlanner
from robo_rl.utils.seeding import rng_state, set_rng_state

ACTION_DIM = 7  # OSC_POSE: Δposition, Δaxis-angle, gripper


# -- data sources ------------------------------------------------------------------------------
def offline_episodes(cfg: DictConfig, spec: EnvSpec) -> list[Episode]:
    """Demonstrations to pretrain on: `dataset=PATH` (file or folder of HDF5 files), else the task's
    scripted demos (generated on first use, cached under `demo_cache`), else none (online from scratch)."""
    keys = list(spec.low_dim_keys + spec.rgb_keys)
    if cfg.dataset:
        paths = check_dataset(cfg.dataset, cfg.task)
        instructions = _suite_instructions(spec)
        episodes = []
        for path in paths:
            data = read_hdf5(path, obs_keys=keys, action_dim=ACTION_DIM, normalized_actions=True)
            task_id = _task_of(data.episodes[0].instruction, instructions, path)
            for e in data.episodes:
                e.task_id = task_id
            episodes += data.episodes
        print(f"[data] {len(episodes)} demos ({sum(e.num_steps for e in episodes)} steps) from {cfg.dataset}")
        return [_resize_images(e, spec) for e in episodes]
    if cfg.task.get("expert"):
        return scripted_demos(cfg, spec)
    print(f"[data] no demonstrations for task {cfg.task.name} (pass dataset=PATH to pretrain on a "
          f"Robomimic/LIBERO HDF5 file): starting online from scratch")
    return []


def _resize_images(episode: Episode, spec: EnvSpec) -> Episode:
    """Dataset cameras at another resolution than the env's (LIBERO files are 128 px) are resized
    (area averaging) so that demos and env observations share one shape."""
    for key in spec.rgb_keys:
        images = episode.obs[key]  # [T+1, C, H, W] uint8
        if images.shape[-2:] != (spec.image_size, spec.image_size):
            resized = F.interpolate(torch.from_numpy(images).float(), size=(spec.image_size,) * 2, mode="area")
            episode.obs[key] = resized.round().clamp(0, 255).to(torch.uint8).numpy()
    return episode


def _suite_instructions(spec: EnvSpec) -> list[str] | None:
    if spec.suite != "libero":
        return None
    from robo_rl.envs.libero import task_instructions

    return task_instructions(spec.env_name)


def _task_of(instruction: str | None, instructions: list[str] | None, path: Path) -> int:
    """LIBERO files hold one task each: find its index in the suite by its language instruction."""
    if instructions is None:
        return 0
    normalized = [s.strip().lower() for s in instructions]
    if instruction is None or instruction.strip().lower() not in normalized:
        raise ConfigError(f"dataset {path}: instruction {instruction!r} is not a task of this suite; "
                          f"pass the dataset files of the suite you train on")
    return normalized.index(instruction.strip().lower())


def scripted_demos(cfg: DictConfig, spec: EnvSpec) -> list[Episode]:
    """The task's scripted demos, from the cache or collected now (and cached as robomimic HDF5)."""
    from robo_rl.data.demos import collect_demos

    n = cfg.budget.num_demos
    modality = f"{cfg.env.modality}{spec.image_size if spec.rgb_keys else ''}"
    path = Path(cfg.demo_cache) / f"{cfg.task.name}_{modality}_{n}demos_seed{cfg.seed}.hdf5"
    if not path.exists():
        print(f"[data] collecting {n} scripted {cfg.task.name} demos -> {path}")
        episodes, rate, env_args = collect_demos(spec, cfg.task.expert, n, noise=0.1, seed=cfg.seed,
                                                 num_envs=cfg.env.num_envs)
        print(f"[data] scripted expert success rate {rate:.2f}")
        write_robomimic(path, episodes, env_args, attrs={"expert_success_rate": rate})
    return read_hdf5(path, obs_keys=list(spec.low_dim_keys + spec.rgb_keys), action_dim=ACTION_DIM,
                     normalized_actions=True).episodes


def step_shapes(obs: dict[str, np.ndarray | torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Per-step observation shapes from a batch (or an episode) of observations [N, ...]."""
    return {k: tuple(v.shape[1:]) for k, v in obs.items()}


# -- builders ----------------------------------------------------------------------------------
def agent_config(agent_cfg: DictConfig, compile: bool = False) -> SORLConfig:
    """SORLConfig from the Hydra `agent` group (lists become tuples; unknown keys are an error)."""
    raw = OmegaConf.to_container(agent_cfg, resolve=True)
    raw.pop("name", None)
    encoder = EncoderConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.pop("encoder", {}).items()})
    world_model = WorldModelConfig(**raw.pop("world_model", {}))
    known = {f.name for f in fields(SORLConfig)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown agent options {sorted(unknown)}; SORLConfig has {sorted(known)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return SORLConfig(encoder=encoder, world_model=world_model, compile=compile, **values)


def build_agent(cfg: DictConfig, shapes: dict, num_tasks: int) -> SORLAgent:
    return SORLAgent(shapes, ACTION_DIM, num_tasks, agent_config(cfg.agent, cfg.compile), device=cfg.device)


def build_planner(planner_cfg: DictConfig | None) -> QWMPlanner | None:
    """The search a `planner` group config describes; None for no config or `name: none`."""
    if planner_cfg is None or planner_cfg.name == "none":
        return None
    raw = OmegaConf.to_container(planner_cfg, resolve=True)
    raw.pop("name")
    return QWMPlanner(QWMConfig(**raw))


def build_buffer(cfg: DictConfig, shapes: dict, episodes: list[Episode]) -> ReplayBuffer:
    pin = "cuda" in str(cfg.device)
    buffer = ReplayBuffer(shapes, None, ACTION_DIM, capacity=max(cfg.budget.online_steps, 2 * cfg.env.num_envs) + 1000,
                          num_envs=cfg.env.num_envs, device=cfg.device if pin else "cpu",
                          offline_ratio=cfg.train.offline_ratio, gamma=cfg.train.gamma, seed=cfg.seed)
    if episodes:
        buffer.add_offline(episodes)
    return buffer


def make_actor(cfg: DictConfig, agent: SORLAgent, planner_cfg: DictConfig | None, **kwargs) -> AgentActor:
    """`agent` acting through the search `planner_cfg` describes (None: the policy alone); kwargs
    override the AgentActor settings taken from cfg (agent.sample_steps, agent.best_of_n, seed)."""
    planner = build_planner(planner_cfg)
    if planner is not None and agent.world_model is None:
        raise ValueError("planner=qwm needs an agent with a world model (agent.world_model=true)")
    settings = {"sample_steps": cfg.agent.sample_steps, "best_of_n": cfg.agent.best_of_n, "seed": cfg.seed}
    return AgentActor(agent, planner, **{**settings, **kwargs})


def gradient_step(cfg: DictConfig, agent: SORLAgent, buffer: ReplayBuffer) -> dict[str, float]:
    """One update on an RLPD-mixed batch of real transitions (+ real sub-trajectories for the world model).

    With action chunks of h actions a transition spans h env steps (its return is the h-step one) and a
    world-model step is one chunk, so the model's sub-trajectories are seq_horizon * h env steps long.
    """
    budget, h = cfg.budget, agent.config.action_horizon
    if h == 1:
        batch = buffer.sample(budget.batch_size, nstep=cfg.train.nstep)
    else:
        batch = buffer.sample_chunks(budget.batch_size, h)
    seq = None
    if agent.world_model is not None and buffer.can_sample_sequences(budget.seq_horizon * h):
        seq = buffer.sample_sequences(budget.batch_size, budget.seq_horizon * h)
    return agent.update(batch, seq)


# -- evaluation --------------------------------------------------------------------------------
def evaluate_agent(cfg: DictConfig, agent: SORLAgent, run_dir: Path, tag: str, actors: list[str],
                   episodes: int, videos: int) -> dict:
    """Paired evaluation episodes of the current agent as each of `actors` ("none": the policy alone;
    cfg.planner.name, e.g. "qwm": through the search) in one pass; videos under run_dir/videos/tag.
    Returns evaluate_actors' dict."""
    planners = {"none": None, cfg.planner.name: cfg.planner}
    env = make_vec_env(cfg, render=videos > 0, autoreset=False)
    try:
        result = evaluate_actors(env, {a: make_actor(cfg, agent, planners[a]) for a in actors}, episodes,
                                 seed=10_000 + cfg.seed, video_dir=run_dir / "videos" / tag, num_videos=videos,
                                 wrist_video=True)
    finally:
        env.close()
    for name, r in result["actors"].items():
        lo, hi = r["success_ci"]
        print(f"[eval] {tag} {name}: success {r['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] over {r['episodes']} episodes")
    return result


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


# -- checkpoint state --------------------------------------------------------------------------
def training_state(cfg: DictConfig, agent: SORLAgent, shapes: dict, num_tasks: int, **counters) -> dict:
    return {
        "agent": agent.state_dict(),
        "optimizer": agent.optimizer.state_dict(),
        "rng": rng_state(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "obs_shapes": shapes,
        "num_tasks": num_tasks,
        **counters,
    }


def restore_training_state(agent: SORLAgent, state: dict) -> None:
    agent.load_state_dict(state["agent"])
    agent.optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
