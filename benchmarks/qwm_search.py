"""Latency of one QWM search decision for 16 envs, against policy-only acting and the per-node loop.

Nets of realistic size with random weights (latency does not depend on the weights):
  policy  SORL-style flow sampler: velocity MLP 4x512 on [z, x_t, t], k = 4 Euler steps
  critic  2 heads, 4x512 MLP with LayerNorm, stacked into one batched ensemble (min over heads)
  model   LatentWorldModel: 8 dynamics heads 3x256 and a reward head; latent 128, action 7

  search_ms        QWMPlanner.plan at the defaults (N = K = N_leaf = 8, D = 2, J = 1), all 16 envs
  search_ms_d4     the same at D = 4
  policy_only_ms   one policy sample per env: the cost of acting without search
  loop_ms          plan_reference (a Python loop over envs, candidates and nodes) at the defaults
  speedup_vs_loop  loop_ms / search_ms
  search_ms_bf16   extra: the defaults with planner.precision=bf16 (bfloat16 autocast; AMX matmuls on this CPU)
  search_ms_k1     extra: the defaults with a one-step sampler (QWMConfig.policy_steps = 1; a
                   shortcut policy can sample in one step), i.e. a plain 4x512 MLP per sample

Each latency is the best of --rounds rounds (other processes only ever slow a round down; the loop
gets one round, it takes minutes); the median is reported beside it, with the load average seen.
--threads defaults to 1: with other processes on the 2 cores, 2 intra-op threads ran 3-8x slower
than 1 here (they wait on each other). Anchor on this machine: TD-MPC2's MPPI planner takes
600-700 ms for ONE env's decision.

    python benchmarks/qwm_search.py --json OUT [--rounds 5] [--envs 16] [--threads 1]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from robo_rl.agents.world_model import LatentWorldModel
from robo_rl.planning.qwm import QWMConfig, QWMPlanner, plan_reference

LATENT, ACTION, HIDDEN = 128, 7, 512


class FlowPolicy(nn.Module):
    """Stand-in for the shortcut-flow policy at inference: k Euler steps of a 4x512 velocity MLP."""

    def __init__(self, steps: int = 4):
        super().__init__()
        self.steps = steps
        layers, dim = [], LATENT + ACTION + 1
        for _ in range(4):
            layers += [nn.Linear(dim, HIDDEN), nn.GELU()]
            dim = HIDDEN
        self.velocity = nn.Sequential(*layers, nn.Linear(HIDDEN, ACTION))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = torch.randn(z.shape[0], ACTION, dtype=z.dtype, device=z.device)
        for i in range(self.steps):
            t = torch.full((z.shape[0], 1), i / self.steps, dtype=z.dtype, device=z.device)
            x = x + self.velocity(torch.cat([z, x, t], -1)) / self.steps
        return x.clamp(-1.0, 1.0)


class TwinCritic(nn.Module):
    """Stand-in for the critic: 2 heads of a 4x512 LayerNorm MLP as stacked weights, min over heads."""

    def __init__(self, heads: int = 2):
        super().__init__()
        dims = [LATENT + ACTION] + [HIDDEN] * 4 + [1]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(heads, i, o) / math.sqrt(i)) for i, o in zip(dims[:-1], dims[1:])
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(heads, 1, o)) for o in dims[1:])

    def forward(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([z, a], -1).expand(self.weights[0].shape[0], -1, -1)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < len(self.weights) - 1:
                x = nn.functional.gelu(nn.functional.layer_norm(x, x.shape[-1:]))
        return x.squeeze(-1).min(0).values


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
    policy, critic = FlowPolicy().eval(), TwinCritic().eval()
    model = LatentWorldModel(LATENT, ACTION, reward=True).eval()
    z = torch.randn(args.envs, LATENT)
    defaults, deep = QWMConfig(), QWMConfig(depth=4)

    def search(cfg: QWMConfig, nets=(policy, critic, model), latents=z) -> Callable[[], object]:
        pi, q, wm = nets
        return lambda: QWMPlanner(cfg).plan(latents, pi, q, wm.next, reward=wm.reward)

    load_before = os.getloadavg()[0]
    results = {}
    with torch.inference_mode():
        results["search_ms"], search_median = latency_ms(search(defaults), args.rounds, 3)
        results["search_ms_d4"], d4_median = latency_ms(search(deep), args.rounds, 2)
        results["policy_only_ms"], policy_median = latency_ms(lambda: policy(z), args.rounds, 20)
        results["loop_ms"], loop_median = latency_ms(
            lambda: plan_reference(defaults, z, policy, critic, model.next, reward=model.reward), 1, 1
        )
        results["search_ms_bf16"], bf16_median = latency_ms(
            search(dataclasses.replace(defaults, precision="bf16")), args.rounds, 3
        )
        one_step = copy.deepcopy(policy)
        one_step.steps = 1
        results["search_ms_k1"], k1_median = latency_ms(search(defaults, (one_step, critic, model)), args.rounds, 3)
    results["speedup_vs_loop"] = results["loop_ms"] / results["search_ms"]
    medians = {"search_ms": search_median, "search_ms_d4": d4_median, "policy_only_ms": policy_median,
               "loop_ms": loop_median, "search_ms_bf16": bf16_median, "search_ms_k1": k1_median}
    nodes = {name: cfg.num_actions * (1 + cfg.depth * cfg.beam * cfg.num_samples + cfg.beam * cfg.leaf_actions)
             for name, cfg in (("defaults", defaults), ("d4", deep))}
    results.update(
        envs=args.envs,
        medians_ms=medians,
        policy_samples_per_env=nodes,
        config=dataclasses.asdict(defaults),
        threads=torch.get_num_threads(),
        load_average=[load_before, os.getloadavg()[0]],
        anchor_tdmpc2_mppi_ms_one_env=(600, 700),
    )

    print(f"QWM search, {args.envs} envs, {torch.get_num_threads()} threads, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'measure':<18}{'best ms':>10}{'median ms':>11}   note")
    notes = {
        "search_ms": f"D=2, {nodes['defaults']} policy samples + Q per env (target <= 100)",
        "search_ms_d4": f"D=4, {nodes['d4']} per env",
        "policy_only_ms": "one flow sample per env, no search",
        "loop_ms": "plan_reference, per-node Python loop",
        "search_ms_bf16": "defaults, planner.precision=bf16 (autocast)",
        "search_ms_k1": "defaults, one-step policy sampler",
    }
    for key, note in notes.items():
        print(f"{key:<18}{results[key]:>10.1f}{medians[key]:>11.1f}   {note}")
    print(f"{'speedup_vs_loop':<18}{results['speedup_vs_loop']:>10.1f}{'':>11}   target >= 30")
    print("anchor: TD-MPC2 MPPI, one env, this machine: 600-700 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
