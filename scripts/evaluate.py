"""Evaluate a policy: `python scripts/evaluate.py task=lift policy=scripted episodes=5 hydra.run.dir=DIR`.

Writes DIR/eval.json (success_rate, per-task success, returns, lengths) and DIR/videos/*.mp4.
"""
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="evaluate", version_base=None)
def main(cfg: DictConfig) -> None:
    from robo_rl.eval.runner import run_evaluation

    run_evaluation(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
