"""The scripts' entry point: Hydra's, with the command line checked first.

Hydra reports a key the config does not have (`budget.onlin_steps=5`), a group option that does not exist
(`task=lfit`) or an override it cannot parse in six lines and exit 1, with a `+key=` hint that the config check
then refuses. `command("config")` composes the command line once before Hydra runs and turns those into the
project's one line, exit 2, with the nearest valid name; everything else (types, ranges, files) is
robo_rl/config.py's check, which runs before the run directory exists. Once the run directory exists, all the
script prints is also written to its log.

    @command("config")          # instead of @hydra.main(config_path="../conf", config_name="config", ...)
    def main(cfg: DictConfig) -> None: ...
"""
from __future__ import annotations

import difflib
import functools
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig

from robo_rl.utils.logging import tee_output

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def command(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """hydra.main on conf/<config_name>.yaml, after `check_command_line` passed; what the task prints also goes to
    its run directory's log (`<run dir>/<script>.log`, beside Hydra's own lines), where it has one."""
    def decorate(task: Callable[[DictConfig], None]) -> Callable[[], None]:
        @functools.wraps(task)
        def logged_task(cfg: DictConfig) -> None:
            job = HydraConfig.get()
            if job.output_subdir is None:  # a script without a run directory (plot_evals, download_datasets)
                return task(cfg)
            with tee_output(Path(job.runtime.output_dir) / f"{job.job.name}.log"):
                task(cfg)

        hydra_task = hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base=None)(logged_task)

        @functools.wraps(task)
        def entry() -> None:
            check_command_line(config_name, sys.argv[1:])
            hydra_task()
        return entry
    return decorate


def check_command_line(config_name: str, argv: Sequence[str]) -> None:
    """Exit 2 with one `error: ...` line if Hydra cannot compose conf/<config_name>.yaml with `argv`'s overrides.
    Command lines with Hydra's own flags (--help, --cfg, -m, ...) are left to Hydra."""
    if any(arg.startswith("-") for arg in argv):
        return
    try:
        _compose(config_name, list(argv))
    except (ConfigCompositionException, MissingConfigException, OverrideParseException) as e:
        print(f"error: {_explain(e, config_name, list(argv))}", file=sys.stderr, flush=True)
        sys.exit(2)


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name, overrides=overrides)


def _explain(error: Exception, config_name: str, overrides: list[str]) -> str:
    """One line for a composition error: what is wrong with which override, and the nearest valid name."""
    message = str(error)
    if isinstance(error, OverrideParseException):
        bad = re.search(r"Error parsing override '(.*)'", message)
        return (f"{bad.group(1) if bad else 'an override'}: not an override Hydra can parse; write key=value "
                "(quote values with spaces or special characters)")
    if isinstance(error, MissingConfigException):
        found = re.search(r"Could not find '([^/']+)/([^']+)'", message)
        if found is None:
            return message.splitlines()[0]
        group, option = found.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"{group}={option}: no such option; {_did_you_mean(option, options)}{group} is one of {', '.join(options)}"
    key = re.search(r"Could not override '([^']+)'", message)
    if key is None:
        return message.splitlines()[0]
    return _unknown_key(key.group(1), config_name, overrides)


def _unknown_key(key: str, config_name: str, overrides: list[str]) -> str:
    """`key` is not in the config: name its nearest sibling (in the config the command line's groups pick)."""
    groups = [o for o in overrides if "." not in o.split("=", 1)[0]]  # task=..., budget=...: they shape the tree
    try:
        cfg = _compose(config_name, groups)
    except (ConfigCompositionException, MissingConfigException, OverrideParseException):
        cfg = _compose(config_name, [])
    parts = key.split(".")
    node = cfg
    for depth, part in enumerate(parts):
        parent = ".".join(parts[:depth])
        if not isinstance(node, DictConfig):
            return f"{key}: {parent} is a value, not a group of keys; pass {parent}=VALUE"
        if part not in node:
            break
        node = node[part]
    script = {"config": "train_qwm"}.get(config_name, config_name)
    where = f"{parent} has no key {part}" if parent else f"the config has no group or key {part}"
    return (f"unknown key {key} ({where}); {_did_you_mean(part, list(node.keys()), parent)}"
            f"`python scripts/{script}.py --cfg job` prints every key")


def _did_you_mean(name: str, candidates: Sequence[str], parent: str = "") -> str:
    close = difflib.get_close_matches(name, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""

