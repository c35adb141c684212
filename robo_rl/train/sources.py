"""Where a run's demonstrations come from: `dataset=PATH` files checked against the task, else the task's
scripted demos (collected once, cached as robomimic HDF5), else none (online from scratch)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from robo_rl.core import ACTION_DIM, obs_shapes
from robo_rl.data.hdf5 import (DatasetError, Episode, dataset_files, demo_lengths, iter_hdf5, read_env_args,
                               read_hdf5, write_robomimic)
from robo_rl.demos.collect import collect_demos, collect_libero_demos
from robo_rl.envs.libero import task_instructions, task_of_instruction
from robo_rl.envs.robosuite import RobosuiteEnv
from robo_rl.envs.spec import EnvSpec
from robo_rl.schemas import TrainConfig
from robo_rl.utils.schema import ConfigError

TASK_CONF = Path(__file__).resolve().parents[2] / "conf" / "task"


@dataclass
class Demos:
    """Demonstrations to pretrain on, for `ReplayBuffer.add_offline(demos.episodes, demos.lengths)`.

    From dataset files, `episodes` is a one-pass iterator that reads one demo at a time, its images
    resized to the env's as they are read; the buffer, told the `lengths` in advance, allocates its
    storage once and copies each demo in as it comes. So loading holds about one demo beside the
    buffer, never the dataset twice nor at the files' resolution (LIBERO-10: 14.7 GB of 128 px images;
    benchmarks/libero_memory.py measures it).
    """

    episodes: Iterable[Episode]
    lengths: list[int]  # steps T of each episode, in order
    obs_shapes: dict[str, tuple[int, ...]]  # key -> per-step shape, images (C, H, W) as stored

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def of(cls, episodes: list[Episode]) -> Demos:
        return cls(episodes, [e.num_steps for e in episodes], obs_shapes(episodes[0].obs) if episodes else {})


def offline_episodes(cfg: TrainConfig, spec: EnvSpec) -> Demos:
    """Demonstrations to pretrain on: `dataset=PATH` (file or folder of HDF5 files, read as the buffer
    takes them in), else the task's scripted demos (generated on first use, cached under `demo_cache`),
    else none (online from scratch)."""
    if cfg.dataset:
        paths = check_dataset(cfg.dataset, cfg.task)
        lengths = [T for path in paths for T in demo_lengths(path)]
        print(f"[data] {len(lengths)} demos ({sum(lengths)} steps) from {cfg.dataset}")
        episodes = _read_datasets(paths, spec, cfg.task.horizon)
        first = next(episodes)  # its shapes build the agent and the buffer before the rest is read
        return Demos(chain([first], episodes), lengths, obs_shapes(first.obs))
    if cfg.task.expert:
        return Demos.of(scripted_demos(cfg, spec))
    print(f"[data] no demonstrations for task {cfg.task.name} (pass dataset=PATH to pretrain on a "
          f"Robomimic/LIBERO HDF5 file): starting online from scratch")
    return Demos.of([])


def _read_datasets(paths: list[Path], spec: EnvSpec, horizon: int) -> Iterator[Episode]:
    """The demos of each file, one at a time, images resized to the env's as each is read (LIBERO files
    hold one task each: its id comes from the file's instruction)."""
    keys = list(spec.low_dim_keys + spec.rgb_keys)
    instructions = task_instructions(spec.env_name) if spec.suite == "libero" else None
    for path in paths:
        task_id, rewards = None, []
        for episode in iter_hdf5(path, obs_keys=keys, action_dim=ACTION_DIM, normalized_actions=True,
                                 image_size=spec.image_size if spec.rgb_keys else None):
            if task_id is None:
                task_id = _task_of(episode.instruction, instructions, path)
            episode.task_id = task_id
            rewards.append(episode.rewards)
            yield episode
        check_pace(rewards, horizon, path)


def check_pace(rewards: Iterable[np.ndarray], horizon: int, source) -> None:
    """Warn when demos reach success only after more than `horizon` steps: a policy at their pace cannot
    succeed within an episode (the 3 human Lift demos of robosuite succeed after 380-498 steps; Lift's
    horizon is 200). A warning, not an error: short test horizons (budget=smoke) are deliberate.
    rewards: [T] of each demo; demos without any reward are not judged."""
    steps = [int(r.nonzero()[0][0]) + 1 for r in rewards if r.any()]
    if slow := [s for s in steps if s > horizon]:
        print(f"[data] warning: {len(slow)} of {len(steps)} demos in {source} reach success after more than "
              f"task.horizon={horizon} steps (up to {max(steps)}): episodes end before a policy at their pace "
              f"can succeed; pass task.horizon={int(1.25 * max(steps))}", flush=True)


def scripted_demos(cfg: TrainConfig, spec: EnvSpec) -> list[Episode]:
    """The task's scripted demos, from the cache or collected now and cached: robomimic HDF5, or for a LIBERO
    suite a folder of LIBERO files, `budget.num_demos` demos of each task in one file per task (as the
    official datasets come)."""
    n = cfg.budget.num_demos
    modality = f"{cfg.env.modality}{spec.image_size if spec.rgb_keys else ''}"
    # Within the task's own step limit, not a budget's shorter one (budget=smoke: 50 steps; the LIBERO-Object
    # expert takes ~110): the cache is shared by every budget.
    spec = dataclasses.replace(spec, horizon=_task_horizon(cfg.task.name), shaping_gamma=0.0)  # the cache holds
    # the env's own rewards; a run's shaping is added as they are read (shaped_rewards)
    path = Path(cfg.demo_cache) / f"{cfg.task.name}_{modality}_{n}demos_seed{cfg.seed}.hdf5"
    keys = list(spec.low_dim_keys + spec.rgb_keys)
    if spec.suite == "libero":
        folder = path.with_suffix("")
        print(f"[data] {n} scripted demos of each {cfg.task.name} task (collected if missing) in {folder}")
        files = collect_libero_demos(spec, cfg.task.expert, n, folder, noise=0.1, seed=cfg.seed,
                                     num_envs=cfg.env.num_envs)
        return [e for task_id, file in zip(spec.task_ids, files)
                for e in read_hdf5(file, obs_keys=keys, action_dim=ACTION_DIM, task_id=task_id,
                                   normalized_actions=True).episodes]
    if not path.exists():
        print(f"[data] collecting {n} scripted {cfg.task.name} demos -> {path}")
        episodes, rate, env_args = collect_demos(spec, cfg.task.expert, n, noise=0.1, seed=cfg.seed,
                                                 num_envs=cfg.env.num_envs)
        print(f"[data] scripted expert success rate {rate:.2f}")
        write_robomimic(path, episodes, env_args, attrs={"expert_success_rate": rate})
    return read_hdf5(path, obs_keys=keys, action_dim=ACTION_DIM, normalized_actions=True).episodes


def shaped_rewards(demos: Demos, spec: EnvSpec) -> Demos:
    """The demos with their rewards shaped as the online env shapes its own (`spec.shaping_gamma` = γ):
    r_t + γ·Φ(s_{t+1}) − Φ(s_t), Φ measured on each demo's MuJoCo states, 0 after a terminal step. Demos and
    online transitions must carry the same shaping, or the critic learns two different returns."""
    def shape(episodes: Iterable[Episode]) -> Iterator[Episode]:
        env = RobosuiteEnv(dataclasses.replace(spec, render_size=0))
        try:
            for e in episodes:
                if e.states is None or not e.terminals[-1]:
                    raise DatasetError(f"demo {e.name}: train.reward_shaping needs the MuJoCo `states` of every "
                                       "step and a terminal last step (robomimic `dones`); this demo has "
                                       f"{'no states' if e.states is None else 'no terminal at its end'}; "
                                       "pass train.reward_shaping=false")
                potential = env.progress_at(e.states)  # Φ(s_t) [T]
                following = np.where(e.terminals, 0.0, np.append(potential[1:], 0.0))  # Φ(s_{t+1}) [T]
                shaped = e.rewards + spec.shaping_gamma * following - potential
                yield dataclasses.replace(e, rewards=shaped.astype(np.float32))
        finally:
            env.close()

    return dataclasses.replace(demos, episodes=shape(demos.episodes))


@dataclass
class DemoStart:
    """Where an online episode may start instead of the env's reset (train.demo_resets): a demo's MuJoCo state
    at one of its steps, and the gripper command the demo held there (its previous action's last entry)."""

    state: np.ndarray  # [D] flattened MuJoCo state
    gripper_command: float


def demo_starts(cfg: TrainConfig, spec: EnvSpec) -> list[DemoStart]:
    """Every step t >= 1 of every demo (`dataset=` or the scripted ones) as a DemoStart. Nair et al. 2018
    ("Overcoming exploration with demonstrations") reset to demo states so that sparse-reward episodes
    begin where success is a few steps away; from a handful of demos, episodes from the env's reset alone
    may never succeed. Robosuite tasks only: a state belongs to one scene."""
    if spec.suite != "robosuite":
        raise ConfigError(f"train.demo_resets={cfg.train.demo_resets}: starting episodes from demo states is "
                          f"built for robosuite tasks, not {cfg.task.name} ({spec.suite}); pass train.demo_resets=0")
    if cfg.dataset:
        keys = spec.low_dim_keys[:1]  # the states are what is needed; one small key keeps the read cheap
        episodes = (e for path in check_dataset(cfg.dataset, cfg.task)
                    for e in iter_hdf5(path, obs_keys=keys, action_dim=ACTION_DIM, normalized_actions=True))
    else:
        episodes = scripted_demos(cfg, spec)
    starts = []
    for e in episodes:
        if e.states is None:
            raise DatasetError(f"demo {e.name} of {cfg.dataset or 'the scripted demos'}: no `states`, so episodes "
                               "cannot start from it; "
                               "pass train.demo_resets=0 or use a dataset with MuJoCo states")
        starts += [DemoStart(e.states[t], float(e.actions[t - 1, -1])) for t in range(1, e.num_steps)]
    return starts


def check_dataset(dataset: str | Path, task) -> list[Path]:
    """The HDF5 files `dataset=` names, each checked from its attrs alone to hold demos of `task` (the
    `task` group): LIBERO files for LIBERO suites, robomimic files recorded in the task's robosuite env
    otherwise. `robo_rl/config.py` runs this before a run starts; loading the demos runs it again."""
    try:
        files = dataset_files(dataset)
    except DatasetError as e:  # its message starts with the path
        raise ConfigError(f"dataset={e}") from None
    for path in files:
        fmt, env_args = read_env_args(path)
        recorded = env_args.get("env_name")
        if task.suite == "libero" and fmt != "libero":
            raise ConfigError(f"dataset {path} is a robomimic file of {recorded}, but task={task.name} is a LIBERO "
                              "suite that trains on LIBERO files (one per task); pass those, or "
                              f"{_task_for(recorded)} for this file")
        if task.suite == "robosuite" and fmt == "libero":
            raise ConfigError(f"dataset {path} is a LIBERO file, but task={task.name} is a robosuite task that "
                              f"trains on robomimic files of {task.env_name}; pass a LIBERO task (task=libero_10, "
                              f"libero_spatial, ...) for LIBERO data, or a robomimic {task.env_name} dataset")
        if task.suite == "robosuite" and recorded != task.env_name:
            raise ConfigError(f"dataset {path} was recorded in {recorded}, but task={task.name} runs "
                              f"{task.env_name}: pass {_task_for(recorded)}, or a {task.env_name} dataset")
    return files


def _task_for(env_name: str | None) -> str:
    """`task=<name>` of the robosuite task config (conf/task/) that runs `env_name`."""
    for path in sorted(TASK_CONF.glob("*.yaml")):
        if OmegaConf.load(path).get("env_name") == env_name:
            return f"task={path.stem}"
    return f"the task whose env_name is {env_name}"


def _task_horizon(name: str) -> int:
    """The step limit conf/task/<name>.yaml sets (LIBERO's configs nest it under `task`)."""
    conf = OmegaConf.load(TASK_CONF / f"{name}.yaml")
    return int(conf.task.horizon if "task" in conf else conf.horizon)


def _task_of(instruction: str | None, instructions: list[str] | None, path: Path) -> int:
    """LIBERO files hold one task each: its index in the suite, found by its language instruction."""
    if instructions is None:
        return 0
    task_id = task_of_instruction(instructions, instruction)
    if task_id is None:
        raise ConfigError(f"dataset {path}: instruction {instruction!r} is not a task of this suite; "
                          f"pass the dataset files of the suite you train on")
    return task_id

