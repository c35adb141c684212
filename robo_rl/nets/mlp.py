"""Layers the encoder, policy, critic and world model are built from.

`mlp` is a plain MLP (Linear -> LayerNorm -> GELU: TD-MPC2's layout with SORL's activation; Mish
costs ~10x GELU on CPU, where it took a quarter of an update). `EnsembleMLP` holds E such MLPs
as stacked parameters [E, in, out] and evaluates them with one batched matmul per layer, so an
E-head critic costs E-times the FLOPs but not E-times the Python. `SimNorm` keeps latents on a
product of simplices. `ema_update_` is the Polyak averaging every target network uses.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class SimNorm(nn.Module):
    """Simplicial normalisation (TD-MPC2): softmax over consecutive groups of `group_dim` features.

    [..., D] -> [..., D]; D must be a multiple of `group_dim`. Bounded latents keep the critic and a
    latent dynamics model from drifting to large magnitudes.
    """

    def __init__(self, group_dim: int = 8):
        super().__init__()
        self.group_dim = group_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.group_dim)).softmax(-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"group_dim={self.group_dim}"


def mlp(
    in_dim: int,
    hidden_dims: Sequence[int],
    out_dim: int,
    *,
    layer_norm: bool = True,
    out_layer: nn.Module | None = None,
) -> nn.Sequential:
    """[..., in_dim] -> [..., out_dim]: (Linear -> LayerNorm -> GELU) per hidden layer, then Linear.

    out_layer: appended after the last Linear (e.g. `SimNorm`, `nn.Tanh`).
    """
    layers: list[nn.Module] = []
    for dim_in, dim_out in zip([in_dim, *hidden_dims], hidden_dims):
        layers.append(nn.Linear(dim_in, dim_out))
        if layer_norm:
            layers.append(nn.LayerNorm(dim_out))
        layers.append(nn.GELU())
    layers.append(nn.Linear(hidden_dims[-1] if hidden_dims else in_dim, out_dim))
    if out_layer is not None:
        layers.append(out_layer)
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """E independent Linear layers: x [E, B, in] (or a shared [B, in]) -> [E, B, out].

    heads:          optional index tensor [E'] to evaluate only those members (output [E', B, out]).
    detach_params:  use the weights as constants, so gradients reach x but not this layer.
    """

    def __init__(self, num_members: int, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_members, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_dim))
        # Each member initialised like nn.Linear: U(-1/sqrt(in), 1/sqrt(in)).
        bound = 1.0 / math.sqrt(in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self, x: torch.Tensor, heads: torch.Tensor | None = None, detach_params: bool = False
    ) -> torch.Tensor:
        weight, bias = _select(self.weight, heads, detach_params), _select(self.bias, heads, detach_params)
        if x.dim() == 2:  # an input shared by all members: a stride-0 view, no copy
            x = x.expand(weight.shape[0], *x.shape)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        members, in_dim, out_dim = self.weight.shape
        return f"members={members}, in_dim={in_dim}, out_dim={out_dim}"


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim with a separate affine (scale, shift) per member: [E, B, D]."""

    def __init__(self, num_members: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, dim))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, heads: torch.Tensor | None = None, detach_params: bool = False
    ) -> torch.Tensor:
        weight, bias = _select(self.weight, heads, detach_params), _select(self.bias, heads, detach_params)
        return torch.addcmul(bias, F.layer_norm(x, x.shape[-1:], eps=self.eps), weight)


class EnsembleMLP(nn.Module):
    """E MLPs with the layout of `mlp`, parameters stacked along a leading member dim.

    forward(x [B, in] or [E, B, in]) -> [E, B, out]; `heads` / `detach_params` as in EnsembleLinear.
    """

    def __init__(
        self, num_members: int, in_dim: int, hidden_dims: Sequence[int], out_dim: int, *, layer_norm: bool = True
    ):
        super().__init__()
        if not hidden_dims:
            raise ValueError("EnsembleMLP needs at least one hidden layer; got hidden_dims=()")
        dims = [in_dim, *hidden_dims, out_dim]
        self.num_members = num_members
        self.linears = nn.ModuleList(EnsembleLinear(num_members, i, o) for i, o in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(EnsembleLayerNorm(num_members, d) for d in hidden_dims) if layer_norm else None

    def forward(
        self, x: torch.Tensor, heads: torch.Tensor | None = None, detach_params: bool = False
    ) -> torch.Tensor:
        *hidden, last = self.linears
        for i, linear in enumerate(hidden):
            x = linear(x, heads, detach_params)
            if self.norms is not None:
                x = self.norms[i](x, heads, detach_params)
            x = F.gelu(x)
        return last(x, heads, detach_params)


def _select(param: torch.Tensor, heads: torch.Tensor | None, detach: bool) -> torch.Tensor:
    param = param if heads is None else param.index_select(0, heads)
    return param.detach() if detach else param


@torch.no_grad()
def ema_update_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging in place, one fused op: target <- (1 - tau) * target + tau * online (parameters)."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
