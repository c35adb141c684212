"""Data-parallel SORL updates: two gloo ranks (real torch.distributed processes) against one process."""
from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as tmp
from test_sorl_agent import ACTION_DIM, LIFT_SHAPES, small_config, synthetic_batch

from robo_rl.agents.sorl import SORLAgent
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.utils import distributed

# Rows per rank: a multiple of log2(flow_steps) = 3, so self-consistency's step sizes per row match, and of
# the world model's 8 heads, so each head's share of the sequences (split_batch) is the same rows as in one process.
B, H = 24, 3


def fix_randomness(mp: pytest.MonkeyPatch) -> None:
    """Every draw of the update (flow noise and times, self-consistency times, the q_steps draw, REDQ head
    subsets, bootstrap weights) made deterministic and the same for every row of a batch, so the rows a
    rank holds get the noise they get in the concatenated batch; the comparison below is then exact."""

    def pattern(shape, dtype=None, device=None, **_):
        shape = tuple(shape)
        row = torch.linspace(-1.5, 1.5, math.prod(shape[1:]), dtype=dtype or torch.float32, device=device)
        return row.reshape(shape[1:]).expand(shape).clone() if shape else torch.tensor(0.3, dtype=dtype)

    def randint(*args, size=None, dtype=torch.int64, device=None, **_):
        *bounds, size = args if size is None else (*args, size)
        low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
        return torch.full(tuple(size), (low + high - 1) // 2, dtype=dtype, device=device)

    mp.setattr(torch, "randn", lambda *size, **kw: pattern(size[0] if len(size) == 1 and not isinstance(size[0], int)
                                                           else size, **kw))
    mp.setattr(torch, "randn_like", lambda x, **kw: pattern(x.shape, x.dtype, x.device))
    mp.setattr(torch, "rand_like", lambda x, **kw: torch.full_like(x, 0.37))
    mp.setattr(torch, "randint", randint)
    mp.setattr(torch, "randperm", lambda n, **kw: torch.arange(n, device=kw.get("device")))
    mp.setattr(torch, "poisson", lambda w, **kw: w.clone())


def batches(n: int) -> tuple[dict, dict]:
    """n rows of replay batch and of world-model sequences ([n, H+1, ...] obs)."""
    torch.manual_seed(1)
    batch = synthetic_batch(LIFT_SHAPES, n)
    seq = {"obs": {k: torch.randn(n, H + 1, *s) for k, s in LIFT_SHAPES.items()},
           "action": torch.rand(n, H, ACTION_DIM) * 2 - 1, "reward": torch.rand(n, H),
           "terminal": torch.zeros(n, H, dtype=torch.bool)}
    return batch, seq


def rows(tree, lo: int, hi: int):
    return {k: rows(v, lo, hi) for k, v in tree.items()} if isinstance(tree, dict) else tree[lo:hi]


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    assert distributed.init_from_env("cpu") == (rank, world)
    with pytest.MonkeyPatch.context() as mp:
        torch.manual_seed(rank)  # different initial weights: rank 0's must reach every rank
        agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(world_model=WorldModelConfig(split_batch=True)))
        distributed.broadcast_module_(agent)
        fix_randomness(mp)
        batch, seq = batches(world * B)
        agent.update(rows(batch, rank * B, (rank + 1) * B), rows(seq, rank * B, (rank + 1) * B))
    torch.save(agent.state_dict(), f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_make_the_update_of_one_process_on_both_batches(tmp_path, monkeypatch):
    tmp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    torch.manual_seed(0)
    reference = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(world_model=WorldModelConfig(split_batch=True)))
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    fix_randomness(monkeypatch)
    reference.update(*batches(2 * B))

    # Adam's first step is ~lr * grad / (|grad| + eps): an element whose gradient is ~eps moves by what the
    # summation order leaves of it (seen: 1e-6 on 1 of 80k weights, 1.8e-5 on 2 of 524k), so a few may differ.
    # Without the gradient average, or with heads given other rows than in one process, ranks differ by ~lr
    # in most elements.
    changed = 0
    for name, value in reference.state_dict().items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"ranks differ in {name}"
        far = ~torch.isclose(ranks[0][name], value, rtol=1e-5, atol=1e-5)
        assert far.sum() <= max(2, 1e-5 * value.numel()), f"{name}: {int(far.sum())} of {value.numel()} differ"
        changed += not torch.equal(value, before[name])
    assert changed > 20  # the update moved the encoder, policy, critic and world model (and their targets)
