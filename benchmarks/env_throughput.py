"""Env throughput: control steps per second of each env backend, against baselines measured in the same run.

Every rate counts *control steps* (one policy action = robosuite's 25 physics substeps at 20 Hz),
summed over envs/worlds, with uniform random actions and auto-reset.

  subprocess backend (issue 2):
    python benchmarks/env_throughput.py --task lift --num-envs 2 --steps 300 [--rounds 3] --json OUT
    raw_mj_step_per_s        plain `mujoco.mj_step` loop on the same compiled model (25 substeps = 1 step)
    single_env_steps_per_s   one RobosuiteEnv in this process (best of --rounds)
    vector_env_steps_per_s   VecEnv(workers="subprocess") with --num-envs envs as runs build it (env.inline_envs=1:
                             env 0 steps in this process while the workers step), best of --rounds, interleaved
                             with the single env's rounds; all rounds under `rounds` in the JSON
    vector_speedup           vector / single
    all_workers_speedup      the same VecEnv with every env in a worker (env.inline_envs=0) / single
    independent_steps_per_s  --num-envs processes each stepping its own env, never talking to each other, timed
                             together and summed: the most any vector env can get from this machine's cores
    parallel_ceiling         independent / single; vector_vs_ceiling: vector / independent

  warp backend (issue 6):
    python benchmarks/env_throughput.py --backend warp --task lift --num-envs 1 16 256 --json OUT
    warp_world_steps_per_s   {B: world control steps/s} of WarpVecEnv for each --num-envs B (--device cpu|cuda)
    subprocess_steps_per_s   the subprocess VecEnv with --subprocess-envs envs (default: one per CPU core)
    warp_speedup             {B: warp / subprocess}
  Crossover (Lift, 2026-12-04): on this 2-core CPU none (Warp saturates near 0.2x the 2 workers by 64 worlds);
  on one H200 (`--device cuda --num-envs 1 256 4096`, 16 subprocess workers on its 16 cores: 710 steps/s)
  Warp runs 55 world steps/s at B = 1 (0.08x), 6,170 at 256 (8.7x) and 58,462 at 4096 (82x): the crossover
  lies between 1 and 256 worlds there; 100k control-steps/s was not reached at 4096 (larger B not measured).

Where the subprocess VecEnv's time goes (issue 16; Lift state, 2 envs; py-spy of the main process and the
workers, per-process CPU time (psutil) and run-queue delay (/proc/PID/schedstat) per control step, on this
2-core machine shared with other jobs, load 3-5):
  worker      7.2-7.8 ms CPU per step; the single env in-process 5.6-7.3 ms in the same conditions. py-spy puts
              most of it in robosuite's OSC controller and MjSim.forward/step.
  IPC         warm: the worker pickles its answer (468 bytes) in 13 us, the main process unpickles it in 8 us
              and stacks two obs dicts in 19 us, Connection.poll takes 3 us: under 1% of a step. Observations in
              shared memory (gymnasium's shared_memory=True, EnvPool) would save under 1%, so they are not used.
  main        0.75-0.9 ms CPU per step for 2 envs (cold caches after each wake-up make the calls above ~10x
              dearer than warm); pinning the workers to cores, running them at nice +4, or waking them
              through semaphores instead of pipes (a toy with 7 ms of work per step: 14.2 vs 14.5 ms per
              step) did not change the wall time per step beyond the noise.
  run queue   each worker waits 6-8 ms per step for a core (the main process 1.3-3 ms): under this load the
              two workers get about one core between them and vector_speedup measured 0.87 (best of 3 rounds).
On the idle machine (2026-12-03, load 0.7-1.1) the same run measured the ceiling: 2 independent processes, each
stepping its own env, reach 2.01x one env, while the VecEnv reached 1.45x, 72% of it. So the 2 cores are real
cores and the loss is the lockstep itself: the main process sleeps through every step (its core idle while a
worker could not use it) and its own share (send, wake-up, receive, stack) lies on each step's critical path.
Stepping env 0 in the main process after sending the workers their actions (VecEnv(inline_envs=1),
env.inline_envs=1) fills that core: 1.72x (1 worker + 1 inline env), the default since 2026-12-04. The price: a
crash of the simulator in env 0 (a segfault, not a Python error, which stops a run from a worker too) takes the
main process down, where a worker would be replaced; such a run continues with resume=true.

--images adds 84x84 agentview observations (not to the raw mj_step loop).
A measurement stops after --steps control steps or --max-seconds, whichever comes first (MuJoCo Warp
on a CPU takes seconds per step at large B). Warm-up steps (kernel compilation) are not timed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import torch

from robo_rl.envs.spec import EnvSpec

TASKS = {"lift": "Lift", "can": "PickPlaceCan"}
LOW_DIM_KEYS = ("object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")


def timed_rate(step, batch: int, steps: int, max_seconds: float, warmup: int = 2, sync=lambda: None) -> float:
    """Control steps x batch per second of `step()` (untimed warm-up first)."""
    for _ in range(warmup):
        step()
    sync()
    start, done = time.perf_counter(), 0
    while done < steps and (done == 0 or time.perf_counter() - start < max_seconds):
        step()
        done += 1
    sync()
    return done * batch / (time.perf_counter() - start)


def random_actions(num_envs: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, (num_envs, 7)).astype(np.float32)


def raw_mj_step_rate(spec: EnvSpec, steps: int, max_seconds: float) -> float:
    """`mujoco.mj_step` on the task's compiled model; random torques held for 25 substeps."""
    import mujoco

    from robo_rl.envs.robosuite import make_robosuite_env

    env = make_robosuite_env(spec)
    model, substeps = env.sim.model._model, int(round(env.control_timestep / env.model_timestep))
    data = mujoco.MjData(model)
    data.qpos[:] = env.sim.data.qpos
    env.close()
    low, high = model.actuator_ctrlrange.T
    rng = np.random.default_rng(0)

    def step():
        data.ctrl[:] = rng.uniform(low, high)
        for _ in range(substeps):
            mujoco.mj_step(model, data)

    return timed_rate(step, 1, steps, max_seconds)


def random_stepping_env(spec: EnvSpec):
    """(env, step): one RobosuiteEnv in this process and a call that steps it with a random action
    (resetting at the episode's end)."""
    from robo_rl.envs.robosuite import RobosuiteEnv

    env = RobosuiteEnv(spec)
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def step():
        _, _, terminated, truncated, _ = env.step(random_actions(1, rng)[0])
        if terminated or truncated:
            env.reset()

    return env, step


def single_env_rate(spec: EnvSpec, steps: int, max_seconds: float) -> float:
    env, step = random_stepping_env(spec)
    rate = timed_rate(step, 1, steps, max_seconds)
    env.close()
    return rate


def _independent_worker(spec: EnvSpec, steps: int, max_seconds: float, start, rates) -> None:
    env, step = random_stepping_env(spec)
    for _ in range(2):
        step()
    start.wait()  # every process starts timing together
    rates.put(timed_rate(step, 1, steps, max_seconds, warmup=0))
    env.close()


def independent_rate(spec: EnvSpec, num_envs: int, steps: int, max_seconds: float) -> float:
    """num_envs processes, each stepping its own env and never talking to another, summed: what the machine's
    cores give num_envs envs with no coordination at all, the ceiling of any vector env here."""
    context = mp.get_context("spawn")
    start, rates = context.Barrier(num_envs), context.Queue()
    workers = [context.Process(target=_independent_worker, args=(spec, steps, max_seconds, start, rates))
               for _ in range(num_envs)]
    for w in workers:
        w.start()
    total = sum(rates.get() for _ in workers)
    for w in workers:
        w.join()
    return total


def subprocess_rate(spec: EnvSpec, num_envs: int, steps: int, max_seconds: float, inline_envs: int = 0) -> float:
    from robo_rl.envs.vector import VecEnv

    rng = np.random.default_rng(0)
    with VecEnv(spec, num_envs, workers="subprocess", inline_envs=inline_envs) as env:
        env.reset(seed=0)
        return timed_rate(lambda: env.step(random_actions(num_envs, rng)), num_envs, steps, max_seconds)


def warp_rate(spec: EnvSpec, num_envs: int, device: str, steps: int, max_seconds: float) -> float:
    from robo_rl.envs.warp import WarpVecEnv

    env = WarpVecEnv(spec, num_envs, device=device)
    env.reset(seed=0)
    generator = torch.Generator(device=env.device).manual_seed(0)

    def step():
        env.step(torch.rand(num_envs, 7, generator=generator, device=env.device) * 2 - 1)

    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    rate = timed_rate(step, num_envs, steps, max_seconds, sync=sync)
    env.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="lift")
    parser.add_argument("--backend", choices=["subprocess", "warp"], default="subprocess")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=300, help="control steps per measurement (at most)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time limit per measurement")
    parser.add_argument("--rounds", type=int, default=3,
                        help="subprocess backend: interleaved rounds of the single env and the VecEnv (best of each)")
    parser.add_argument("--device", default="cpu", help="warp backend: cpu or cuda[:i]")
    parser.add_argument("--subprocess-envs", type=int, default=os.cpu_count(),
                        help="warp backend: envs of the subprocess baseline")
    parser.add_argument("--horizon", type=int, default=300)
    parser.add_argument("--images", action="store_true",
                        help="observe agentview_image (84x84) too: robosuite's OpenGL camera / Warp's ray tracer")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    if args.backend == "subprocess" and len(args.num_envs) != 1:
        parser.error("--backend subprocess measures one vector size; pass a single --num-envs")

    spec = EnvSpec(suite="robosuite", env_name=TASKS[args.task], low_dim_keys=LOW_DIM_KEYS, horizon=args.horizon,
                   rgb_keys=("agentview_image",) if args.images else ())
    budget = dict(steps=args.steps, max_seconds=args.max_seconds)
    results: dict = dict(task=spec.env_name, backend=args.backend, unit="control steps/s (25 substeps each)",
                         observations=list(spec.low_dim_keys + spec.rgb_keys),
                         cpu_count=os.cpu_count(), load_avg_start=os.getloadavg()[0])
    rows: list[tuple[str, float, str]] = []

    raw = raw_mj_step_rate(spec, **budget)
    results["raw_mj_step_per_s"] = raw
    rows.append(("raw mujoco.mj_step loop", raw, "reference"))
    if args.backend == "subprocess":
        num_envs = args.num_envs[0]
        rounds: dict[str, list[float]] = {"single_env": [], "vector_env": [], "all_workers": [], "independent": []}
        for _ in range(args.rounds):  # interleaved: other processes on a shared machine only slow a round down
            rounds["single_env"].append(single_env_rate(spec, **budget))
            rounds["vector_env"].append(subprocess_rate(spec, num_envs, **budget, inline_envs=1))
            rounds["all_workers"].append(subprocess_rate(spec, num_envs, **budget, inline_envs=0))
            rounds["independent"].append(independent_rate(spec, num_envs, **budget))
        single, vector, all_workers, ceiling = (max(rounds[k]) for k in
                                                ("single_env", "vector_env", "all_workers", "independent"))
        results.update(num_envs=num_envs, single_env_steps_per_s=single, vector_env_steps_per_s=vector,
                       vector_speedup=vector / single, all_workers_steps_per_s=all_workers,
                       all_workers_speedup=all_workers / single, independent_steps_per_s=ceiling,
                       parallel_ceiling=ceiling / single, vector_vs_ceiling=vector / ceiling, rounds=rounds)
        rows += [("single RobosuiteEnv", single, f"{single / raw:.2f}x raw"),
                 (f"subprocess VecEnv x{num_envs} (env 0 inline)", vector, f"{vector / single:.2f}x single"),
                 ("  every env in a worker (inline_envs=0)", all_workers, f"{all_workers / single:.2f}x single"),
                 (f"{num_envs} independent processes", ceiling,
                  f"{ceiling / single:.2f}x single (ceiling; VecEnv at {vector / ceiling:.0%} of it)")]
    else:
        baseline = subprocess_rate(spec, args.subprocess_envs, **budget)
        warp = {b: warp_rate(spec, b, args.device, **budget) for b in args.num_envs}
        results.update(device=args.device, subprocess_num_envs=args.subprocess_envs,
                       subprocess_steps_per_s=baseline, warp_world_steps_per_s=warp,
                       warp_speedup={b: v / baseline for b, v in warp.items()})
        rows.append((f"subprocess VecEnv x{args.subprocess_envs}", baseline, "baseline"))
        rows += [(f"WarpVecEnv B={b} ({args.device})", v, f"{v / baseline:.2f}x subprocess") for b, v in warp.items()]
    results["load_avg_end"] = os.getloadavg()[0]

    print(f"\n{spec.env_name}{' + 84x84 agentview images' if args.images else ''}: control steps/s summed over envs "
          f"(load avg {results['load_avg_start']:.1f} -> {results['load_avg_end']:.1f}, {os.cpu_count()} cores)")
    print(f"{'backend':<34}{'steps/s':>12}  ratio")
    for name, rate, ratio in rows:
        print(f"{name:<34}{rate:>12.1f}  {ratio}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
