"""SORL agent (arXiv 2505.22866) on a learned latent: encoder -> z; shortcut-flow policy and Q ensemble on z.

One `update` is one gradient step of everything on one replay batch:
  critic: TD regression of every head on r + discount * max_n agg(Q_target(z', a'_n)), a'_n = pi(z', k) for
          n = 1..target_best_of_n, where z' comes from the EMA target encoder and k is drawn from `q_steps`;
  actor:  fm_weight * flow matching (on the batch's demonstration rows, bc_data; none without demos)
          + sc_weight * self-consistency (vs. the EMA target policy)
          - q_weight * Q(z, pi(z, k)) / mean|Q|, backpropagating through the k-step sampler.
The encoder learns from the critic and flow-matching losses; the self-consistency and Q terms see
a detached z, and the Q term leaves the critic's weights alone. Both losses are summed and
backpropagated once, then each module's gradient is clipped separately.

Under torch.distributed (torchrun, see robo_rl/utils/distributed.py for why not DDP wrappers) each rank
backpropagates its own batch, the gradients (and the Q term's 1/mean|Q| scale) are averaged over the ranks
before clipping, and every rank takes the same optimizer step: the update of one process on the ranks'
batches concatenated.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from einops import rearrange, reduce, repeat
from torch import nn

from robo_rl.agents.critic import QEnsemble, mean_minus_std
from robo_rl.agents.policy import ShortcutFlowPolicy
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.core import Obs
from robo_rl.nets.encoders import EncoderConfig, ObsEncoder
from robo_rl.nets.mlp import ema_update_
from robo_rl.utils import distributed
from robo_rl.utils.precision import PRECISIONS, uses_bf16


BC_DATA = ("offline", "successes", "all")  # SORLConfig.bc_data's choices
SC_DATA = ("all", "bc")  # SORLConfig.sc_data's choices


@dataclass
class SORLConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    # Policy: shortcut flow.
    actor_hidden_dims: tuple[int, ...] = (512, 512, 512, 512)
    actor_layer_norm: bool = True
    action_horizon: int = 1  # h: the policy and critic act on chunks of h actions
    # Actions of each chunk executed before the next chunk is planned (receding horizon, Diffusion Policy's
    # n_action_steps): fewer react sooner, at more decisions per episode. None: the whole chunk.
    execute_steps: int | None = None
    flow_steps: int = 8  # finest Euler step count M; self-consistency covers 1 .. M/2
    q_steps: tuple[int, ...] = (1, 2, 4, 8)  # k drawn per update for the Q term and the TD target
    sample_steps: int = 4  # k for act() / pi()
    best_of_n: int = 1  # act(): candidates per state verified by the critic
    # The TD target's next action: the best by the target critic of this many policy samples at s' (1: one plain
    # sample). Acting picks among candidates (best_of_n, QWM search), so a target through a plain sample values a
    # policy that never acts; Q-chunking and EXPO take the same best-of-N in the target as at acting.
    target_best_of_n: int = 1
    fm_weight: float = 10.0
    # Which replay rows the flow-matching (BC) term clones: "offline" (the demonstrations only, so the policy
    # does not imitate its own exploration and search actions once online data fills the batches),
    # "successes" (every episode that ended in success, demos and online episodes alike: filtered
    # self-imitation, so what search found that worked becomes the policy's, while failed rollouts in the
    # offline data only teach the critic), or "all".
    bc_data: str = "offline"
    sc_weight: float = 10.0
    # Which rows the self-consistency term trains on: "all", or "bc" (the rows flow matching clones, by bc_data).
    # On rows flow matching does not clone (online exploration) nothing anchors the finest-step flow that the
    # coarse steps are distilled from. "all" stays the default: through whole runs "bc" kept few-demo Lift's final
    # policy at its offline start (+0.15 over "all") but not mid-run, took the search's gain away, and on Can
    # the policy fell as far as with "all" (docs/results.md, 2026-12-08).
    sc_data: str = "all"
    q_weight: float = 2.0  # task-tuned (SORL: 10-500; 10 was fragile here, conf/agent/sorl.yaml); 0: BC only
    # Critic: Q ensemble.
    critic_hidden_dims: tuple[int, ...] = (512, 512, 512, 512)
    num_critics: int = 10
    target_agg: str = "min"  # "min" over a random subset of target_subset heads, or "mean_std"
    target_subset: int = 2
    target_beta: float = 0.0  # "mean_std": mean - beta * std
    # CQL-style push-down of Q on actions the data did not take; 0 disables. Off by default: on Can
    # (budget=cpu, 20 episodes) 0.1 raised the offline start from 0.65 to 0.75, but online fine-tuning
    # then fell to 0.35 where the unpenalised critic climbed to 0.85.
    conservative_weight: float = 0.0
    conservative_samples: int = 4  # uniform random actions per state for that term
    # Optimisation (the buffer supplies n-step rewards and discounts, so gamma lives there).
    # SORL's 1e-4 reached Lift success 0.5 / 0.6 after 1k offline steps on 30 scripted demos,
    # 3e-4 reached 0.8 / 0.9 (2 seeds, 10 episodes each, budget=cpu network sizes).
    lr: float = 3e-4
    grad_clip: float = 1.0  # per module (encoder, policy, critic) max grad norm
    # Updates with a non-finite loss or gradient norm are skipped (weights untouched); this many in a row
    # stop training with NonFiniteUpdateError, since from there on the run would learn nothing.
    max_nonfinite_updates: int = 10
    tau: float = 0.005  # Polyak rate of the target encoder, target policy and target critic
    compile: bool = False  # torch.compile the encoder, velocity net and critic
    # The update's forward passes under bf16 autocast ("bf16"), or not ("fp32"); "auto": bf16 on CPUs that run
    # it natively (robo_rl/utils/precision.py). Weights, optimizer state and losses stay fp32.
    precision: str = "fp32"
    # Latent world model (QWM search imagines with it), trained on the same encoder's latents.
    world_model: WorldModelConfig = field(default_factory=WorldModelConfig)

    def __post_init__(self):
        # Messages start with the field's name: the config validator prefixes the group (`agent.`).
        bad_steps = [k for k in self.q_steps if k < 1 or k > self.flow_steps or k & (k - 1)]
        if bad_steps:
            raise ValueError(f"q_steps={list(self.q_steps)}: {bad_steps} are not powers of 2 in "
                             f"[1, flow_steps={self.flow_steps}]")
        for name in ("lr", "grad_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be > 0")
        # execute_steps <= action_horizon: check_execute_steps, where the horizon that applies is known (the
        # agent, the run's config, evaluate.py, which sets execute_steps for a checkpoint's horizon, not its own)
        if self.execute_steps is not None and self.execute_steps < 1:
            raise ValueError(f"execute_steps={self.execute_steps}: must be >= 1 (null: the whole chunk)")
        if self.bc_data not in BC_DATA:
            raise ValueError(f"bc_data={self.bc_data!r}: must be one of {BC_DATA}")
        if self.sc_data not in SC_DATA:
            raise ValueError(f"sc_data={self.sc_data!r}: must be one of {SC_DATA}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}: must be one of {', '.join(PRECISIONS)}")
        if self.target_best_of_n < 1:
            raise ValueError(f"target_best_of_n={self.target_best_of_n}: must be >= 1 (1: one policy sample)")
        if self.max_nonfinite_updates < 1:
            raise ValueError(f"max_nonfinite_updates={self.max_nonfinite_updates}: must be >= 1")


def check_execute_steps(execute_steps: int | None, action_horizon: int) -> None:
    """ValueError unless a chunk of `action_horizon` actions has `execute_steps` to execute (None: all)."""
    if (execute_steps or 1) > action_horizon:
        raise ValueError(f"agent.execute_steps={execute_steps}: a chunk holds agent.action_horizon={action_horizon} "
                         f"actions; pass at most {action_horizon}, or null for the whole chunk")


class NonFiniteUpdateError(RuntimeError):
    """Too many gradient updates in a row had a non-finite loss or gradient norm."""


class SORLAgent(nn.Module):
    """Encoder + shortcut-flow policy + Q ensemble, each with an EMA target.

    obs_shapes: key -> shape of one observation (see ObsEncoder); action_dim: A of one env action.
    """

    def __init__(
        self,
        obs_shapes: dict[str, tuple[int, ...]],
        action_dim: int,
        num_tasks: int = 1,
        config: SORLConfig | None = None,
        device: str | torch.device = "cpu",
    ):
        super().__init__()
        self.config = cfg = config or SORLConfig()
        check_execute_steps(cfg.execute_steps, cfg.action_horizon)
        self.action_dim = action_dim
        self.encoder = ObsEncoder(obs_shapes, num_tasks, cfg.encoder)
        latent_dim = cfg.encoder.latent_dim
        self.policy = ShortcutFlowPolicy(
            latent_dim,
            action_dim,
            cfg.actor_hidden_dims,
            horizon=cfg.action_horizon,
            max_steps=cfg.flow_steps,
            sample_steps=cfg.sample_steps,
            layer_norm=cfg.actor_layer_norm,
        )
        self.critic = QEnsemble(
            latent_dim,
            action_dim * cfg.action_horizon,
            cfg.critic_hidden_dims,
            cfg.num_critics,
            target_agg=cfg.target_agg,
            target_subset=cfg.target_subset,
            target_beta=cfg.target_beta,
        )
        self.world_model = cfg.world_model.build(latent_dim, action_dim * cfg.action_horizon)
        self.target_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
        self.target_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.device = torch.device(device)
        self.to(self.device)
        if cfg.compile:  # in place: parameter names and state_dict keys stay the same
            for module in (self.encoder, self.target_encoder, self.policy.net, self.target_policy.net,
                           self.critic.net, self.critic.target_net):
                module.compile()
        # fused: one kernel per tensor instead of ~10 elementwise passes; matters for a 10-head critic on CPU.
        # Every trained module, the same list whose gradients update() clips: a module missing here computes
        # gradients that never change its weights.
        self.optimizer = torch.optim.Adam(
            [p for _, module in self._learners() for p in module.parameters()], lr=cfg.lr, fused=True
        )
        self.nonfinite_skipped = 0  # updates skipped for a non-finite loss or gradient norm, in total
        self._nonfinite_in_a_row = 0

    # --- the maths the planner and the trainer call ---------------------------------------------

    def encode(self, obs: Obs) -> torch.Tensor:
        """obs dict of [B, ...] -> z [B, Z] (online encoder)."""
        return self.encoder(self._to_device(obs))

    def pi(self, z: torch.Tensor, steps: int | None = None) -> torch.Tensor:
        """z [B, Z] -> actions [B, h*A] in [-1, 1] by `steps` (default sample_steps) Euler steps."""
        return self.policy.sample(z, steps)

    def q(self, z: torch.Tensor, a: torch.Tensor, pessimism: float = 0.0) -> torch.Tensor:
        """Ensemble-mean Q (the value the actor maximises), minus `pessimism` times the heads'
        disagreement (std) when asked: z [B, Z], a [B, h*A] -> [B]."""
        return mean_minus_std(self.critic(z, a), pessimism)

    @torch.no_grad()
    def act(self, obs: Obs, steps: int | None = None, best_of_n: int | None = None) -> torch.Tensor:
        """obs dict of [B, ...] -> actions [B, A] (or [B, h, A] with chunks), eval mode, no grad."""
        was_training = self.training
        self.eval()
        z = self.encode(obs)
        n = best_of_n or self.config.best_of_n
        actions = self.policy.sample_best_of_n(z, n, self.q, steps) if n > 1 else self.pi(z, steps)
        self.train(was_training)
        return actions if self.config.action_horizon == 1 else self._unflatten(actions)

    def set_normalization(self, stats: dict[str, tuple]) -> None:
        """Low-dim obs statistics key -> (mean, std) for the encoder and its target."""
        for encoder in (self.encoder, self.target_encoder):
            encoder.set_normalization(stats)

    def set_instruction_embeddings(self, table: torch.Tensor) -> None:
        """The fixed instruction embeddings [num_tasks, D] of a language-conditioned encoder and its target."""
        for encoder in (self.encoder, self.target_encoder):
            encoder.set_instruction_embeddings(table.to(self.device))

    # --- learning ---------------------------------------------------------------------------------

    def update(self, batch: dict, seq: dict | None = None) -> dict[str, float]:
        """One gradient step on a replay batch (and, with a world model, on real sub-trajectories).

        batch: obs / next_obs: key -> [B, ...] (images uint8); action [B, A] or [B, h, A];
               reward [B] (n-step discounted sum); discount [B] (gamma^n * (1 - terminal));
               offline, success [B] bool (the rows from demos / from episodes that ended in success: with
               bc_data "offline" or "successes", they pick the rows flow matching clones).
        seq:   {"obs": key -> [B, H+1, ...], "action": [B, H, A], "reward", "terminal": [B, H]} for the
               world model's multi-step latent consistency loss (ignored without a world model).
        Returns losses and diagnostics as floats. An update whose loss or gradient norm is not finite
        changes no weight; it is counted (`nonfinite_skipped`), and `config.max_nonfinite_updates` of
        them in a row raise NonFiniteUpdateError.
        """
        self.train()
        action = self._flatten(batch["action"].to(self.device))
        if action.shape[-1] != self.policy.flat_dim:
            raise ValueError(
                f"batch action has shape {tuple(batch['action'].shape)}; expected [B, {self.policy.flat_dim}]"
                f" or [B, {self.config.action_horizon}, {self.action_dim}]"
            )
        reward, discount = batch["reward"].to(self.device), batch["discount"].to(self.device)
        bf16 = uses_bf16(self.config.precision, self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):  # backward follows the casts
            z = self.encoder(self._to_device(batch["obs"]))
            with torch.no_grad():
                next_z = self.target_encoder(self._to_device(batch["next_obs"]))

            critic_loss, info = self.critic_loss(z, action, reward, discount, next_z)
            bc_rows = self._bc_rows(batch)
            actor_loss, actor_info = self.actor_loss(z, action, bc_rows)
            loss, wm_info = (critic_loss + actor_loss).float(), {}
            if self.world_model is not None and seq is not None:
                seq = self._chunk_sequence({"obs": self._to_device(seq["obs"]), "action": seq["action"].to(self.device),
                                            "reward": seq["reward"].to(self.device),
                                            "terminal": seq["terminal"].to(self.device)})
                wm_loss, wm_info = self.world_model.loss(self.encoder, seq)
                loss = loss + wm_loss.float()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss = self._average_over_ranks(loss)
        # A module this update gave no gradient (the world model without sequences) is neither clipped nor
        # reported: clip_grad_norm_ of no gradients is a CPU zero, which breaks the one-sync stack on CUDA.
        trained = [(name, module) for name, module in self._learners()
                   if any(p.grad is not None for p in module.parameters())]
        norms = {f"{name}_grad_norm": nn.utils.clip_grad_norm_(module.parameters(), self.config.grad_clip)
                 for name, module in trained}
        info |= norms | actor_info
        # One host sync reads the metrics and decides the step: clipping turns an infinite norm into
        # all-zero gradients and a NaN one into NaN weights, so neither may reach the optimizer.
        values = torch.stack([loss.detach().float(), *(v.detach().float() for v in info.values())]).tolist()
        metrics = dict(zip(info, values[1:]))
        if math.isfinite(values[0]) and all(math.isfinite(metrics[k]) for k in norms):
            self.optimizer.step()
            self.update_targets()
            self._nonfinite_in_a_row = 0
        else:
            self._skip_nonfinite(values[0], {k: metrics[k] for k in norms})
        metrics["nonfinite_skipped"] = self.nonfinite_skipped
        return metrics | {f"wm_{k}": v for k, v in wm_info.items()}

    def _average_over_ranks(self, loss: torch.Tensor) -> torch.Tensor:
        """Data parallel: every trained parameter's gradient and the loss averaged over the ranks (one
        all-reduce), so clipping, the non-finite check and the step are the same on every rank. A gradient
        this rank did not produce counts as zero (the world model without a sequence batch): the ranks must
        reduce equal-sized buffers. Returns the averaged loss (this rank's loss without torch.distributed)."""
        if distributed.world_size() == 1:
            return loss
        params = [p for _, module in self._learners() for p in module.parameters()]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss = loss.detach().clone()
        distributed.all_reduce_mean_([p.grad for p in params] + [loss])
        return loss

    def _skip_nonfinite(self, loss: float, norms: dict[str, float]) -> None:
        self.nonfinite_skipped += 1
        self._nonfinite_in_a_row += 1
        cfg = self.config
        if self._nonfinite_in_a_row >= cfg.max_nonfinite_updates:
            raise NonFiniteUpdateError(
                f"{self._nonfinite_in_a_row} gradient updates in a row had a non-finite loss or gradient norm "
                f"(last: loss {loss:.3g}, " + ", ".join(f"{k} {v:.3g}" for k, v in norms.items()) + "), so "
                f"none changed the weights. Likely causes: a learning rate too high (agent.lr={cfg.lr:g}), a Q "
                f"weight too large (agent.q_weight={cfg.q_weight:g}), or NaN/Inf/huge values in the data; lower "
                "them or clean the data (agent.max_nonfinite_updates sets how many skips in a row stop a run)")

    def critic_loss(
        self, z: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, next_z: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean squared TD error over heads and batch: z, next_z [B, Z], action [B, h*A], reward, discount [B]."""
        with torch.no_grad():
            td_target = reward + discount * self.next_value(next_z)
        q = self.critic(z, action)  # [E, B]
        loss = (q - td_target).square().mean()
        info = {"critic_loss": loss, "q": q.mean(), "td_target": td_target.mean()}
        if self.config.conservative_weight:
            gap = self.conservative_gap(z, q)
            loss = loss + self.config.conservative_weight * gap
            info["conservative_gap"] = gap
        return loss, info

    @torch.no_grad()
    def next_value(self, next_z: torch.Tensor) -> torch.Tensor:
        """The TD target's value of s': next_z [B, Z] -> [B], the highest target value among `target_best_of_n`
        policy samples. The target critic both picks and values: it is the aggregate the target uses anyway
        (REDQ's min over 2 heads costs 2 of the E heads per candidate), and its pessimism tempers the max's
        overestimation."""
        n = self.config.target_best_of_n
        z_rep = repeat(next_z, "b z -> (b n) z", n=n)
        values = self.critic.target_value(z_rep, self.policy.sample(z_rep, self._draw_q_steps()))
        return reduce(values, "(b n) -> b", "max", n=n)

    def conservative_gap(self, z: torch.Tensor, q_data: torch.Tensor) -> torch.Tensor:
        """CQL(H)-style term: logsumexp of Q over uniform random actions and the data action, minus Q
        of the data action; >= 0, and ~0 once random actions rank below the data's.

        Why: a TD critic fit to demonstrations sees one action per state, so its value of other actions
        is an extrapolation, and test-time selection (best-of-N, QWM search) picks exactly the actions
        it overrates. Pushing down far-off (uniform) actions, and not the policy's own samples, leaves
        the values near the data to TD while making Q fall off away from it.
        z [B, Z], q_data [E, B] -> scalar.
        """
        n = self.config.conservative_samples
        z_rep = repeat(z, "b z -> (b n) z", n=n)
        uniform = torch.rand(z_rep.shape[0], self.policy.flat_dim, device=z.device) * 2 - 1
        q_uniform = rearrange(self.critic(z_rep, uniform), "e (b n) -> e b n", n=n)
        all_q = torch.cat([q_uniform, q_data[..., None]], dim=-1)  # [E, B, n + 1]
        return (torch.logsumexp(all_q, dim=-1) - q_data).mean()

    def actor_loss(self, z: torch.Tensor, action: torch.Tensor, bc_rows: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weighted flow-matching + self-consistency - normalised Q: z [B, Z], dataset action [B, h*A];
        bc_rows: optional bool [B], the rows flow matching clones (default all); with sc_data "bc", also
        the rows self-consistency trains on."""
        cfg = self.config
        z_fixed = z.detach()  # the SC and Q terms train the policy, not the encoder
        fm_loss = self.policy.flow_matching_loss(z, action, bc_rows)
        sc_rows = bc_rows if cfg.sc_data == "bc" else None
        sc_loss = self.policy.self_consistency_loss(z_fixed, action, self.target_policy, sc_rows)
        loss = cfg.fm_weight * fm_loss + cfg.sc_weight * sc_loss
        info = {"fm_loss": fm_loss, "sc_loss": sc_loss}
        if cfg.q_weight:
            action_pi = self.pi(z_fixed, self._draw_q_steps())
            q = self.critic(z_fixed, action_pi, detach_params=True).mean(0)
            # Dividing by mean|Q| makes q_weight independent of the reward scale; data parallel, the scale is
            # the mean over all ranks' batches, as for one process on them concatenated.
            scale = q.abs().mean().detach()
            distributed.all_reduce_mean_([scale])
            q_loss = -q.mean() / scale.clamp_min(1e-6)
            loss = loss + cfg.q_weight * q_loss
            info["q_loss"] = q_loss
        info["actor_loss"] = loss
        return loss, info

    def update_targets(self) -> None:
        tau = self.config.tau
        ema_update_(self.target_encoder, self.encoder, tau)
        ema_update_(self.target_policy, self.policy, tau)
        self.critic.update_target(tau)

    # --- helpers ----------------------------------------------------------------------------------

    def _bc_rows(self, batch: dict) -> torch.Tensor | None:
        """The rows [B] bool that flow matching clones (None: all of them), by `bc_data`."""
        mode = self.config.bc_data
        if mode == "all":
            return None
        # successes: the rows of every episode that ended in success, demos and online alike, so a failed
        # offline rollout (collect_demos keep_failures=true) teaches the critic and is not cloned
        flag = "offline" if mode == "offline" else "success"
        if flag not in batch:
            raise ValueError(f"batch has no {flag!r} flags, which bc_data={mode!r} clones by (ReplayBuffer's "
                             "samples carry them); add them or set agent.bc_data=all")
        return batch[flag].to(self.device)

    def _learners(self) -> list[tuple[str, nn.Module]]:
        """The trained modules, each clipped on its own."""
        modules = [("encoder", self.encoder), ("policy", self.policy), ("critic", self.critic.net)]
        return modules + ([("world_model", self.world_model)] if self.world_model is not None else [])

    def _draw_q_steps(self) -> int:
        steps = self.config.q_steps
        return steps[int(torch.randint(len(steps), ()))]

    def _to_device(self, obs: Obs) -> Obs:
        return {k: v.to(self.device, non_blocking=True) for k, v in obs.items()}

    def _flatten(self, action: torch.Tensor) -> torch.Tensor:
        return rearrange(action, "b h a -> b (h a)") if action.dim() == 3 else action

    def _chunk_sequence(self, seq: dict) -> dict:
        """A sequence of T·h env steps -> T world-model steps, one per chunk of h actions: every h-th
        observation [B, T+1, ...], actions [B, T, h*A], rewards summed and terminals or-ed per chunk [B, T]."""
        h = self.config.action_horizon
        if seq["action"].shape[1] % h:
            raise ValueError(f"a sequence of {seq['action'].shape[1]} steps does not split into chunks of {h} actions")
        return {
            "obs": {k: v[:, ::h] for k, v in seq["obs"].items()},
            "action": rearrange(seq["action"], "b (t h) a -> b t (h a)", h=h),
            "reward": reduce(seq["reward"].float(), "b (t h) -> b t", "sum", h=h),
            "terminal": rearrange(seq["terminal"], "b (t h) -> b t h", h=h).any(-1),
        }

    def _unflatten(self, action: torch.Tensor) -> torch.Tensor:
        return rearrange(action, "b (h a) -> b h a", h=self.config.action_horizon)
