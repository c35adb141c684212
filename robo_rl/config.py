"""The config, checked at the door: a script's composed Hydra config against the typed configs of
`robo_rl/schemas.py`, before Hydra creates the run directory and before any data is read or env built. The top
of robo_rl: only scripts (and Hydra, through the callback) import it.

`validate` returns the typed config (`robo_rl/utils/schema.py` does the typed building), which is what the
scripts hand on: `run(TrainConfig, ...)`, `run_evaluation(EvaluateConfig, ...)`; nothing below reads the Hydra
tree. Unknown keys are errors, including `+key=...` overrides that nothing would read.

Each setting is decided in one place: the search's discount is `train.gamma` (the critic's), its policy
samples take `agent.sample_steps`; network sizes live in `conf/agent/size/<budget>.yaml`, which the
budget's name picks, not in the budget files.

Every script's config names `ValidateConfig` under `hydra.callbacks`; scripts run their work inside
`stop_on_bad_input()`, so a bad value found later (a dataset's contents, a checkpoint of another task,
training that diverges) ends the process the same way: one line naming the value and the fix, exit 2.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from robo_rl.agents.sorl import NonFiniteUpdateError
from robo_rl.checkpoint import CheckpointWriteError, check_resume, load_checkpoint
from robo_rl.data.hdf5 import DatasetError
from robo_rl.eval.runner import check_evaluation
from robo_rl.schemas import (
    CollectDemosConfig, ConvertConfig, DownloadConfig, EvaluateConfig, GenerateDemosConfig, PlotEvalsConfig, TrainConfig,
)
from robo_rl.train.generated import check_generation_source
from robo_rl.train.sources import check_dataset
from robo_rl.utils.schema import ConfigError, from_dict
from robo_rl.utils.shutdown import StopRequested


SCHEMAS: dict[str, type] = {
    "config": TrainConfig, "pretrain_offline": TrainConfig, "evaluate": EvaluateConfig,
    "collect_demos": CollectDemosConfig, "convert_robosuite": ConvertConfig, "download_datasets": DownloadConfig,
    "generate_demos": GenerateDemosConfig, "plot_evals": PlotEvalsConfig,
}


# Keys that older configs had and that one other setting now decides.
SET_ELSEWHERE = {
    ("planner", "gamma"): "the search discounts with the critic's train.gamma",
    ("planner", "policy_steps"): "the search samples the policy with agent.sample_steps",
}


# -- validation --------------------------------------------------------------------------------
def validate(cfg: DictConfig, config_name: str, run_dir: str | None = None) -> Any:
    """Check the composed config of `conf/<config_name>.yaml` (its `hydra` node is ignored, but for the command
    line's overrides): types, unknown keys, ranges, the files it names (dataset or source, a checkpoint and what
    evaluating it asks of it) and, given the run directory, what `resume` finds there. Returns the schema instance;
    raises ConfigError (or DatasetError for a dataset that cannot be used)."""
    settings = _typed_settings(cfg, config_name)
    if isinstance(settings, TrainConfig) and settings.demos.generate:  # the file demos are generated from
        check_generation_source(settings.dataset, settings.task)
    else:
        for demos in (getattr(settings, "dataset", None), getattr(settings, "source", None)):  # source: generate_demos
            if demos:
                check_dataset(demos, settings.task)
    if isinstance(settings, EvaluateConfig):
        overrides = list(cfg.hydra.overrides.task) if "hydra" in cfg else []
        check_evaluation(settings, load_checkpoint(settings.checkpoint) if settings.checkpoint else None, overrides)
    if run_dir is not None and isinstance(settings, TrainConfig):
        check_resume(settings.resume, run_dir)
    return settings


def typed(cfg: DictConfig) -> Any:
    """The running script's config as its typed config: what it hands on. Types and ranges only: the files it
    names were checked by `ValidateConfig` before the run directory existed, and are not read again here."""
    return _typed_settings(cfg, HydraConfig.get().job.config_name)


def _typed_settings(cfg: DictConfig, config_name: str) -> Any:
    """The schema instance of `conf/<config_name>.yaml`'s composed config: types, unknown keys, ranges."""
    try:
        node = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
                                      resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required: pass {e.full_key}=...") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{e.full_key}: {e.msg}") from None
    for (group, key), where in SET_ELSEWHERE.items():
        if key in (node.get(group) or {}):
            raise ConfigError(f"{group}.{key} is not a setting of its own: {where}; remove {group}.{key}")
    return from_dict(SCHEMAS[config_name], node)


# -- where the checks run ----------------------------------------------------------------------
@contextlib.contextmanager
def stop_on_bad_input() -> Iterator[None]:
    """Errors that name a bad input (config value, dataset, training that diverges, a disk without room for
    the checkpoints) end the process with their one-line message and exit code 2 instead of a traceback; a run a signal stopped
    (robo_rl/utils/shutdown.py) ends with its one line and 128 + the signal's number."""
    try:
        yield
    except (ConfigError, DatasetError, NonFiniteUpdateError, CheckpointWriteError) as e:
        print(f"error: {e.strerror if isinstance(e, CheckpointWriteError) else e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except StopRequested as e:
        print(f"[run] {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


class ValidateConfig(Callback):
    """Hydra callback (`hydra.callbacks.validate` in every script's config): validates the composed config
    when a run starts, before Hydra creates its directory (multirun: each job's config)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with stop_on_bad_input():
            validate(config, config.hydra.job.config_name, run_dir=config.hydra.run.dir)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            with stop_on_bad_input():
                validate(config, config.hydra.job.config_name)
