"""Many demos from a few (MimicGen-style): each demo's hand path moved with the object to new scenes.

    python scripts/generate_demos.py task=lift source=DEMOS.hdf5 output=OUT.hdf5 num_demos=100

The source is a robomimic dataset of a robosuite task with OSC_POSE delta actions (human demos converted with
`convert_robosuite.py track_path=true`, or scripted demos). Only executions that succeed are written, after
the source demos; robo_rl/demos/generate.py says how paths are moved.
"""
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("generate_demos")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.demos.generate import generate_demos

    with stop_on_bad_input():  # the config check (robo_rl/config.py) has made sure the source is of the task
        cfg = typed(cfg)
        report = generate_demos(cfg.source, cfg.output, cfg.num_demos, cfg.task.object_symmetry, noise=cfg.noise,
                                seed=cfg.seed, max_attempts=cfg.max_attempts, valid_fraction=cfg.valid_fraction)
    print(f"[generate] {report.generated} of {report.attempts} executions succeeded "
          f"({report.success_rate:.2f}; {report.env_steps} env steps in all); wrote {report.sources} source + "
          f"{report.generated} generated demos to {cfg.output}")


if __name__ == "__main__":
    main()
