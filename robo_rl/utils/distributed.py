"""Data-parallel learning on torch.distributed: `torchrun --nproc_per_node=N scripts/train_qwm.py ...`.

Each rank runs the whole loop (its own envs, its own replay buffer, its own batches, seeds offset by rank)
and every gradient step averages the ranks' gradients, so the N copies of the agent stay identical and
each step learns from N batches. Rank 0 writes checkpoints, logs and evaluations.

Why an all-reduce of the flat gradients (`all_reduce_mean_`, called by SORLAgent.update between backward and
clipping) and not DistributedDataParallel wrappers: one SORL update is one loss over four modules (encoder,
policy, critic, world model) that reach each other through detached latents, the target networks, the
critic called with detached parameters for the actor's Q term, and the world model only when a sequence
batch exists. DDP wraps one module's forward and expects every parameter it owns to get a gradient from
that forward on every rank; wrapping each module would need find_unused_parameters and per-module hooks
for a single backward. Averaging the gradients once, before the per-module clipping, gives exactly the
update of one process on the ranks' batches concatenated (the losses are batch means of equal-sized
batches), at the cost of one all-reduce per update that is not overlapped with the backward pass.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

# Seed offset between ranks: rank 0 keeps the run's seed (its evaluations are those of a single run).
RANK_SEED_STRIDE = 1_000_003
# Ranks other than 0 wait in the next all-reduce while rank 0 evaluates or checkpoints (minutes at
# paper-scale budgets); the default 30 min would end a long evaluation with a timeout.
_TIMEOUT = timedelta(hours=6)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0, or a run without torch.distributed: the process that writes the run's files."""
    return rank() == 0


def rank_seed(seed: int) -> int:
    """The seed of this rank's envs, batches and noise: `seed` on rank 0, offset on the others."""
    return seed + RANK_SEED_STRIDE * rank()


def init_from_env(device: str) -> tuple[int, int]:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment): nccl for CUDA
    devices (each rank on GPU LOCAL_RANK), gloo on CPU. Returns (rank, world size); (0, 1) without torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = str(device).startswith("cuda")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=_TIMEOUT)
    return rank(), world_size()


def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """Average `tensors` over the ranks in place, through one flat buffer (one collective call); nothing to
    do in a single process."""
    if world_size() == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def broadcast_module_(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (initialisation and normalisation may differ by rank);
    nothing to do in a single process."""
    if world_size() == 1:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def broadcast_object(obj):
    """Rank 0's `obj` (picklable) on every rank; `obj` itself in a single process."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first, the other ranks after it: for work that writes shared files (the
    scripted-demo cache), which they then only read."""
    if world_size() > 1 and not is_main():
        dist.barrier()
    yield
    if world_size() > 1 and is_main():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (after the last collective of a run)."""
    if world_size() > 1:
        dist.destroy_process_group()
