"""Paired comparisons of one run's checkpoints, against online env steps: success per actor and gain over the
policy alone (does search help more as the run goes on?).

    python scripts/evaluate.py checkpoint=RUN/checkpoints/curve/step_00022000.pt compare=[none,best_of_n,qwm] \
        episodes=100 hydra.run.dir=EVAL_A          # ... one per checkpoint; seed=100 adds 100 other episodes
    python scripts/plot_evals.py evals=[EVAL_A,EVAL_B,...] output=search_gain.png   # and search_gain.json
"""
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("plot_evals")
def main(cfg: DictConfig) -> None:
    from pathlib import Path

    from robo_rl.config import stop_on_bad_input
    from robo_rl.eval.series import load_series, plot_series
    from robo_rl.utils.logging import write_json

    with stop_on_bad_input():
        series = load_series(list(cfg.evals))
    output = Path(cfg.output)
    write_json(output.with_suffix(".json"), series)
    plot_series(series, output, cfg.title)
    names = list(series["actors"])
    print(f"{'env steps':>10} {'episodes':>9}  " + "  ".join(f"{n:>22}" for n in names))
    for i, steps in enumerate(series["env_steps"]):
        cells = []
        for n in names:
            rate = series["actors"][n]["success"][i]
            gain = series["gains"][n]["mean"][i] if n in series["gains"] else None
            cells.append("-" if rate is None else f"{rate:.3f}" + ("" if gain is None else f" ({gain:+.3f})"))
        print(f"{steps:>10} {series['episodes'][i]:>9}  " + "  ".join(f"{c:>22}" for c in cells))
    print(f"wrote {output} and {output.with_suffix('.json')}")


if __name__ == "__main__":
    main()
