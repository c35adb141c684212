"""Latency of one QWM search decision for 16 envs, against policy-only acting and the per-node loop.

The search a default run acts with: the agent's nets at `--budget`'s sizes (budget=cpu, the default: latent 128,
policy velocity MLP 3x256, 4 critic heads of 3x256, 8 world-model heads of 3x256; budget=gpu: SORL's 4x512 and 10
heads) with random weights (latency does not depend on the weights), the planner of conf/planner/qwm.yaml (drift
guard on), the policy sampling with agent.sample_steps, and torch threads by the run's thread policy.

  search_ms        QWMPlanner.plan at the defaults (N = K = N_leaf = 8, D = 2, J = 1, drift guard), all envs;
                   precision "auto" = bfloat16 autocast on CPUs where native (AMX or AVX512-BF16), else fp32 (CUDA too)
                   (JSON `precision` says which ran)
  search_ms_d4     the same at D = 4
  policy_only_ms   one policy sample per env: the cost of acting without search
  loop_ms          plan_reference (a Python loop over envs, candidates and nodes) at the defaults, fp32
  loop_ms_default  the same loop in the precision search_ms ran in (= loop_ms when that is fp32)
  search_ms_fp32   the defaults in fp32
  speedup_vs_loop  loop_ms / search_ms_fp32: batching alone, both in fp32
  speedup_vs_loop_default  loop_ms_default / search_ms: batching alone, both in the default precision
  search_ms_k1     extra: the defaults with a one-step sampler (a shortcut policy can sample in one step)
  search_ms_paper  extra: planner=qwm_paper (conf/planner/qwm_paper.yaml: one imagined path per root action, no
                   drift guard), in the default precision

Profile (2026-12-03; torch.profiler and CPU-time micro-benchmarks, 1 thread, 2 cores at load 4-16):
  fp32 is bound by GEMM arithmetic. One decision is 33.9 GFLOP: 3200 flow samples x 4 Euler steps
  of the 4x512 velocity MLP (22.0), 3200 two-head Q values (11.0), the world model (0.8). A lone
  1024x512x512 fp32 mm runs at 172 GFLOP/s here, so ~200 ms of CPU is the floor, and the loop
  took 4.9-5.4 s of CPU: speedup_vs_loop cannot reach 30 here without less arithmetic (another
  search) or a slower loop. bf16 (AMX) runs that layer's addmm in 0.49 ms instead of 3.3, and element-wise
  passes take most of the rest: GELU 27%, LayerNorm 17%, addmm's bias copy 15%, the big GEMMs 19%
  of the profiled search. Removed: (1) the stacked critic ensemble cost 2-3x its FLOPs at 1024 rows
  ([2, 1024, 512] activations outgrow L2; baddbmm's bias copy, a separate affine pass, bf16 casts),
  so large no-grad batches now run one member at a time (robo_rl/nets/mlp.py; search CPU ms, runs
  interleaved in one process: bf16 140 -> 110, fp32 348 -> 311, 10-head critic bf16 518 -> 245);
  (2) r̂ and the continuation ran on all K*J nodes of a depth though only the J kept ones go on
  (robo_rl/planning/qwm.py; 1024 -> 128 rows per depth); (3) this benchmark ran under
  inference_mode, where autocast cannot cache weight casts (bf16 search 147 vs 138 CPU ms).
  Tried and not kept: projecting z once per sample instead of at every Euler step (the first layer
  is ~5% of the velocity MLP's FLOPs; the extra [B, 512] add cost what the smaller GEMM saved).

Everything runs under torch.no_grad(), as the actor calls the planner (robo_rl/planning/actor.py):
under inference_mode bf16 autocast cannot cache its weight casts and recasts every weight per call.
Each latency is the best of --rounds rounds (other processes only ever slow a round down; the loop
gets one round, it takes minutes); the median is reported beside it, with the load average seen,
and the best round's CPU time of this process (`cpu_ms`, `speedup_vs_loop_cpu`,
`speedup_vs_loop_default_cpu`): one thread's CPU time does not count the time other processes hold
the core, so on the shared 2 cores (load 4-13 on 2026-12-03, where wall times of the single-round
loop varied 3x between runs of the same code) it is the steadier ratio.
Until 2026-12-07 this timed paper-size nets (4x512, 2 heads) without the drift guard on 1 thread; the figures above
are of those. --threads defaults to the run's thread policy (robo_rl/utils/threads.py). Anchor on this machine: TD-MPC2's MPPI planner takes
600-700 ms for ONE env's decision.

On a GPU (`--device cuda`; one H200, torch 2.11, 2026-12-04): search_ms 14.8 (bf16, what "auto" picked then),
search_ms_fp32 9.6, D = 4 22.5, policy only 1.3; the fp32 loop 3646 ms, so speedup_vs_loop 379 fp32 vs fp32
(bf16 vs bf16: 336). Both targets (<= 100 ms, >= 30x) hold there. At 16 envs the search is bound by kernel
launches, not arithmetic (its CPU time equals its wall time), which is why bf16, whose casts add kernels, is
the slower of the two there: "auto" picks fp32 on CUDA since (utils/precision.py auto_bf16). CUDA graphs would be the
lever for the launches, not measured.

    python benchmarks/qwm_search.py --json OUT [--rounds 5] [--envs 16] [--budget cpu] [--threads auto] [--device cuda]
"""
from __future__ import annotations

from robo_rl.utils.threads import apply_thread_policy, prepare_openmp

prepare_openmp()  # before torch loads, as every entry point

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from robo_rl.checkpoint import build_agent, build_planner  # noqa: E402
from robo_rl.planning.qwm import QWMConfig, QWMPlanner, plan_reference  # noqa: E402
from robo_rl.utils.precision import auto_bf16  # noqa: E402

LIFT_OBS = {"object": (10,), "robot0_eef_pos": (3,), "robot0_eef_quat": (4,), "robot0_gripper_qpos": (2,), "task_id": ()}


def latency_ms(fn: Callable[[], object], rounds: int, repeats: int, sync: Callable[[], None] = lambda: None
               ) -> tuple[float, float, float]:
    """(best, median, best CPU) over rounds of the mean time of `repeats` calls, after one warm-up call:
    wall time, and this process's CPU time, which other processes on the cores do not inflate.
    `sync` waits for queued device work (CUDA kernels run asynchronously to the Python that launches them)."""
    fn()
    sync()
    times, cpu_times = [], []
    for _ in range(rounds):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(repeats):
            fn()
        sync()
        times.append((time.perf_counter() - start) / repeats * 1e3)
        cpu_times.append((time.process_time() - cpu_start) / repeats * 1e3)
    return min(times), statistics.median(times), min(cpu_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--budget", default="cpu", help="network sizes of this budget (conf/agent/size/)")
    parser.add_argument("--threads", default="auto", help="torch threads: a number, or auto (the run's policy)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--no-loop", action="store_true", help="skip the per-node loop (minutes at 1024 envs)")
    args = parser.parse_args()
    apply_thread_policy(args.threads if args.threads == "auto" else int(args.threads))
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"budget={args.budget}"])
        paper_group = compose(config_name="config", overrides=["planner=qwm_paper"]).planner
    torch.manual_seed(0)
    agent = build_agent(cfg.agent, LIFT_OBS, 1, device).eval()
    planner = build_planner(cfg.planner, cfg.train.gamma)
    defaults = planner.cfg
    wm = agent.world_model

    def pi_k(steps: int):
        return lambda latents: agent.policy.sample(latents, steps)

    pi, q = pi_k(agent.config.sample_steps), agent.q
    z = torch.randn(args.envs, agent.config.encoder.latent_dim, device=device)
    drift = torch.zeros(args.envs, agent.policy.flat_dim, device=device)
    deep = dataclasses.replace(defaults, depth=4)
    paper = build_planner(paper_group, planner.gamma).cfg

    def search(cfg: QWMConfig, policy_fn=pi) -> Callable[[], object]:
        return lambda: QWMPlanner(cfg, planner.gamma).plan(z, policy_fn, q, wm.next, drift=drift)

    def loop() -> object:
        return plan_reference(defaults, z, pi, q, wm.next, gamma=planner.gamma)

    bf16 = auto_bf16(z.device)  # what precision "auto" runs
    load_before = os.getloadavg()[0]
    timed = {}
    with torch.no_grad():
        timed["search_ms"] = latency_ms(search(defaults), args.rounds, 3, sync)
        timed["search_ms_d4"] = latency_ms(search(deep), args.rounds, 2, sync)
        timed["policy_only_ms"] = latency_ms(lambda: pi(z), args.rounds, 20, sync)
        if not args.no_loop:
            timed["loop_ms"] = latency_ms(loop, 1, 1, sync)
            with torch.autocast(z.device.type, dtype=torch.bfloat16, enabled=bf16):
                timed["loop_ms_default"] = latency_ms(loop, 1, 1, sync) if bf16 else timed["loop_ms"]
        timed["search_ms_fp32"] = latency_ms(search(dataclasses.replace(defaults, precision="fp32")), args.rounds, 3, sync)
        timed["search_ms_k1"] = latency_ms(search(defaults, policy_fn=pi_k(1)), args.rounds, 3, sync)
        timed["search_ms_paper"] = latency_ms(search(paper), args.rounds, 3, sync)
    results = {name: best for name, (best, _, _) in timed.items()}
    medians = {name: median for name, (_, median, _) in timed.items()}
    cpu = {name: cpu_best for name, (_, _, cpu_best) in timed.items()}
    if not args.no_loop:
        results["speedup_vs_loop"] = results["loop_ms"] / results["search_ms_fp32"]
        results["speedup_vs_loop_default"] = results["loop_ms_default"] / results["search_ms"]
        results["speedup_vs_loop_cpu"] = cpu["loop_ms"] / cpu["search_ms_fp32"]
        results["speedup_vs_loop_default_cpu"] = cpu["loop_ms_default"] / cpu["search_ms"]
    nodes = {name: cfg.num_actions * (1 + cfg.depth * cfg.beam * cfg.num_samples + cfg.beam * cfg.leaf_actions)
             for name, cfg in (("defaults", defaults), ("d4", deep), ("paper", paper))}
    results.update(
        envs=args.envs,
        budget=args.budget,
        device=str(device),
        medians_ms=medians,
        cpu_ms=cpu,
        policy_samples_per_env=nodes,
        config=dataclasses.asdict(defaults),
        precision="bf16" if bf16 else "fp32",
        threads=torch.get_num_threads(),
        load_average=[load_before, os.getloadavg()[0]],
        anchor_tdmpc2_mppi_ms_one_env=(600, 700),
    )

    print(f"QWM search on {device}, {args.envs} envs, {torch.get_num_threads()} threads, defaults in {results['precision']}, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'measure':<18}{'best ms':>10}{'median ms':>11}{'CPU ms':>10}   note")
    notes = {
        "search_ms": f"D=2, {nodes['defaults']} policy samples + Q per env (target <= 100)",
        "search_ms_d4": f"D=4, {nodes['d4']} per env",
        "policy_only_ms": "one flow sample per env, no search",
        "loop_ms": "plan_reference, per-node Python loop",
        "loop_ms_default": f"the loop in {'bf16' if bf16 else 'fp32'}",
        "search_ms_fp32": "defaults in fp32",
        "search_ms_k1": "defaults, one-step policy sampler",
        "search_ms_paper": f"planner=qwm_paper, {nodes['paper']} per env",
    }
    for key, note in notes.items():
        if key in results:
            print(f"{key:<18}{results[key]:>10.1f}{medians[key]:>11.1f}{cpu[key]:>10.1f}   {note}")
    if not args.no_loop:
        print(f"{'speedup_vs_loop':<18}{results['speedup_vs_loop']:>10.1f}{'':>11}"
              f"{results['speedup_vs_loop_cpu']:>10.1f}   fp32 vs fp32 (target >= 30)")
        print(f"{'  with defaults':<18}{results['speedup_vs_loop_default']:>10.1f}{'':>11}"
              f"{results['speedup_vs_loop_default_cpu']:>10.1f}   {results['precision']} search vs loop")
    print("anchor: TD-MPC2 MPPI, one env, this machine: 600-700 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
