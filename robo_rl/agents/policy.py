"""Shortcut-flow policy (SORL, arXiv 2505.22866): a flow-matching policy that also knows its step size.

The velocity net v(z, x_t, t, d) is conditioned on d = log2(number of Euler steps), so one network
samples with 1, 2, 4, ... or `max_steps` steps. Training (see `flow_matching_loss`,
`self_consistency_loss`):
  * flow matching at the finest step size 1/max_steps, target x1 - (1 - eps) x0;
  * self-consistency: one step with 2^d steps must equal two half steps (2^(d+1) steps) of the
    EMA target net, so coarse step sizes inherit what the fine ones learned.
Sampling runs k Euler steps from Gaussian noise and clips to [-1, 1]. Actions may be chunks of h
consecutive actions, flattened to [B, h * A].
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from robo_rl.nets.mlp import mlp


class ShortcutFlowPolicy(nn.Module):
    """Velocity net v(z [B, Z], x_t [B, h*A], t [B, 1], d [B, 1]) -> [B, h*A].

    max_steps:    finest number of Euler steps (a power of 2); flow matching trains this step size.
    sample_steps: default k for `sample`.
    t_epsilon:    the path x_t = (1 - (1 - eps) t) x0 + t x1 keeps a little noise at t = 1.
    """

    def __init__(
        self,
        latent_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (512, 512, 512, 512),
        *,
        horizon: int = 1,
        max_steps: int = 8,
        sample_steps: int = 4,
        layer_norm: bool = True,
        t_epsilon: float = 1e-5,
    ):
        super().__init__()
        if max_steps < 2 or max_steps & (max_steps - 1):
            raise ValueError(f"max_steps must be a power of 2 >= 2; got {max_steps}")
        self.action_dim, self.horizon = action_dim, horizon
        self.flat_dim = action_dim * horizon
        self.max_steps, self.t_epsilon = max_steps, t_epsilon
        self.log2_max_steps = int(math.log2(max_steps))
        self.sample_steps = self._check_steps(sample_steps)
        self.net = mlp(latent_dim + self.flat_dim + 2, hidden_dims, self.flat_dim, layer_norm=layer_norm)

    def velocity(self, z: torch.Tensor, x: torch.Tensor, t: torch.Tensor, log2_steps: torch.Tensor) -> torch.Tensor:
        """z [B, Z], x [B, h*A], t [B, 1] in [0, 1), log2_steps d [B, 1] -> v [B, h*A].

        d enters scaled to [0, 1] (d / log2(max_steps)) so it sits in the range of the other inputs.
        """
        return self.net(torch.cat([z, x, t, log2_steps / self.log2_max_steps], -1))

    def sample(self, z: torch.Tensor, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """z [B, Z] -> actions [B, h*A] in [-1, 1] by `steps` Euler steps from noise [B, h*A] (default N(0, I)).

        Differentiable: the actor's Q term backpropagates through it.
        """
        steps = self._check_steps(steps or self.sample_steps)
        x = torch.randn(z.shape[0], self.flat_dim, device=z.device, dtype=z.dtype) if noise is None else noise
        log2_steps = z.new_full((z.shape[0], 1), math.log2(steps))
        for i in range(steps):
            x = x + self.velocity(z, x, z.new_full((z.shape[0], 1), i / steps), log2_steps) / steps
        return x.clamp(-1.0, 1.0)

    def sample_best_of_n(
        self,
        z: torch.Tensor,
        n: int,
        q_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        steps: int | None = None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Test-time scaling: sample n candidates per state, keep the one q_fn scores highest.

        z [B, Z], q_fn(z [B*n, Z], a [B*n, h*A]) -> [B*n], noise [B, n, h*A] -> actions [B, h*A].
        All candidates go through the policy and the critic as one batch.
        """
        z_rep = repeat(z, "b z -> (b n) z", n=n)
        flat_noise = None if noise is None else rearrange(noise, "b n a -> (b n) a")
        candidates = self.sample(z_rep, steps, flat_noise)
        best = rearrange(q_fn(z_rep, candidates), "(b n) -> b n", n=n).argmax(-1)  # [B]
        candidates = rearrange(candidates, "(b n) a -> b n a", n=n)
        return candidates[torch.arange(z.shape[0], device=z.device), best]

    def flow_matching_loss(self, z: torch.Tensor, actions: torch.Tensor, rows: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """Flow matching at the finest step size: z [B, Z], dataset actions x1 [B, h*A] -> scalar.

        t is drawn on the grid {0, 1/M, ..., (M-1)/M} the M-step sampler visits.
        rows: optional bool [B]; only these rows are cloned (the mean over them; 0 when there are none).
        """
        x1 = actions
        x0 = torch.randn_like(x1)
        t = torch.randint(0, self.max_steps, (x1.shape[0], 1), device=x1.device).to(x1.dtype) / self.max_steps
        x_t = (1 - (1 - self.t_epsilon) * t) * x0 + t * x1
        log2_steps = torch.full_like(t, self.log2_max_steps)
        error = (self.velocity(z, x_t, t, log2_steps) - (x1 - (1 - self.t_epsilon) * x0)).square().mean(-1)  # [B]
        if rows is None:
            return error.mean()
        return (error * rows).sum() / rows.sum().clamp_min(1)

    def self_consistency_loss(
        self, z: torch.Tensor, actions: torch.Tensor, target: ShortcutFlowPolicy, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One step of size 1/2^d must equal two steps of size 1/2^(d+1) by the (EMA) `target` policy.

        z [B, Z], actions [B, h*A] -> scalar. The batch is split evenly across d = 0 .. log2(M) - 1
        (step counts 1, 2, ..., M/2); t is drawn on each row's step grid. rows: optional bool [B], the rows
        averaged over (default all; masked rather than indexed, so shapes stay fixed for torch.compile).
        """
        x1 = actions
        log2_steps = (torch.arange(x1.shape[0], device=x1.device) % self.log2_max_steps).to(x1.dtype)[:, None]  # [B, 1]
        steps = 2.0**log2_steps
        t = torch.floor(torch.rand_like(steps) * steps) / steps
        x0 = torch.randn_like(x1)
        x_t = (1 - (1 - self.t_epsilon) * t) * x0 + t * x1
        with torch.no_grad():
            half = 0.5 / steps
            v_first = target.velocity(z, x_t, t, log2_steps + 1)
            v_second = target.velocity(z, x_t + half * v_first, t + half, log2_steps + 1)
            v_target = (v_first + v_second) / 2
        velocity = self.velocity(z, x_t, t, log2_steps)
        if rows is None:
            return F.mse_loss(velocity, v_target)
        # Rows left out regress onto themselves (zero error, zero gradient); rescaled to the mean over the
        # rows kept. With every row kept the factor is exactly 1, so the loss equals the unmasked one bit for
        # bit (an offline phase whose rows are all cloned is unchanged by the mask).
        v_target = torch.where(rows[:, None], v_target, velocity.detach())
        return F.mse_loss(velocity, v_target) * (rows.numel() / rows.sum().clamp_min(1))

    def _check_steps(self, steps: int) -> int:
        if steps < 1 or steps > self.max_steps or steps & (steps - 1):
            raise ValueError(
                f"steps must be a power of 2 in [1, {self.max_steps}] (the trained step sizes); got {steps}"
            )
        return steps
