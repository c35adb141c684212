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


# Activations [E, B, H] of at least this many elements (2 MB in fp32, one core's L2 here) run one
# member at a time without autograd (see EnsembleMLP._forward_members). Measured crossover (CPU ms,
# stacked vs members): 2 x 256 x 512 bf16 3.5 vs 3.9, fp32 7.9 vs 7.5; 8 x 128 x 256 (the world
# model in the search) bf16 4.0 vs 4.9, fp32 6.1 vs 4.6; 2 x 1024 x 512 (the search's critic) below.
_STACKED_CACHE_LIMIT = 2**19


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
    Large batches without autograd on CPU (the planner's critic) run one member at a time instead
    (`_forward_members`, with LayerNorm): the same function, faster once [E, B, H] outgrows the cache.
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
        members = self.num_members if heads is None else len(heads)
        widest = max(linear.weight.shape[-1] for linear in self.linears)
        if (not torch.is_grad_enabled() and x.device.type == "cpu" and self.norms is not None
                and members * x.shape[-2] * widest >= _STACKED_CACHE_LIMIT):
            return self._forward_members(x, heads)
        *hidden, last = self.linears
        for i, linear in enumerate(hidden):
            x = linear(x, heads, detach_params)
            if self.norms is not None:
                x = self.norms[i](x, heads, detach_params)
            x = F.gelu(x)
        return last(x, heads, detach_params)

    def _forward_members(self, x: torch.Tensor, heads: torch.Tensor | None) -> torch.Tensor:
        """forward without autograd, one member at a time: x [B, in] or [E, B, in] -> [E', B, out].

        Past the cache the stacked layers cost more than their FLOPs: each of baddbmm's bias copy,
        layer_norm, the per-member affine and GELU streams the whole [E, B, H] activation, and under
        bf16 autocast baddbmm also casts it. Per member, `linear` adds the bias in its GEMM and
        `layer_norm` applies the affine in its own pass on a [B, H] activation that stays in L2.
        Measured (benchmarks/qwm_search.py's critic, B = 1024, CPU ms on 1 of 2 loaded cores): 2 heads
        fp32 35 -> 29, bf16 16 -> 9.5; 10 heads fp32 242 -> 149, bf16 153 -> 51. The whole default
        search (interleaved runs): bf16 140 -> 110, fp32 348 -> 311, with 10 heads bf16 518 -> 245.
        """
        *hidden, last = self.linears
        outputs = []
        for e in range(self.num_members) if heads is None else heads.tolist():
            h = x if x.dim() == 2 else x[e if heads is None else len(outputs)]
            for linear, norm in zip(hidden, self.norms):
                h = F.linear(h, linear.weight[e].t(), linear.bias[e, 0])
                h = F.gelu(F.layer_norm(h, h.shape[-1:], norm.weight[e, 0], norm.bias[e, 0], norm.eps))
            outputs.append(F.linear(h, last.weight[e].t(), last.bias[e, 0]))
        return torch.stack(outputs)


def _select(param: torch.Tensor, heads: torch.Tensor | None, detach: bool) -> torch.Tensor:
    param = param if heads is None else param.index_select(0, heads)
    return param.detach() if detach else param


@torch.no_grad()
def ema_update_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging in place, one fused op: target <- (1 - tau) * target + tau * online (parameters)."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
