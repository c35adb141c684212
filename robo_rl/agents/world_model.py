"""Latent world model: an ensemble of residual dynamics heads z' = z + Δ_e(z, a) on encoder latents.

Why an ensemble and not a learned Gaussian: the QWM search branches on the K next-latent samples
of each action, and what it should branch on early in fine-tuning, with few real transitions, is
*epistemic* uncertainty (the model does not know yet), which E independently initialised and
bootstrapped heads express by disagreeing where data is thin. A Gaussian head expresses *aleatoric*
noise, which is small for these simulated arms (MuJoCo is deterministic given the full state).
Sample k of an input uses head (offset + k) mod E with a random offset per input, so each sample is
marginally a uniform draw from the ensemble, and K = E samples visit every head exactly once.

The heads are E stacked MLPs evaluated with one batched matmul per layer (no Python loop over heads).
Each head rolls out its own latent trajectory during training. Bootstrapping is the online kind:
every head sees the whole batch, with per-sequence Poisson(1) loss weights drawn per head, which
decorrelates the heads at no extra compute. With split_batch each head instead trains on its own
disjoint 1/E of the sequences (still Poisson-weighted), which divides the loss's cost by E.

Training (`loss`) is TD-MPC2's multi-step latent consistency on real sub-trajectories:
    z_0 = encoder(o_0);  ẑ_{t+1} = next_e(ẑ_t, a_t);  L = c/H Σ_t ρ^t ‖ẑ_{t+1} − sg(encoder(o_{t+1}))‖²
plus optional reward and termination heads (MSE / BCE on the predicted latents). As in TD-MPC2, the
targets come from the same online encoder under stop-gradient, not from a lagging target encoder: the
planner starts from online latents and scores predicted ones with a critic trained on online latents,
so that is the space the model must predict in. Gradients reach the encoder through z_0 only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from robo_rl.nets.mlp import EnsembleMLP, mlp

Encoder = Callable[[dict[str, Tensor]], Tensor]  # obs {key: [B, ...]} -> z [B, Z]


@dataclass
class WorldModelConfig:
    """LatentWorldModel's options, as the agent config carries them (enabled=False: no world model)."""

    enabled: bool = True
    num_heads: int = 8
    hidden_dim: int = 256
    num_layers: int = 3
    reward: bool = False  # sparse success tasks end at the reward: Q alone carries it
    termination: bool = False
    rho: float = 0.5
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    termination_coef: float = 1.0
    bootstrap: bool = True
    split_batch: bool = False

    def build(self, latent_dim: int, action_dim: int) -> LatentWorldModel | None:
        if not self.enabled:
            return None
        options = {k: v for k, v in asdict(self).items() if k != "enabled"}
        return LatentWorldModel(latent_dim, action_dim, **options)


def _flatten_time(obs: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: rearrange(v, "b t ... -> (b t) ...") for k, v in obs.items()}


class LatentWorldModel(nn.Module):
    """Ensemble latent dynamics (+ optional reward / termination heads) on an encoder's latents.

    latent_dim, action_dim: Z and A.
    num_heads:          E dynamics heads. 8 matches the planner's default K = 8 samples, so every
                        sample of an action is a distinct hypothesis.
    hidden_dim, num_layers: each head's MLP (3 x 256 as in QWM's state model).
    reward, termination: build the reward head r(z, a) / termination head P(done | z, a).
    rho, consistency_coef, reward_coef, termination_coef: loss weights (TD-MPC2: 0.5, 20, 0.1, 1).
    bootstrap:          Poisson(1) per-head sequence weights (online bootstrap) in the loss.
    split_batch:        each head trains on its own 1/E of the batch's sequences (bagging without
                        replacement) instead of all of them: 1/E of the compute. The heads are E MLPs of
                        the same size as the agent's critic, so with every head on every sequence this loss
                        cost twice the rest of an update (budget=cpu nets, batch 256: 150 of 214 ms). Off by
                        default until measured in the agent: the one default Lift run with it pretrained to
                        0.55 offline, but so did the same run without it on that machine (0.50): the cause was
                        agent.q_weight 10, now 2.
    """

    def __init__(
        self,
        latent_dim: int,
        action_dim: int,
        *,
        num_heads: int = 8,
        hidden_dim: int = 256,
        num_layers: int = 3,
        reward: bool = False,
        termination: bool = False,
        rho: float = 0.5,
        consistency_coef: float = 20.0,
        reward_coef: float = 0.1,
        termination_coef: float = 1.0,
        bootstrap: bool = True,
        split_batch: bool = False,
    ):
        super().__init__()
        self.latent_dim, self.action_dim, self.num_heads = latent_dim, action_dim, num_heads
        self.rho, self.bootstrap, self.split_batch = rho, bootstrap, split_batch
        self.consistency_coef, self.reward_coef, self.termination_coef = consistency_coef, reward_coef, termination_coef
        self._dynamics = EnsembleMLP(num_heads, latent_dim + action_dim, [hidden_dim] * num_layers, latent_dim)
        with torch.no_grad():
            # Residual heads start near the identity z' = z: small random outputs keep the heads distinct,
            # and inputs unlike the training data predict little change instead of an O(1) jump.
            self._dynamics.linears[-1].weight.mul_(0.1)
            self._dynamics.linears[-1].bias.mul_(0.1)
        self._reward = mlp(latent_dim + action_dim, [hidden_dim] * 2, 1) if reward else None
        self._termination = mlp(latent_dim + action_dim, [hidden_dim] * 2, 1) if termination else None

    @property
    def has_reward(self) -> bool:
        return self._reward is not None

    @property
    def has_termination(self) -> bool:
        return self._termination is not None

    # -- the model ---------------------------------------------------------------------------------
    def _step(self, z: Tensor, a: Tensor) -> Tensor:
        """Each head advances its own latent: z [E, M, Z], a [M, A] (shared by the heads) or [E, M, A]
        -> z' [E, M, Z]."""
        za = torch.cat([z, a.expand(self.num_heads, *a.shape[-2:])], dim=-1)
        return z + self._dynamics(za)

    def dynamics(self, z: Tensor, a: Tensor) -> Tensor:
        """Every head's next latent: z [M, Z], a [M, A] -> [E, M, Z]."""
        self._check_inputs(z, a)
        return self._step(z.expand(self.num_heads, *z.shape), a)

    def next(self, z: Tensor, a: Tensor, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """K next-latent samples, one ensemble head each: z [M, Z], a [M, A] -> z' [M, K, Z]."""
        predictions = self.dynamics(z, a)  # [E, M, Z]
        rows = torch.arange(z.shape[0], device=z.device)
        offset = torch.randint(self.num_heads, (z.shape[0], 1), generator=generator, device=z.device)
        heads = (offset + torch.arange(num_samples, device=z.device)) % self.num_heads  # [M, K]
        return predictions[heads, rows[:, None]]

    def reward(self, z: Tensor, a: Tensor) -> Tensor:
        """Predicted reward of taking a in z: [M, Z], [M, A] -> [M]."""
        if self._reward is None:
            raise RuntimeError("this LatentWorldModel has no reward head; build it with reward=True")
        return self._reward(torch.cat([z, a], dim=-1)).squeeze(-1)

    def termination_logit(self, z: Tensor, a: Tensor) -> Tensor:
        """Logit of P(episode ends after taking a in z): [M, Z], [M, A] -> [M]."""
        if self._termination is None:
            raise RuntimeError("this LatentWorldModel has no termination head; build it with termination=True")
        return self._termination(torch.cat([z, a], dim=-1)).squeeze(-1)

    def terminal(self, z: Tensor, a: Tensor) -> Tensor:
        """P(episode ends after taking a in z): [M, Z], [M, A] -> [M] in [0, 1]."""
        return torch.sigmoid(self.termination_logit(z, a))

    # -- training ----------------------------------------------------------------------------------
    def loss(self, encoder: Encoder, seq: dict) -> tuple[Tensor, dict[str, float]]:
        """Multi-step latent consistency (+ reward / termination) on real sub-trajectories.

        seq: {"obs": {key: [B, H+1, ...]}, "action": [B, H, A], "reward": [B, H], "terminal": [B, H]}.
        A sequence must lie inside one episode; steps after a terminal step are ignored (their
        observations may be padding).
        Returns (scalar loss, metrics): the loss backpropagates into this model and `encoder`.
        """
        self._check_sequence(seq)
        action, reward, terminal = seq["action"], seq["reward"].float(), seq["terminal"].float()
        B, H = action.shape[:2]
        first = {k: v[:, 0] for k, v in seq["obs"].items()}
        later = {k: v[:, 1:] for k, v in seq["obs"].items()}
        with torch.no_grad():
            target = rearrange(encoder(_flatten_time(later)), "(b t) z -> t b z", b=B)  # [H, B, Z]
        # Step t is real if no earlier step of the sequence ended the episode.
        alive = torch.cumprod(F.pad(1.0 - terminal[:, :-1], (1, 0), value=1.0), dim=1).t()  # [H, B]
        rows = self._head_rows(B, action.device)  # [E, M]: the sequences each head trains on
        # [E, M, H, A], [H, E, M, Z], [H, E, M]
        head_action, head_target, head_alive = action[rows], target[:, rows], alive[:, rows]
        weight = torch.ones(rows.shape, device=action.device)
        if self.bootstrap and self.training:
            weight = torch.poisson(weight)

        z = encoder(first)[rows]  # [E, M, Z]
        latents, consistency = [], 0.0
        for t in range(H):
            latents.append(z)
            z = self._step(z, head_action[:, :, t])
            error = (z - head_target[t]).pow(2).mean(-1)  # [E, M]
            consistency = consistency + self.rho**t * (weight * head_alive[t] * error).mean()
        consistency = consistency / H
        total = self.consistency_coef * consistency
        metrics = {"consistency": consistency.item(), "ensemble_std": z.std(0, correction=0).mean().item()}

        # Reward and termination are read from the predicted latents, as the planner will see them.
        z_pred = rearrange(torch.stack(latents), "t e m z -> t (e m) z")  # [H, E*M, Z]
        a_pred = rearrange(head_action, "e m t a -> t (e m) a")
        mask = rearrange(head_alive, "t e m -> t (e m)")
        if self._reward is not None:
            r = self.reward(z_pred.flatten(0, 1), a_pred.flatten(0, 1)).view(H, -1)
            reward_loss = (mask * (r - rearrange(reward[rows], "e m t -> t (e m)")).pow(2)).mean()
            total = total + self.reward_coef * reward_loss
            metrics["reward"] = reward_loss.item()
        if self._termination is not None:
            logit = self.termination_logit(z_pred.flatten(0, 1), a_pred.flatten(0, 1)).view(H, -1)
            done = rearrange(terminal[rows], "e m t -> t (e m)")
            bce = F.binary_cross_entropy_with_logits(logit, done, reduction="none")
            termination_loss = (mask * bce).mean()
            total = total + self.termination_coef * termination_loss
            metrics["termination"] = termination_loss.item()
        metrics["loss"] = total.item()
        return total, metrics

    def _head_rows(self, batch: int, device: torch.device) -> Tensor:
        """Which of `batch` sequences each head trains on, [E, M]: all of them (M = batch), or in training
        with split_batch a random 1/E each, disjoint (M = batch // E; the remainder sits out this update).
        Dealt out in turn (head e: shuffled positions e, e+E, ...), so data-parallel ranks whose batches are
        multiples of E split their concatenation as one process would."""
        if self.split_batch and self.training and batch >= self.num_heads:
            per_head = batch // self.num_heads
            dealt = torch.randperm(batch, device=device)[: per_head * self.num_heads]
            return rearrange(dealt, "(m e) -> e m", e=self.num_heads)
        return torch.arange(batch, device=device).expand(self.num_heads, batch)

    # -- input checks ------------------------------------------------------------------------------
    def _check_inputs(self, z: Tensor, a: Tensor) -> None:
        if z.dim() != 2 or z.shape[1] != self.latent_dim:
            raise ValueError(f"z must be [M, {self.latent_dim}], got {tuple(z.shape)}")
        if a.shape != (z.shape[0], self.action_dim):
            raise ValueError(f"a must be [M={z.shape[0]}, {self.action_dim}], got {tuple(a.shape)}")

    def _check_sequence(self, seq: dict) -> None:
        action = seq["action"]
        if action.dim() != 3 or action.shape[-1] != self.action_dim:
            raise ValueError(f'seq["action"] must be [B, H, {self.action_dim}], got {tuple(action.shape)}')
        B, H = action.shape[:2]
        for name in ("reward", "terminal"):
            if seq[name].shape != (B, H):
                raise ValueError(f'seq["{name}"] must be [B={B}, H={H}], got {tuple(seq[name].shape)}')
        for key, value in seq["obs"].items():
            if value.shape[:2] != (B, H + 1):
                raise ValueError(f'seq["obs"]["{key}"] must start with [B={B}, H+1={H + 1}], got {tuple(value.shape)}')
