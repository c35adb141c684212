"""The typed configs: one dataclass per config group and per script, the object a validated config travels as.

Each annotation gives a key's type (`Literal` for a fixed set of choices) and each `__post_init__` the allowed
ranges, in messages that start with the key's name (`num_envs=0: must be >= 1`; the validator prefixes the
group). The agent and planner groups are the dataclasses their consumers are built from (SORLConfig, QWMConfig)
plus the group's `name`, so their keys' types, ranges and defaults are stated once, where they are used.
`robo_rl/config.py` builds them from a script's composed Hydra config (`validate`) and hands them to the run:
`run(TrainConfig, ...)`, `run_evaluation(EvaluateConfig, ...)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from robo_rl.agents.sorl import SORLConfig, check_execute_steps
from robo_rl.planning.qwm import QWMConfig


# -- one per group --------------------------------------------------------------------
def _at_least(obj: Any, low: float, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < low:
            raise ValueError(f"{name}={getattr(obj, name)}: must be >= {low}")


def _fractions(obj: Any, *names: str) -> None:
    for name in names:
        if not 0.0 <= getattr(obj, name) <= 1.0:
            raise ValueError(f"{name}={getattr(obj, name)}: must lie in [0, 1]")


@dataclass
class ObsKeys:
    low_dim: tuple[str, ...]
    rgb: tuple[str, ...]


@dataclass
class TaskConfig:
    name: str
    suite: Literal["robosuite", "libero"]
    env_name: str
    horizon: int
    task_ids: tuple[int, ...] | None  # None: every task of a LIBERO suite
    expert: str | None
    obs_keys: dict[str, ObsKeys]  # modality -> keys
    object_symmetry: int = 1  # turns about its z axis that leave the handled object looking alike (0: any)

    def __post_init__(self):
        _at_least(self, 1, "horizon")
        _at_least(self, 0, "object_symmetry")


@dataclass
class EnvConfig:
    modality: str
    backend: Literal["subprocess", "sync", "warp", "ray"]
    num_envs: int
    image_size: int
    render_size: int  # 0: no video renderer
    step_timeout: float
    runners: int = 2  # backend=ray: Ray actors the envs are spread over (env i in runner i mod runners)
    runner_cpus: float = 1.0  # backend=ray: CPUs each runner reserves, so Ray places runners on free cores
    inline_envs: int = 1  # backend=subprocess: envs stepped in the main process while the workers step

    def __post_init__(self):
        _at_least(self, 1, "num_envs", "image_size", "runners")
        _at_least(self, 0, "inline_envs")
        if self.inline_envs > self.num_envs:
            raise ValueError(f"inline_envs={self.inline_envs}: at most num_envs={self.num_envs}")
        if not self.runner_cpus > 0:
            raise ValueError(f"runner_cpus={self.runner_cpus}: must be > 0")
        _at_least(self, 0, "render_size")
        if not self.step_timeout > 0:
            raise ValueError(f"step_timeout={self.step_timeout}: must be > 0 seconds")


@dataclass
class BudgetConfig:
    name: str
    num_demos: int
    offline_steps: int
    online_steps: int
    eval_episodes: int
    eval_every: int  # 0: evaluate only at the end
    checkpoint_every: int
    log_every: int
    batch_size: int
    utd: float
    seq_horizon: int
    offline_eval_every: int = 0  # offline gradient steps between evaluations of the policy alone (0: none)

    def __post_init__(self):
        _at_least(self, 0, "offline_steps", "online_steps", "eval_every", "offline_eval_every")
        _at_least(self, 1, "num_demos", "eval_episodes", "checkpoint_every", "log_every", "batch_size", "seq_horizon")
        if not self.utd > 0:
            raise ValueError(f"utd={self.utd}: must be > 0 (gradient updates per env step)")


@dataclass
class AgentConfig(SORLConfig):
    name: Literal["sorl"] = "sorl"


@dataclass(frozen=True)  # as QWMConfig
class PlannerConfig(QWMConfig):
    name: Literal["qwm", "none"] = "qwm"


@dataclass
class LoggerConfig:
    project: str
    mode: Literal["offline", "online", "disabled"]
    entity: str | None


@dataclass
class LearnerConfig:  # the `train:` group of config.yaml
    offline_ratio: float
    gamma: float
    nstep: int
    demo_resets: float
    overlap: bool
    reward_shaping: bool

    def __post_init__(self):
        _fractions(self, "offline_ratio", "gamma", "demo_resets")
        _at_least(self, 1, "nstep")


@dataclass
class DemoGenerationConfig:  # the `demos:` group of config.yaml
    generate: int  # demos generated from dataset='s few before training (robo_rl/train/generated.py); 0: none

    def __post_init__(self):
        _at_least(self, 0, "generate")


def _check_threads(threads: int | str) -> None:
    if threads != "auto" and threads < 1:
        raise ValueError(f"threads={threads}: must be >= 1, or auto (robo_rl/utils/threads.py)")


def _check_device(device: str) -> None:
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device={device}: not a device robo_rl runs on; use device=cpu or device=cuda")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device}: torch {torch.__version__} sees no CUDA GPU here; use device=cpu, "
                         "or run where a GPU is visible")


def _check_modality(env: EnvConfig, task: TaskConfig) -> None:
    if env.modality not in task.obs_keys:
        raise ValueError(f"env.modality={env.modality}: task {task.name} defines observations for "
                         f"{sorted(task.obs_keys)} only; pick one of those")


@dataclass
class TrainConfig:  # conf/config.yaml, conf/pretrain_offline.yaml
    env: EnvConfig
    task: TaskConfig
    agent: AgentConfig
    budget: BudgetConfig
    planner: PlannerConfig
    logger: LoggerConfig
    seed: int
    device: str
    compile: bool
    dataset: str | None
    demos: DemoGenerationConfig
    demo_cache: str
    resume: bool | Literal["auto"]  # auto: resume the run directory's run if it holds one, else start fresh
    train: LearnerConfig
    explore: Literal["none", "param_noise"]
    param_noise_std: float
    threads: int | Literal["auto"]  # torch intra-op threads (robo_rl/utils/threads.py)

    def __post_init__(self):
        _check_device(self.device)
        _check_threads(self.threads)
        _check_modality(self.env, self.task)
        _at_least(self, 0, "param_noise_std")
        if self.planner.name == "qwm" and not self.agent.world_model.enabled:
            raise ValueError("planner=qwm searches with the world model: set agent.world_model.enabled=true "
                             "or use planner=none")
        if self.agent.encoder.task == "language" and self.task.suite != "libero":
            raise ValueError(f"agent.encoder.task=language: task {self.task.name} has no language instructions "
                             "(LIBERO suites do); use agent.encoder.task=index")
        if self.train.reward_shaping and (self.task.suite != "robosuite" or self.env.backend == "warp"):
            raise ValueError(f"train.reward_shaping=true: the shaped progress comes from robosuite's own reward "
                             f"functions, which task {self.task.name} on env.backend={self.env.backend} does not "
                             "run; use a robosuite task (lift, can, square) on subprocess, sync or ray envs, or "
                             "train.reward_shaping=false")
        if self.train.reward_shaping and self.planner.name == "qwm" and not self.agent.world_model.reward:
            raise ValueError("train.reward_shaping=true pays a reward at every step, but without a reward head "
                             "QWM's imagined paths count none (it assumes reward only at the success that ends an "
                             "episode); set agent.world_model.reward=true so the world model learns r̂, or planner=none")
        if self.agent.action_horizon > 1 and self.train.nstep != 1:
            raise ValueError(f"train.nstep={self.train.nstep} with agent.action_horizon={self.agent.action_horizon}: "
                             "a chunk's TD target is the h-step return of its own actions, n-step returns over "
                             "chunks are not implemented; pass train.nstep=1 with chunks")
        check_execute_steps(self.agent.execute_steps, self.agent.action_horizon)
        if self.demos.generate:
            _check_generation(self)


def _check_generation(cfg: TrainConfig) -> None:
    """What demos.generate needs of the rest of the config (the file itself: robo_rl/train/generated.py)."""
    if not cfg.dataset:
        raise ValueError(f"demos.generate={cfg.demos.generate} makes demos from the few in a dataset file: pass "
                         "dataset=FILE (raw robosuite demos or a robomimic dataset of the task), or demos.generate=0")
    if cfg.task.suite != "robosuite":
        raise ValueError(f"demos.generate={cfg.demos.generate}: generation moves hand paths with the object in "
                         f"robosuite's pick-and-place tasks (lift, can, square), not {cfg.task.name}; pass "
                         "demos.generate=0")
    if cfg.env.modality != "state":
        raise ValueError(f"demos.generate={cfg.demos.generate} with env={cfg.env.modality}: generated demos record "
                         "low-dim observations only; pass env=state")


@dataclass
class EvaluateConfig:  # conf/evaluate.yaml
    env: EnvConfig
    task: TaskConfig
    agent: AgentConfig  # with a checkpoint only its acting settings (sample_steps, best_of_n, execute_steps) apply
    planner: PlannerConfig
    logger: LoggerConfig
    policy: Literal["random", "scripted", "checkpoint"]
    checkpoint: str | None
    compare: tuple[Literal["none", "guard", "best_of_n", "qwm"], ...] | None
    episodes: int
    episodes_per_task: int  # LIBERO suites: the protocol's episodes per task, episode j from init state j
    videos: int
    wrist_video: bool
    seed: int
    device: str
    compile: bool
    threads: int | Literal["auto"]

    def __post_init__(self):
        _check_device(self.device)
        _check_threads(self.threads)
        _check_modality(self.env, self.task)
        _at_least(self, 1, "episodes", "episodes_per_task")
        _at_least(self, 0, "videos")
        if self.compare and not self.checkpoint:
            raise ValueError("compare=[...] compares actors of a trained agent: pass checkpoint=PATH")
        if self.policy == "checkpoint" and not self.checkpoint:
            raise ValueError("policy=checkpoint needs checkpoint=PATH (a .pt file or a run directory)")


@dataclass
class CollectDemosConfig:  # conf/collect_demos.yaml
    env: EnvConfig
    task: TaskConfig
    agent: AgentConfig  # not read: there only for the agent settings LIBERO task configs make
    num_demos: int
    output: str | None
    noise: float
    seed: int
    keep_failures: bool

    def __post_init__(self):
        _check_modality(self.env, self.task)
        _at_least(self, 1, "num_demos")
        _at_least(self, 0, "noise")
        if not self.output:
            raise ValueError("output=None: collect_demos.py writes the demos to output=PATH.hdf5 (LIBERO suites: "
                             "output=DIR, one file per task); pass one")
        if not self.task.expert:
            raise ValueError(f"task.expert=None: task {self.task.name} has no scripted expert; "
                             "scripted demos exist for task=lift, can, square and libero_object")
        if self.keep_failures and self.task.suite == "libero":
            raise ValueError(f"keep_failures=true: task={self.task.name} writes LIBERO demo files, which keep "
                             "successful demos only; use a robosuite task (lift, can, square) or drop the flag")


@dataclass
class ConvertConfig:  # conf/convert_robosuite.yaml
    input: str
    output: str
    cameras: tuple[str, ...]
    image_size: int
    valid_fraction: float
    drop_idle: bool
    track_path: bool

    def __post_init__(self):
        _at_least(self, 1, "image_size")
        _fractions(self, "valid_fraction")
        if self.drop_idle and self.track_path:
            raise ValueError("track_path=true with drop_idle=true: each records a different re-execution of the "
                             "demos; set one of them")


@dataclass
class GenerateDemosConfig:  # conf/generate_demos.yaml
    task: TaskConfig
    source: str
    output: str
    num_demos: int
    max_attempts: int | None
    noise: float
    seed: int
    valid_fraction: float

    def __post_init__(self):
        _at_least(self, 1, "num_demos")
        _at_least(self, 0, "noise")
        _fractions(self, "valid_fraction")
        if self.max_attempts is not None:
            _at_least(self, 1, "max_attempts")
        if self.task.suite != "robosuite":
            raise ValueError(f"task={self.task.name}: demos can be generated for robosuite tasks (lift, can, square)")


@dataclass
class DownloadConfig:  # conf/download_datasets.yaml
    name: str
    root: str | None
    timeout: float

    def __post_init__(self):
        if not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout}: must be > 0 seconds")


@dataclass
class PlotEvalsConfig:  # conf/plot_evals.yaml
    evals: tuple[str, ...]
    output: str
    title: str

    def __post_init__(self):
        if not self.evals:
            raise ValueError("evals=[]: pass the directories of evaluate.py comparisons, evals=[DIR,DIR,...]")
        if not self.output.endswith(".png"):
            raise ValueError(f"output={self.output}: the figure is a PNG (its numbers go beside it as .json); "
                             "pass output=NAME.png")
        if missing := [d for d in self.evals if not (Path(d) / "eval.json").is_file()]:
            raise ValueError(f"evals: {missing[0]} holds no eval.json: pass the directories evaluate.py wrote "
                             "(its hydra.run.dir)")
