"""Q ensemble on latents: E LayerNorm MLP heads as one stacked module, plus a Polyak-averaged target.

TD targets aggregate the target heads either REDQ-style (min over a random subset, default 2 of
10) or pessimistically (mean - beta * std). Only the heads an aggregate needs are evaluated.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from robo_rl.nets.mlp import EnsembleMLP, ema_update_

TARGET_AGGREGATIONS = ("min", "mean_std")


def mean_minus_std(q: torch.Tensor, beta: float) -> torch.Tensor:
    """Pessimistic aggregate of head values q [E, B] -> [B]: mean - beta * std (beta = 0: the mean)."""
    return q.mean(0) - beta * q.std(0) if beta else q.mean(0)


class QEnsemble(nn.Module):
    """Q(z [B, Z], a [B, A]) -> [E, B] for E heads.

    target_agg:    "min": min over `target_subset` heads drawn at random per call (REDQ; subset = E
                   is the plain min); "mean_std": mean - target_beta * std over all heads
                   (target_beta = 0 is SORL's mean).
    """

    def __init__(
        self,
        latent_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (512, 512, 512, 512),
        num_heads: int = 10,
        *,
        layer_norm: bool = True,
        target_agg: str = "min",
        target_subset: int = 2,
        target_beta: float = 0.0,
    ):
        super().__init__()
        if target_agg not in TARGET_AGGREGATIONS:
            raise ValueError(f"target_agg must be one of {TARGET_AGGREGATIONS}; got {target_agg!r}")
        if target_agg == "min" and not 1 <= target_subset <= num_heads:
            raise ValueError(f"target_subset must be in [1, num_heads={num_heads}]; got {target_subset}")
        self.num_heads = num_heads
        self.target_agg, self.target_subset, self.target_beta = target_agg, target_subset, target_beta
        self.net = EnsembleMLP(num_heads, latent_dim + action_dim, hidden_dims, 1, layer_norm=layer_norm)
        self.target_net = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, z: torch.Tensor, a: torch.Tensor, *, detach_params: bool = False) -> torch.Tensor:
        """z [B, Z], a [B, A] -> q [E, B].

        detach_params: gradients reach z and a but not the heads (the actor's Q term).
        """
        return self.net(torch.cat([z, a], -1), detach_params=detach_params).squeeze(-1)

    def disagreement(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Epistemic uncertainty: std across heads, [B]."""
        return self(z, a).std(0)

    @torch.no_grad()
    def target_value(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Aggregated target-network value for TD targets: z [B, Z], a [B, A] -> [B]."""
        x = torch.cat([z, a], -1)
        if self.target_agg == "min":
            heads = torch.randperm(self.num_heads, device=z.device)[: self.target_subset]
            return self.target_net(x, heads).squeeze(-1).min(0).values
        q = self.target_net(x).squeeze(-1)
        return mean_minus_std(q, self.target_beta)

    def update_target(self, tau: float) -> None:
        ema_update_(self.target_net, self.net, tau)
