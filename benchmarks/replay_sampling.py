"""ReplayBuffer sampling vs a per-item HDF5 loader (robomimic's SequenceDataset + torch DataLoader).

Two workloads on synthetic data written to real robomimic-format files in a temp dir:
  lowdim  batch 256 transitions with 3-step returns (Lift-sized low-dim obs)
  image   batch 256 sub-trajectories, H=3, two 84x84 cameras + low-dim obs
The baseline reads the same files with robomimic's own SequenceDataset (hdf5_cache_mode="low_dim":
low-dim arrays in memory, images read from the file per item, robomimic's mode for image datasets)
through a DataLoader with num_workers=0 (the buffer is single-process too); for the 3-step returns
it fetches 3-step sequences and sums their discounted rewards per batch.

The ceiling for the image workload: `memcpy_batches_per_s` copies the rows of one sequence batch
(every obs key, actions, rewards, terminals) as one contiguous run per array from a random offset
of the same storage, i.e. a gather with the best possible memory access and no index work. Timed
in the same alternating rounds, it bounds what any single-core gather of those bytes can reach.

Profile (cProfile, 2026-12-03, image workload, 2 loaded cores): 93% of `sample_sequences` is
inside `np.take` of the two cameras' frames (43 MB per batch: 256 x 4 x 2 x 3x84x84 uint8, copied
once, into pooled output arrays); index arithmetic (numba), the other takes and Python are the
other 7%. Gathering the 1024 frames of one camera otherwise was no faster: torch.index_select into
a preallocated tensor 2.4 GB/s and a loop of whole-window slice copies 3.9 GB/s vs np.take 3.8 GB/s
in one run; in another, np.take 6.4 GB/s vs a contiguous copy of the same bytes 7.1 GB/s. So the
image batch is bound by memory bandwidth: the buffer reaches `buffer_share_of_memcpy` of the
ceiling, and `memcpy_ceiling_speedup` is the speedup the ceiling itself would have. Measured with
--transitions 20000 --image-transitions 20000 at load 10-13: buffer 67.1 batch/s, ceiling 74.8
(90%), loader 2.03: 33x, ceiling 37x; so >= 50x is out of reach of any one-core copy here. (The
default 100k image transitions hold ~9 GB at peak, the episodes as read plus the buffer's copy;
that run was OOM-killed beside other jobs; before this change, at load ~1-4, it gave 40x.)

A second ceiling, closer to what sampling must do: `gather_batches_per_s` takes the same rows at uniform random
window starts with one np.take per array into preallocated outputs (no episode bounds, no other work), which is
the least any sampler of random windows copies. On an idle Zen 4 machine (2026-12-04, 20k transitions, three
runs): buffer 294 / 278 / 258 batch/s, random-window gather 295 / 284 (the buffer at 94% / 91% of it; first run
without it), contiguous copy 403 / 386 / 342, the loader 6.9 / 5.5 / 6.7: speedup 43x / 51x / 39x against a
random-window ceiling of 54x / 43x. The gap to the contiguous copy is random access itself: one camera's 1024
frames (21 KB each) take 1.15 ms by np.take at random starts against 0.93 ms copied contiguously, with numpy's
transparent huge pages already on (an explicit MADV_HUGEPAGE mapping measured the same). So the 50x target sits at
the ceiling of a one-core gather of random windows here, and the buffer is within 10% of that ceiling.

    python benchmarks/replay_sampling.py --json runs/bench/replay_sampling.json

JSON: buffer_batches_per_s, per_item_loader_batches_per_s, speedup (of the slower-gaining workload;
target >= 50), bytes_per_image_transition, raw_frame_bytes (target ratio <= 1.05), and per-workload
numbers under "workloads" (the image one with memcpy_batches_per_s, memcpy_ceiling_speedup,
buffer_share_of_memcpy, gather_batches_per_s, gather_ceiling_speedup and buffer_share_of_gather).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from robo_rl.data.buffer import ReplayBuffer
from robo_rl.data.hdf5 import Episode, read_hdf5, write_robomimic
from robo_rl.utils.logging import write_json

LOW_DIM = {"object": 10, "robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2}
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")
ENV_ARGS = {"env_name": "Lift", "type": 1, "env_kwargs": {}}
BATCH, NSTEP, HORIZON, GAMMA = 256, 3, 3, 0.99


class SyntheticEpisodes(Sequence):
    """Episodes made on demand (so a 100k-step image dataset never sits in memory twice)."""

    def __init__(self, num: int, length: int, image_size: int):
        self.num, self.length, self.image_size = num, length, image_size

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int) -> Episode:
        if not 0 <= i < self.num:
            raise IndexError(i)
        rng = np.random.default_rng(i)
        T = self.length
        obs = {k: rng.normal(size=(T + 1, d)).astype(np.float32) for k, d in LOW_DIM.items()}
        if self.image_size:
            shape = (T + 1, 3, self.image_size, self.image_size)
            obs.update({k: rng.integers(0, 256, size=shape, dtype=np.uint8) for k in CAMERAS})
        terminals = np.zeros(T, bool)
        terminals[-1] = True
        return Episode(obs=obs, actions=rng.uniform(-1, 1, size=(T, 7)).astype(np.float32),
                       rewards=terminals.astype(np.float32), terminals=terminals, name=f"demo_{i}")


def rate(fn, seconds: float, min_batches: int = 2) -> float:
    """Batches per second of fn() over at least `seconds`."""
    n, start = 0, time.perf_counter()
    while n < min_batches or time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def compare(fns: dict, rounds: int, seconds: float) -> dict:
    """Batches/s of each of `fns` (name -> batch function), timed in alternating rounds (the machine's
    load drifts), medians, as "<name>_batches_per_s"."""
    for fn in fns.values():  # warm up: numba compilation, file handles
        fn()
    rates = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            rates[name].append(rate(fn, seconds))
    return {f"{name}_batches_per_s": float(np.median(r)) for name, r in rates.items()}


def batch_arrays(buffer: ReplayBuffer, rows: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every array a sequence batch reads from the buffer's demonstrations, and preallocated outputs of `rows` rows."""
    part = buffer._offline
    sources = [*part.obs.values(), part.action, part.reward, part.terminal]
    return sources, [np.empty((rows, *a.shape[1:]), a.dtype) for a in sources]


def contiguous_copy(buffer: ReplayBuffer, batch: int, horizon: int, seed: int = 0):
    """The ceiling of a sequence batch: its rows of every stored array, copied as one contiguous run."""
    part, rows = buffer._offline, batch * (horizon + 1)
    sources, outputs = batch_arrays(buffer, rows)
    rng = np.random.default_rng(seed)

    def copy():
        start = rng.integers(len(part) - rows)
        for source, out in zip(sources, outputs):
            np.copyto(out, source[start : start + rows])

    return copy


def window_gather(buffer: ReplayBuffer, batch: int, horizon: int, seed: int = 0):
    """The ceiling of any sampler of random windows: `batch` windows of horizon + 1 rows at uniform random starts,
    every stored array gathered with one np.take into preallocated outputs; no episode bounds, no other work."""
    part, (sources, outputs) = buffer._offline, batch_arrays(buffer, batch * (horizon + 1))
    rng, offsets = np.random.default_rng(seed), np.arange(horizon + 1)

    def gather():
        idx = (rng.integers(len(part) - horizon, size=batch)[:, None] + offsets).reshape(-1)
        for source, out in zip(sources, outputs):
            np.take(source, idx, axis=0, out=out, mode="clip")

    return gather


def robomimic_loader(path: str, obs_keys: list[str], seq_length: int, load_next_obs: bool):
    import robomimic.utils.obs_utils as ObsUtils
    from robomimic.utils.dataset import SequenceDataset

    ObsUtils.initialize_obs_utils_with_obs_specs(
        {"obs": {"low_dim": [k for k in obs_keys if k in LOW_DIM], "rgb": [k for k in obs_keys if k in CAMERAS]}})
    dataset = SequenceDataset(path, obs_keys=obs_keys, dataset_keys=("actions", "rewards", "dones"),
                              seq_length=seq_length, hdf5_cache_mode="low_dim", load_next_obs=load_next_obs)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0, drop_last=True)
    batches = iter(loader)

    def next_batch():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    return next_batch


def nstep_from_sequences(batch: dict) -> dict:
    """The 3-step targets a learner would compute from robomimic's 3-step sequences."""
    rewards, dones = batch["rewards"], batch["dones"]  # [B, n]
    alive = torch.cumprod(1 - dones, dim=1)
    alive_before = torch.cat([torch.ones_like(alive[:, :1]), alive[:, :-1]], dim=1)
    discounts = GAMMA ** torch.arange(rewards.shape[1], dtype=rewards.dtype)
    return {"reward": (rewards * alive_before * discounts).sum(1), "discount": GAMMA ** NSTEP * alive[:, -1],
            "obs": {k: v[:, 0] for k, v in batch["obs"].items()},
            "next_obs": {k: v[:, -1] for k, v in batch["next_obs"].items()}}


def bench_lowdim(tmp: str, transitions: int, length: int, rounds: int, seconds: float) -> dict:
    path = os.path.join(tmp, "lowdim.hdf5")
    write_robomimic(path, SyntheticEpisodes(transitions // length, length, 0), ENV_ARGS)
    buffer = ReplayBuffer({k: (d,) for k, d in LOW_DIM.items()}, None, action_dim=7, capacity=1024, gamma=GAMMA)
    buffer.add_offline(read_hdf5(path).episodes)
    loader = robomimic_loader(path, list(LOW_DIM), seq_length=NSTEP, load_next_obs=True)
    return {"transitions": buffer.num_offline,
            **compare({"buffer": lambda: buffer.sample(BATCH, nstep=NSTEP),
                       "per_item_loader": lambda: nstep_from_sequences(loader())}, rounds, seconds)}


def bench_image(tmp: str, transitions: int, length: int, image_size: int, rounds: int, seconds: float) -> dict:
    path = os.path.join(tmp, "image.hdf5")
    write_robomimic(path, SyntheticEpisodes(transitions // length, length, image_size), ENV_ARGS)
    keys = [*CAMERAS, *LOW_DIM]
    shapes = {**{k: (3, image_size, image_size) for k in CAMERAS}, **{k: (d,) for k, d in LOW_DIM.items()}}
    buffer = ReplayBuffer(shapes, None, action_dim=7, capacity=1024, gamma=GAMMA)
    buffer.add_offline(read_hdf5(path, obs_keys=keys).episodes)
    image_bytes = sum(buffer._offline.obs[k].nbytes for k in CAMERAS)
    loader = robomimic_loader(path, keys, seq_length=HORIZON + 1, load_next_obs=False)
    rates = compare({"buffer": lambda: buffer.sample_sequences(BATCH, HORIZON), "per_item_loader": loader,
                     "memcpy": contiguous_copy(buffer, BATCH, HORIZON),
                     "gather": window_gather(buffer, BATCH, HORIZON)}, rounds, seconds)
    return {
        "transitions": buffer.num_offline,
        **rates,
        "memcpy_ceiling_speedup": rates["memcpy_batches_per_s"] / rates["per_item_loader_batches_per_s"],
        "buffer_share_of_memcpy": rates["buffer_batches_per_s"] / rates["memcpy_batches_per_s"],
        "gather_ceiling_speedup": rates["gather_batches_per_s"] / rates["per_item_loader_batches_per_s"],
        "buffer_share_of_gather": rates["buffer_batches_per_s"] / rates["gather_batches_per_s"],
        "bytes_per_image_transition": image_bytes / buffer.num_offline,
        "raw_frame_bytes": len(CAMERAS) * 3 * image_size * image_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=100_000, help="low-dim buffer size")
    parser.add_argument("--image-transitions", type=int, default=100_000, help="image buffer size")
    parser.add_argument("--episode-length", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per workload")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per round and method")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        workloads = {"lowdim_nstep3": bench_lowdim(tmp, args.transitions, args.episode_length, args.rounds,
                                                   args.seconds)}
        workloads["image_seq_h3"] = bench_image(tmp, args.image_transitions, args.episode_length, args.image_size,
                                                args.rounds, args.seconds)
    for w in workloads.values():
        w["speedup"] = w["buffer_batches_per_s"] / w["per_item_loader_batches_per_s"]
    headline = min(workloads.values(), key=lambda w: w["speedup"])
    image = workloads["image_seq_h3"]
    result = {
        "buffer_batches_per_s": headline["buffer_batches_per_s"],
        "per_item_loader_batches_per_s": headline["per_item_loader_batches_per_s"],
        "speedup": headline["speedup"],
        "bytes_per_image_transition": image["bytes_per_image_transition"],
        "raw_frame_bytes": image["raw_frame_bytes"],
        "workloads": workloads,
        "config": vars(args),
    }

    print(f"{'workload (batch 256)':<22} {'transitions':>11} {'buffer batch/s':>15} {'robomimic batch/s':>18} "
          f"{'speedup':>8}")
    for name, w in workloads.items():
        print(f"{name:<22} {w['transitions']:>11} {w['buffer_batches_per_s']:>15.1f} "
              f"{w['per_item_loader_batches_per_s']:>18.2f} {w['speedup']:>7.0f}x")
    print(f"image ceiling: contiguous copy of the same rows {image['memcpy_batches_per_s']:.1f} batch/s "
          f"({image['memcpy_ceiling_speedup']:.0f}x the loader); the buffer reaches "
          f"{image['buffer_share_of_memcpy']:.0%} of it")
    print(f"random-window ceiling: np.take of the same rows at random starts {image['gather_batches_per_s']:.1f} "
          f"batch/s ({image['gather_ceiling_speedup']:.0f}x the loader); the buffer reaches "
          f"{image['buffer_share_of_gather']:.0%} of it")
    ratio = image["bytes_per_image_transition"] / image["raw_frame_bytes"]
    print(f"image bytes per transition {image['bytes_per_image_transition']:.0f} vs raw frames "
          f"{image['raw_frame_bytes']} ({ratio:.3f}x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, result)


if __name__ == "__main__":
    main()
