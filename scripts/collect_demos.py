"""Scripted demos: `python scripts/collect_demos.py task=lift num_demos=50 output=PATH`.

robosuite tasks: one robomimic HDF5 file at output=PATH. LIBERO suites (task=libero_object, task=libero_10):
num_demos demos of each task, one LIBERO HDF5 file per task in the folder output=DIR (named as LIBERO names its
files; a task whose file is there is skipped), which `dataset=DIR` trains on; they start from random placements
(env seeds), not from the evaluation's init states. LIBERO suites default to env=image; env=state collects the
state observation (object poses, goal regions, articulated joints; robo_rl/envs/libero.py).
Options: env=image (camera obs), noise=0.1 (action noise for diversity), seed=0. Only successful
episodes are kept (keep_failures=true: every attempt, failed ones without a terminal step); the expert's
success rate is printed and stored as the attr `expert_success_rate` of the file's `data` group.
"""
from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("collect_demos")
def main(cfg: DictConfig) -> None:
    from robo_rl.config import stop_on_bad_input, typed
    from robo_rl.data.hdf5 import write_robomimic
    from robo_rl.demos.collect import collect_demos, collect_libero_demos
    from robo_rl.envs import env_spec

    with stop_on_bad_input():
        cfg = typed(cfg)
        spec = env_spec(cfg)
        if spec.suite == "libero":
            files = collect_libero_demos(spec, cfg.task.expert, cfg.num_demos, cfg.output, noise=cfg.noise,
                                         seed=cfg.seed, num_envs=cfg.env.num_envs)
            print(f"[demos] {len(files)} LIBERO files ({cfg.num_demos} demos each) in {cfg.output}")
            return
        episodes, rate, env_args = collect_demos(spec, cfg.task.expert, cfg.num_demos, noise=cfg.noise,
                                                 seed=cfg.seed, num_envs=cfg.env.num_envs,
                                                 keep_failures=cfg.keep_failures)
        write_robomimic(cfg.output, episodes, env_args, attrs={"expert_success_rate": rate})
    steps = sum(e.num_steps for e in episodes)
    failed = sum(not e.terminals.any() for e in episodes)
    print(f"[demos] {len(episodes)} demos ({failed} failed, {steps} steps), expert success rate {rate:.2f} "
          f"-> {cfg.output}")


if __name__ == "__main__":
    main()
