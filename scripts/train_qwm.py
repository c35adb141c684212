"""Train on a task: demos -> offline pretraining -> online fine-tuning with QWM search -> evaluation.

    python scripts/train_qwm.py                       # task=lift, state obs, CPU budget (~10-15 min)
    python scripts/train_qwm.py task=libero_10        # LIBERO-10, image obs, multi-task
    python scripts/train_qwm.py budget=smoke hydra.run.dir=DIR resume=true
"""
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("config")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.train.run import run

    with stop_on_bad_input():
        run(typed(cfg), HydraConfig.get().runtime.output_dir, online=True)


if __name__ == "__main__":
    main()
