"""Offline pretraining only: `python scripts/pretrain_offline.py task=lift dataset=PATH`.

Without dataset=PATH a task with a scripted expert pretrains on generated demos. The run
directory holds eval.json (policy without search), checkpoints and videos.
"""
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("pretrain_offline")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.train.run import run

    with stop_on_bad_input():
        run(typed(cfg), HydraConfig.get().runtime.output_dir, online=False)


if __name__ == "__main__":
    main()
