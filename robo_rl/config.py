"""The config, checked at the door: a script's composed Hydra config against typed schemas, before Hydra
creates the run directory and before any data is read or env built.

One dataclass per config group: its annotations give each key's type (`Literal` for a fixed set of
choices) and its `__post_init__` the allowed ranges, in messages that start with the key's name
(`num_envs=0: must be >= 1`; the validator prefixes the group). The agent and planner groups are the
dataclasses their consumers are built from (SORLConfig, QWMConfig) plus the group's `name`, so their
keys' types and ranges are stated once, where they are used. Unknown keys are errors, including `+key=...` overrides that nothing would read.

Every script's config names `ValidateConfig` under `hydra.callbacks`; scripts run their work inside
`stop_on_bad_input()`, so a bad value found later (a dataset's contents, a checkpoint of another task,
training that diverges) ends the process the same way: one line naming the value and the fix, exit 2.
"""
from __future__ import annotations

import contextlib
import difflib
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from robo_rl.agents.sorl import NonFiniteUpdateError, SORLConfig
from robo_rl.data.hdf5 import DatasetError, dataset_files, read_env_args
from robo_rl.planning.qwm import QWMConfig
from robo_rl.train.checkpoint import latest_checkpoint

TASK_CONF = Path(__file__).resolve().parents[1] / "conf" / "task"


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix, on one line."""


# -- schemas, one per group --------------------------------------------------------------------
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

    def __post_init__(self):
        _at_least(self, 1, "horizon")


@dataclass
class EnvConfig:
    modality: str
    backend: Literal["subprocess", "sync", "warp"]
    num_envs: int
    image_size: int
    render_size: int  # 0: no video renderer
    step_timeout: float

    def __post_init__(self):
        _at_least(self, 1, "num_envs", "image_size")
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

    def __post_init__(self):
        _at_least(self, 0, "offline_steps", "online_steps", "eval_every")
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

    def __post_init__(self):
        _fractions(self, "offline_ratio", "gamma")
        _at_least(self, 1, "nstep")


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
    demo_cache: str
    resume: bool
    train: LearnerConfig
    explore: Literal["none", "param_noise"]
    param_noise_std: float

    def __post_init__(self):
        _check_device(self.device)
        _check_modality(self.env, self.task)
        _at_least(self, 0, "param_noise_std")
        if self.planner.name == "qwm" and not self.agent.world_model.enabled:
            raise ValueError("planner=qwm searches with the world model: set agent.world_model.enabled=true "
                             "or use planner=none")


@dataclass
class EvaluateConfig:  # conf/evaluate.yaml
    env: EnvConfig
    task: TaskConfig
    agent: AgentConfig
    budget: BudgetConfig
    planner: PlannerConfig
    logger: LoggerConfig
    policy: Literal["random", "scripted", "checkpoint"]
    checkpoint: str | None
    compare: tuple[Literal["none", "best_of_n", "qwm"], ...] | None
    episodes: int
    videos: int
    wrist_video: bool
    seed: int
    device: str
    compile: bool
    threads: int

    def __post_init__(self):
        _check_device(self.device)
        _check_modality(self.env, self.task)
        _at_least(self, 1, "episodes", "threads")
        _at_least(self, 0, "videos")


@dataclass
class CollectDemosConfig:  # conf/collect_demos.yaml
    env: EnvConfig
    task: TaskConfig
    num_demos: int
    output: str | None
    noise: float
    seed: int

    def __post_init__(self):
        _check_modality(self.env, self.task)
        _at_least(self, 1, "num_demos")
        _at_least(self, 0, "noise")
        if not self.output:
            raise ValueError("output=None: collect_demos.py writes the demos to output=PATH.hdf5; pass one")
        if not self.task.expert:
            raise ValueError(f"task.expert=None: task {self.task.name} has no scripted expert; "
                             "scripted demos exist for task=lift and task=can")


@dataclass
class ConvertConfig:  # conf/convert_robosuite.yaml
    input: str
    output: str
    cameras: tuple[str, ...]
    image_size: int
    valid_fraction: float

    def __post_init__(self):
        _at_least(self, 1, "image_size")
        _fractions(self, "valid_fraction")


@dataclass
class DownloadConfig:  # conf/download_datasets.yaml
    name: str
    root: str | None
    timeout: float

    def __post_init__(self):
        if not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout}: must be > 0 seconds")


SCHEMAS: dict[str, type] = {
    "config": TrainConfig, "pretrain_offline": TrainConfig, "evaluate": EvaluateConfig,
    "collect_demos": CollectDemosConfig, "convert_robosuite": ConvertConfig, "download_datasets": DownloadConfig,
}


# -- validation --------------------------------------------------------------------------------
def validate(cfg: DictConfig, config_name: str) -> Any:
    """Check the composed config of `conf/<config_name>.yaml` (its `hydra` node is ignored): types,
    unknown keys, ranges, and the files it names (dataset, checkpoint). Returns the schema instance;
    raises ConfigError (or DatasetError for a dataset that cannot be used)."""
    try:
        node = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
                                      resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required: pass {e.full_key}=...") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{e.full_key}: {e.msg}") from None
    settings = _build(SCHEMAS[config_name], node, "")
    if getattr(settings, "dataset", None):
        check_dataset(settings.dataset, settings.task)
    if getattr(settings, "checkpoint", None) and latest_checkpoint(settings.checkpoint) is None:
        raise ConfigError(f"checkpoint={settings.checkpoint}: no checkpoint there; pass a step_*.pt file or a run "
                          "directory with checkpoints/step_*.pt")
    return settings


def _build(schema: type, node: Any, key: str) -> Any:
    """`schema` instance from a plain dict, every value checked; `key` is the node's dotted path."""
    prefix = f"{key}." if key else ""
    if not isinstance(node, dict):
        raise ConfigError(f"{key}={node!r}: expected a group of keys ({', '.join(f.name for f in fields(schema))})")
    hints = typing.get_type_hints(schema)
    for name in node:
        if name not in hints:
            close = difflib.get_close_matches(name, list(hints), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {prefix}{name}: nothing reads it{hint}; remove it or fix its spelling")
    for f in fields(schema):
        if f.name not in node and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"missing key {prefix}{f.name}: add it to the config ({f.type})")
    values = {name: _value(value, hints[name], prefix + name) for name, value in node.items()}
    try:
        return schema(**values)
    except ValueError as e:  # a range check of __post_init__: its message starts with the key's name
        raise ConfigError(f"{prefix}{e}") from None


def _value(value: Any, hint: Any, key: str) -> Any:
    """`value` checked against the type `hint` (lists become tuples, ints of float keys floats)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        return _build(hint, value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):  # only `X | None` occurs
        (inner,) = [a for a in args if a is not type(None)]
        return None if value is None else _value(value, inner, key)
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r}: expected a list, e.g. {key}=[...]")
        return tuple(_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a group of keys")
        return {k: _value(v, args[1], f"{key}.{k}") for k, v in value.items()}
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    ok, expected = {bool: (isinstance(value, bool), "true or false"), str: (isinstance(value, str), "a string"),
                    float: (numeric, "a number"), int: (numeric and isinstance(value, int), "an integer")}[hint]
    if not ok:
        raise ConfigError(f"{key}={value!r}: expected {expected}")
    return float(value) if hint is float else value


def check_dataset(dataset: str | Path, task: TaskConfig | DictConfig) -> list[Path]:
    """The HDF5 files `dataset=` names, each checked from its attrs alone to hold demos of `task`:
    LIBERO files for LIBERO suites, robomimic files recorded in the task's robosuite env otherwise."""
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


# -- where the checks run ----------------------------------------------------------------------
@contextlib.contextmanager
def stop_on_bad_input() -> Iterator[None]:
    """Errors that name a bad input (config value, dataset, training that diverges) end the process
    with their one-line message and exit code 2 instead of a traceback."""
    try:
        yield
    except (ConfigError, DatasetError, NonFiniteUpdateError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


class ValidateConfig(Callback):
    """Hydra callback (`hydra.callbacks.validate` in every script's config): validates the composed config
    when a run starts, before Hydra creates its directory (multirun: each job's config)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with stop_on_bad_input():
            validate(config, config.hydra.job.config_name)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            with stop_on_bad_input():
                validate(config, config.hydra.job.config_name)
