"""Raw robosuite demos -> robomimic dataset, with a replay report per demo.

    python scripts/convert_robosuite.py input=RAW.hdf5 output=OUT.hdf5 \
        cameras=[agentview,robot0_eye_in_hand] image_size=84 [drop_idle=true | track_path=true]
"""
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("convert_robosuite")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.demos.convert import convert_robosuite

    with stop_on_bad_input():
        cfg = typed(cfg)
        reports = convert_robosuite(cfg.input, cfg.output, tuple(cfg.cameras), cfg.image_size,
                                    valid_fraction=cfg.valid_fraction, drop_idle=cfg.drop_idle,
                                    track_path=cfg.track_path)
    print(f"{'demo':<10} {'steps':>6} {'kept':>6} {'replay success':>15} {'max state divergence':>21}")
    for r in reports:
        kept = r.steps if r.kept_steps is None else r.kept_steps
        print(f"{r.demo:<10} {r.steps:>6} {kept:>6} {str(r.success):>15} {r.max_state_divergence:>21.4f}")
    if (cfg.drop_idle or cfg.track_path) and (failed := [r.demo for r in reports if not r.success]):
        print(f"left out (no success when re-executed): {', '.join(failed)}")
    print(f"wrote {cfg.output}")


if __name__ == "__main__":
    main()
