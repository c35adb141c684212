"""Gradient updates per second of SORLAgent.update on CPU or a GPU (`--device`; Lift-sized state obs, batch 256).

Variants: the default 10-head critic and SORL's 2-head critic (actor and critic 4x512 MLPs,
19-D state obs, 7-D actions). Rounds of the variants are interleaved and the best round is the
headline (other processes only ever slow a round down); the median is reported beside it.
With the world model: the same 10-head update plus the world model's loss on 256 sequences of 3 steps
(8 dynamics heads 3x256), each head on its own 1/8 of them (split_batch, off by default) against every head on
every sequence (world_model_split_speedup).
Baseline in the same run: one critic training step (10 heads, fwd + bwd + Adam) with the stacked
ensemble layer against the same heads as a Python loop over separate MLPs.
Anchor measured earlier on this machine: SORL's own JAX code, same nets, 2-head critic: 5.2-5.5
updates/s.

    python benchmarks/offline_updates.py --json out.json [--rounds 5] [--steps 10] [--threads N] [--compile] [--batch 256]

On a machine whose cores are busy with other processes, use --threads 1: torch's intra-op threads
wait for each other at every op, and a descheduled thread stalls them all (measured here with
small nets on 2 loaded cores: 1.8 s per update with 2 threads, 0.07 s with 1).
On one H200 (`--device cuda`, 2026-12-04, batches moved from the CPU each update as the buffer's are): 58.2
updates/s with the 10-head critic, 56.4 with 2 heads, 36.9 with the world model; the stacked ensemble's
critic step 5.1x the per-head loop. At batch 256 these nets leave the GPU mostly waiting on kernel launches
(10 heads cost no more than 2), so larger batches or more updates per launch are what would use it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from robo_rl.agents.sorl import SORLAgent, SORLConfig
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.nets.mlp import EnsembleMLP, mlp

LIFT_OBS = {"object": (10,), "robot0_eef_pos": (3,), "robot0_eef_quat": (4,), "robot0_gripper_qpos": (2,)}
ACTION_DIM = 7
SORL_JAX_ANCHOR = 5.35  # updates/s, midpoint of 5.2-5.5 measured on this machine (2-head critic)


def synthetic_batch(batch: int = 256) -> dict:
    def obs() -> dict[str, torch.Tensor]:
        return {k: torch.randn(batch, *shape) for k, shape in LIFT_OBS.items()}

    return {
        "obs": obs(),
        "next_obs": obs(),
        "action": torch.rand(batch, ACTION_DIM) * 2 - 1,
        "reward": torch.rand(batch),
        "discount": torch.full((batch,), 0.99),
        "offline": torch.ones(batch, dtype=torch.bool),
    }


def synthetic_sequences(horizon: int = 3, batch: int = 256) -> dict:
    """World-model sub-trajectories of `batch` sequences: obs [B, H+1, ...], action [B, H, A]."""
    return {
        "obs": {k: torch.randn(batch, horizon + 1, *shape) for k, shape in LIFT_OBS.items()},
        "action": torch.rand(batch, horizon, ACTION_DIM) * 2 - 1,
        "reward": torch.zeros(batch, horizon),
        "terminal": torch.zeros(batch, horizon, dtype=torch.bool),
    }


def rate(fn: Callable[[], object], steps: int, sync: Callable[[], None]) -> float:
    """Calls per second; `sync` waits for the device's queued kernels before the clock stops."""
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return steps / (time.perf_counter() - start)


def critic_step(critic: nn.Module, heads: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
                batch: int) -> Callable[[], None]:
    """One TD-regression step of a 10-head critic on fixed inputs (forward, backward, Adam)."""
    critic.to(device)
    x, target = torch.randn(batch, 256 + ACTION_DIM, device=device), torch.randn(batch, device=device)
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-4)

    def step() -> None:
        loss = (heads(x).squeeze(-1) - target).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed updates per round")
    parser.add_argument("--compile", action="store_true", help="also time SORLConfig(compile=True)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice, one per core)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] (batches start on the CPU, as sampled)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (and world-model sequences)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    batch = synthetic_batch(args.batch)

    variants: dict[str, Callable[[], object]] = {}
    for heads in (10, 2):
        for compiled in (False, True) if args.compile else (False,):
            agent = SORLAgent(LIFT_OBS, ACTION_DIM, config=SORLConfig(num_critics=heads, compile=compiled),
                               device=device)
            variants[f"SORLAgent.update, {heads} heads{', compiled' if compiled else ''}"] = (
                lambda agent=agent: agent.update(batch)
            )
    # The update the online loop runs: + the world model's loss on sequences (8 heads), split_batch (each head
    # its own 1/8 of the sequences) against every head on every sequence (the default).
    sequences = synthetic_sequences(batch=args.batch)
    for split in (True, False):
        config = SORLConfig(world_model=WorldModelConfig(split_batch=split))
        agent = SORLAgent(LIFT_OBS, ACTION_DIM, config=config, device=device)
        variants[f"+ world model, {'split' if split else 'every head all'} seqs"] = (
            lambda agent=agent: agent.update(batch, sequences))
    stacked = EnsembleMLP(10, 256 + ACTION_DIM, (512,) * 4, 1)
    loop = nn.ModuleList(mlp(256 + ACTION_DIM, (512,) * 4, 1) for _ in range(10))
    variants["critic step, stacked ensemble"] = critic_step(stacked, stacked, device, args.batch)
    variants["critic step, per-head loop"] = critic_step(loop, lambda x: torch.stack([head(x) for head in loop]), device,
                                                    args.batch)

    for fn in variants.values():  # warm-up (and compilation)
        for _ in range(3):
            fn()
    load_before = os.getloadavg()[0]
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            rounds[name].append(rate(fn, args.steps, sync))
    load_after = os.getloadavg()[0]

    best = {name: max(r) for name, r in rounds.items()}
    print(f"{device}, threads {torch.get_num_threads()}, load average {load_before:.2f} -> {load_after:.2f}")
    print(f"{'variant':44s} {'best/s':>8s} {'median/s':>9s}")
    for name, r in rounds.items():
        print(f"{name:44s} {max(r):8.2f} {statistics.median(r):9.2f}")
    two_head = best["SORLAgent.update, 2 heads"]
    stacked_speedup = best["critic step, stacked ensemble"] / best["critic step, per-head loop"]
    print(f"2-head updates/s vs SORL JAX anchor {SORL_JAX_ANCHOR}: {two_head / SORL_JAX_ANCHOR:.2f}x")
    print(f"stacked ensemble vs per-head loop (same run): {stacked_speedup:.2f}x")
    print(f"with the world model, split vs every head on every sequence: "
          f"{best['+ world model, split seqs'] / best['+ world model, every head all seqs']:.2f}x")

    results = {
        "updates_per_s": best["SORLAgent.update, 10 heads"],
        "updates_per_s_2head": two_head,
        "updates_per_s_median": statistics.median(rounds["SORLAgent.update, 10 heads"]),
        "updates_per_s_2head_median": statistics.median(rounds["SORLAgent.update, 2 heads"]),
        "ratio_2head_vs_sorl_jax_anchor": two_head / SORL_JAX_ANCHOR,
        "stacked_vs_loop_critic_step": stacked_speedup,
        "updates_per_s_world_model": best["+ world model, split seqs"],
        "updates_per_s_world_model_unsplit": best["+ world model, every head all seqs"],
        "world_model_split_speedup": best["+ world model, split seqs"] / best["+ world model, every head all seqs"],
        "rounds": rounds,
        "load_average": [load_before, load_after],
        "threads": torch.get_num_threads(),
        "device": str(device),
        "batch_size": args.batch,
    }
    if args.compile:
        results["updates_per_s_compiled"] = best["SORLAgent.update, 10 heads, compiled"]
        results["updates_per_s_2head_compiled"] = best["SORLAgent.update, 2 heads, compiled"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
