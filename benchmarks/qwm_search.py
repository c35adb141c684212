"""Latency of one QWM search decision for 16 envs, against policy-only acting and the per-node loop.

robo_rl's own nets at paper size with random weights (latency does not depend on the weights):
  policy  ShortcutFlowPolicy, velocity MLP 4x512, k = 4 Euler steps
  critic  QEnsemble, 2 heads of 4x512 LayerNorm MLPs as stacked weights, mean over heads
  model   LatentWorldModel: 8 dynamics heads 3x256 and a reward head; latent 128, action 7

  search_ms        QWMPlanner.plan at the defaults (N = K = N_leaf = 8, D = 2, J = 1), all 16 envs;
                   precision "auto" = bfloat16 autocast where native (AMX CPUs, CUDA), else fp32
                   (JSON `precision` says which ran)
  search_ms_d4     the same at D = 4
  policy_only_ms   one policy sample per env: the cost of acting without search
  loop_ms          plan_reference (a Python loop over envs, candidates and nodes) at the defaults, fp32
  search_ms_fp32   the defaults in fp32
  speedup_vs_loop  loop_ms / search_ms_fp32: batching alone, both in fp32
  speedup_vs_loop_default  loop_ms / search_ms
  search_ms_k1     extra: the defaults with a one-step sampler (a shortcut policy can sample in one
                   step), i.e. one 4x512 MLP call per sample
  search_ms_10head extra: the defaults with the agent's default 10-head critic

Each latency is the best of --rounds rounds (other processes only ever slow a round down; the loop
gets one round, it takes minutes); the median is reported beside it, with the load average seen.
--threads defaults to 1: with other processes on the 2 cores, 2 intra-op threads ran 3-8x slower
than 1 here (they wait on each other). Anchor on this machine: TD-MPC2's MPPI planner takes
600-700 ms for ONE env's decision.

    python benchmarks/qwm_search.py --json OUT [--rounds 5] [--envs 16] [--threads 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from robo_rl.agents.critic import QEnsemble
from robo_rl.agents.policy import ShortcutFlowPolicy
from robo_rl.agents.world_model import LatentWorldModel
from robo_rl.planning.qwm import QWMConfig, QWMPlanner, native_bf16, plan_reference

LATENT, ACTION, HIDDEN = 128, 7, 512


def latency_ms(fn: Callable[[], object], rounds: int, repeats: int) -> tuple[float, float]:
    """(best, median) over rounds of the mean wall time of `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats * 1e3)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    policy = ShortcutFlowPolicy(LATENT, ACTION, (HIDDEN,) * 4, sample_steps=4).eval()
    two_heads, ten_heads = (QEnsemble(LATENT, ACTION, (HIDDEN,) * 4, num_heads=e).eval() for e in (2, 10))
    model = LatentWorldModel(LATENT, ACTION, reward=True).eval()

    def pi_k(steps: int):
        return lambda latents: policy.sample(latents, steps)

    def critic(heads: QEnsemble):
        return lambda latents, actions: heads(latents, actions).mean(0)

    pi, q = pi_k(4), critic(two_heads)
    z = torch.randn(args.envs, LATENT)
    defaults, deep = QWMConfig(), QWMConfig(depth=4)

    def search(cfg: QWMConfig, policy_fn=pi, q_fn=q) -> Callable[[], object]:
        return lambda: QWMPlanner(cfg).plan(z, policy_fn, q_fn, model.next, reward=model.reward)

    load_before = os.getloadavg()[0]
    results = {}
    with torch.inference_mode():
        results["search_ms"], search_median = latency_ms(search(defaults), args.rounds, 3)
        results["search_ms_d4"], d4_median = latency_ms(search(deep), args.rounds, 2)
        results["policy_only_ms"], policy_median = latency_ms(lambda: pi(z), args.rounds, 20)
        results["loop_ms"], loop_median = latency_ms(
            lambda: plan_reference(defaults, z, pi, q, model.next, reward=model.reward), 1, 1
        )
        results["search_ms_fp32"], fp32_median = latency_ms(
            search(dataclasses.replace(defaults, precision="fp32")), args.rounds, 3
        )
        results["search_ms_k1"], k1_median = latency_ms(search(defaults, policy_fn=pi_k(1)), args.rounds, 3)
        results["search_ms_10head"], ten_median = latency_ms(
            search(defaults, q_fn=critic(ten_heads)), args.rounds, 3
        )
    results["speedup_vs_loop"] = results["loop_ms"] / results["search_ms_fp32"]
    results["speedup_vs_loop_default"] = results["loop_ms"] / results["search_ms"]
    medians = {"search_ms": search_median, "search_ms_d4": d4_median, "policy_only_ms": policy_median,
               "loop_ms": loop_median, "search_ms_fp32": fp32_median, "search_ms_k1": k1_median,
               "search_ms_10head": ten_median}
    nodes = {name: cfg.num_actions * (1 + cfg.depth * cfg.beam * cfg.num_samples + cfg.beam * cfg.leaf_actions)
             for name, cfg in (("defaults", defaults), ("d4", deep))}
    results.update(
        envs=args.envs,
        medians_ms=medians,
        policy_samples_per_env=nodes,
        config=dataclasses.asdict(defaults),
        precision="bf16" if native_bf16(z.device) else "fp32",
        threads=torch.get_num_threads(),
        load_average=[load_before, os.getloadavg()[0]],
        anchor_tdmpc2_mppi_ms_one_env=(600, 700),
    )

    print(f"QWM search, {args.envs} envs, {torch.get_num_threads()} threads, defaults in {results['precision']}, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'measure':<18}{'best ms':>10}{'median ms':>11}   note")
    notes = {
        "search_ms": f"D=2, {nodes['defaults']} policy samples + Q per env (target <= 100)",
        "search_ms_d4": f"D=4, {nodes['d4']} per env",
        "policy_only_ms": "one flow sample per env, no search",
        "loop_ms": "plan_reference, per-node Python loop",
        "search_ms_fp32": "defaults in fp32",
        "search_ms_k1": "defaults, one-step policy sampler",
        "search_ms_10head": "defaults, 10-head critic",
    }
    for key, note in notes.items():
        print(f"{key:<18}{results[key]:>10.1f}{medians[key]:>11.1f}   {note}")
    print(f"{'speedup_vs_loop':<18}{results['speedup_vs_loop']:>10.1f}{'':>11}   fp32 vs fp32 (target >= 30)")
    print(f"{'  with defaults':<18}{results['speedup_vs_loop_default']:>10.1f}{'':>11}   {results['precision']} search vs fp32 loop")
    print("anchor: TD-MPC2 MPPI, one env, this machine: 600-700 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
