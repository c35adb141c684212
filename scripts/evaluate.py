"""Evaluate a policy: `python scripts/evaluate.py task=lift policy=scripted episodes=5 hydra.run.dir=DIR`.

Writes DIR/eval.json (success_rate and its 95% interval, per-task success, per-episode returns, lengths)
and DIR/videos/*.mp4. `checkpoint=DIR compare=[none,best_of_n,qwm] episodes=200` compares actors of a
trained agent on paired episodes instead: eval.json then holds `actors` (one such summary each),
`gains` / `search_gain` (paired differences vs `none` with t intervals), and a table is printed. Actors: none
(the policy's sample), guard (a random candidate the drift guard lets through), best_of_n (the critic's pick), qwm.
"""
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("evaluate")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.eval.runner import run_evaluation

    hydra_cfg = HydraConfig.get()
    with stop_on_bad_input():
        run_evaluation(typed(cfg), hydra_cfg.runtime.output_dir, list(hydra_cfg.overrides.task))


if __name__ == "__main__":
    main()
