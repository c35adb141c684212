"""Scripted demos as robomimic HDF5: `python scripts/collect_demos.py task=lift num_demos=50 output=PATH`.

Options: env=image (camera obs), noise=0.1 (action noise for diversity), seed=0. Only successful
episodes are kept; the expert's success rate is printed and stored as the attr
`expert_success_rate` of the file's `data` group.
"""
import hydra
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="collect_demos", version_base=None)
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input
    from robo_rl.demos.collect import collect_demos
    from robo_rl.data.hdf5 import write_robomimic
    from robo_rl.envs import env_spec

    with stop_on_bad_input():
        episodes, rate, env_args = collect_demos(env_spec(cfg), cfg.task.expert, cfg.num_demos, noise=cfg.noise,
                                                 seed=cfg.seed, num_envs=cfg.env.num_envs)
        write_robomimic(cfg.output, episodes, env_args, attrs={"expert_success_rate": rate})
    steps = sum(e.num_steps for e in episodes)
    print(f"[demos] {len(episodes)} demos ({steps} steps), expert success rate {rate:.2f} -> {cfg.output}")


if __name__ == "__main__":
    main()
