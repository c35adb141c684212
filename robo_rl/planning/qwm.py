"""QWM search: pick each env's action by looking ahead through the latent world model.

QWM (arXiv 2608.17163) keeps policy and critic model-free, trained on real transitions only, and
uses the world model solely to *choose* actions. The paper gives the ingredients but no code; this
is our precise version. For each env (all B envs, N candidates and K samples run as one batched
tensor program; only the depth loop is Python):

    root     a_n ~ π(z0), n < N;  G_0 = Q(z0, a_n)
    expand   depth 1 holds K samples z_1 ~ next(z0, a_n). Every node z_d gets one probe action
             a_d ~ π(z_d) and its d-step return
                 g = Σ_{t<d} γ^t r̂_t + γ^d Q(z_d, a_d)          ("paths ranked by discounted Q").
             Per root action the J nodes with the best g are kept; below depth D they are expanded
             through their probe action into K samples each (J·K nodes at the next depth).
    leaves   the J kept nodes of depth D end the kept paths; each is evaluated more carefully with
             N_leaf policy actions a_i ~ π(z_D): g = Σ_{t<D} γ^t r̂_t + γ^D mean_i Q(z_D, a_i).
    value    G_d = mean of g over the nodes of depth d: a d-step model-based estimate of the value
             of a_n, averaged over the model's samples (its uncertainty).
             T = Σ_d λ^(d−1) G_d / Σ_d λ^(d−1)          (d = 1..D: λ discounts deeper estimates)
    score    S_n = w·G_0 + (1 − w)·T − β·u_n/ū      u_n: variance of a_n's K next latents (the model's
             heads disagree where it has seen no data), ū: its mean over the state's N candidates
    select   argmax_n S_n, or n ~ softmax(S / temperature), or n uniform (scores ignored: a control)

Why each part (the measurements behind each: docs/results.md, "QWM search: the evidence behind each setting"):
- The score mixes the critic's value of the action with the value the world model rolls out for it (w = ½, QWM's
  ½(V_Q + V_r)): neither is safe alone at small budgets. λ weights depth d by λ^(d−1), as TD(λ) weights longer
  returns: deeper estimates see more of the future but compound model error. The beam only chooses which nodes to
  look at deeper; every sampled node of a depth enters its mean (nodes below the first depth descend from the
  best-ranked ones, a mild optimism that J > 1 softens).
- β, the world model's uncertainty cost (SAILOR's), prefers among candidates the critic cannot tell apart those
  whose outcome the model's heads agree on; dividing by the state's mean disagreement makes it scale-free. It is
  0 by default: on fresh runs it kept the robot where the model has data, not where the task goes.
- The drift guard ρ (`drift_decay`): an argmax of a critic that cannot resolve its candidates leans the same way at
  every state, and the arm drifts into states the demonstrations never show. Per env the caller keeps
  ℓ ← ρ·ℓ + d, d the pick's deviation from its state's candidate mean in per-dimension std units (`AgentActor`
  does, from zero at each episode's start), and a candidate is eligible only if d·ℓ ≤ 0 (where none is, all are):
  a pick may lean the way the recent picks leaned only once their sum has decayed or been undone.
- `support` keeps the pick among the share of candidates nearest their mean (a trust region on the policy's
  support, as V-GPS and SAILOR keep their choices near the base policy): where the scores cost, they cost at the
  edge of the candidate cloud, where the critic extrapolates.
- `selection="random"` ignores the scores (a control: what the guard does by itself).

Without a reward head r̂ = 0 and every estimate is made of Q values alone. That is exact for the
robomimic and LIBERO tasks, which pay reward only on the success that ends the episode. A
termination head multiplies later terms by the probability that the imagined episode is still
running; without one it is 1.

Q reads latents: the critic acts on the same latent space the world model predicts, so imagined
states are evaluated directly, with no decoder back to observations.

Cost per env: N + D·N·J·K + N·J·N_leaf policy samples and as many Q values (200 at the defaults),
plus one world-model call per depth.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange, reduce, repeat
from torch import Tensor

from robo_rl.utils.precision import PRECISIONS, uses_bf16

Policy = Callable[[Tensor], Tensor]  # z [M, Z] -> a [M, A], a stochastic sample
Critic = Callable[[Tensor, Tensor], Tensor]  # z [M, Z], a [M, A] -> Q [M]
Dynamics = Callable[[Tensor, Tensor, int], Tensor]  # z [M, Z], a [M, A], K -> z' [M, K, Z]
Reward = Callable[[Tensor, Tensor], Tensor]  # z [M, Z], a [M, A] -> r̂ [M]
Terminal = Callable[[Tensor, Tensor], Tensor]  # z [M, Z], a [M, A] -> P(done) [M]


@dataclass(frozen=True)
class QWMConfig:
    num_actions: int = 8  # N root actions from the policy
    num_samples: int = 8  # K world-model samples per expanded action
    depth: int = 2  # D; 0 = best-of-N by Q (SORL's test-time scaling) without the world model
    beam: int = 1  # J nodes kept per root action at each depth
    leaf_actions: int = 8  # N_leaf policy actions whose Q is averaged at a kept leaf
    lam: float = 0.2  # λ: the depth-d estimate G_d enters the tree value T with weight ∝ λ^(d−1)
    root_weight: float = 0.5  # w: S = w·Q(z0, a) + (1 − w)·T; 0.5 is QWM's ½(V_Q + V_r)
    # "argmax" | "softmax" | "random": uniform over the eligible candidates, scores ignored. With the drift guard
    # that is the guard alone, the control that tells its share of a search gain from the scores' share.
    selection: str = "argmax"
    temperature: float = 1.0  # softmax temperature, in units of Q
    pessimism: float = 0.0  # κ: the actor's critic scores mean − κ·std over its heads (≥ 0)
    # β: S_n −= β·u_n/ū, u_n the world model's disagreement about a_n's next latent (variance over its K
    # samples), ū the mean over the state's candidates (SAILOR's ensemble-uncertainty cost, scale-free).
    # Depth 0 (best-of-N by Q) has no world model to ask and ignores it. Off by default: see the module docstring.
    uncertainty: float = 0.0
    # ρ: the drift guard (None: off; 0.9 is conf/planner/qwm.yaml's too). Per env the planner's caller keeps ℓ ← ρ·ℓ + d_pick, d the pick's deviation from
    # its state's candidate mean in units of their per-dimension std; a candidate is eligible only if d·ℓ ≤ 0, so
    # the picks cannot keep leaning one way (see the module docstring). 0.9: ℓ remembers ~10 decisions.
    drift_decay: float | None = 0.9
    # The share of the N candidates, those nearest their mean (in per-dimension std units), the search may pick: a
    # trust region on the policy's support, where the critic has seen actions like them. 1: all (see the module
    # docstring for what 0.5 did).
    support: float = 1.0
    # "bf16": run the search's matmuls under bfloat16 autocast; "auto": bf16 on CPUs that do it natively (AMX
    # tiles or AVX512-BF16), fp32 elsewhere (emulated bf16 is slower than fp32) and on CUDA (robo_rl/utils/precision.py).
    precision: str = "auto"

    def __post_init__(self):
        # Messages start with the field's name: the config validator prefixes the group (`planner.`).
        for name in ("num_actions", "num_samples", "beam", "leaf_actions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.depth < 0:
            raise ValueError(f"depth={self.depth}: must be >= 0")
        if self.beam > self.num_samples:
            raise ValueError(f"beam={self.beam}: cannot exceed num_samples={self.num_samples}, "
                             "the first depth has only K nodes per root action to keep")
        for name in ("lam", "root_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)}: a mixing weight, must lie in [0, 1]")
        if self.selection not in ("argmax", "softmax", "random"):
            raise ValueError(f'selection={self.selection!r}: must be "argmax", "softmax" or "random"')
        if self.precision not in PRECISIONS:
            raise ValueError(f'precision={self.precision!r}: must be "auto", "fp32" or "bf16"')
        if self.pessimism < 0:
            raise ValueError(f"pessimism={self.pessimism}: must be >= 0")
        if self.uncertainty < 0:
            raise ValueError(f"uncertainty={self.uncertainty}: must be >= 0")
        if self.uncertainty and self.num_samples < 2 and self.depth > 0:  # one sample cannot disagree with itself
            raise ValueError(f"uncertainty={self.uncertainty}: the world model's disagreement needs num_samples >= 2 "
                             f"samples per action (num_samples={self.num_samples})")
        if not 0.0 < self.support <= 1.0:
            raise ValueError(f"support={self.support}: the share of candidates the search may pick, must lie in (0, 1]")
        if self.drift_decay is not None and not 0.0 <= self.drift_decay < 1.0:
            raise ValueError(f"drift_decay={self.drift_decay}: a decay, must lie in [0, 1) (null: no drift guard)")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature}: must be > 0")


class QWMPlanner:
    """Batched QWM search over B envs; see the module docstring for the algorithm.

    gamma: the discount of the model returns, the one the critic was trained with (`train.gamma`;
    `robo_rl.checkpoint.build_planner` passes it), so that γ^d·Q(z_d, ·) and Q(z_0, ·) are on one scale.
    The policy samples `pi` draws take the actor's sampler steps (`agent.sample_steps`).
    """

    def __init__(self, cfg: QWMConfig | None = None, gamma: float = 0.99):
        self.cfg = cfg or QWMConfig()
        self.gamma = gamma

    @torch.no_grad()
    def plan(
        self,
        z: Tensor,
        pi: Policy,
        q: Critic,
        next: Dynamics,
        reward: Reward | None = None,
        terminal: Terminal | None = None,
        generator: torch.Generator | None = None,
        drift: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """z [B, Z] -> (actions [B, A], info).

        info: "candidates" [B, N, A], "scores" [B, N], "q" [B, N] (critic at the root), "index" [B]
        (the chosen candidate) and, for depth > 0, "tree_value" [B, N] (T above); with the drift guard,
        "drift" [B, A]: each env's ℓ after this pick, to pass back as `drift` at its next decision.
        generator: drives softmax selection; the callables draw their own randomness.
        drift: [B, A] each env's ℓ so far (zeros at an episode's start; None: zeros); used with cfg.drift_decay.
        """
        cfg = self.cfg
        if z.dim() != 2:
            raise ValueError(f"z must be a batch of latents [B, Z], got shape {tuple(z.shape)}")
        with torch.autocast(z.device.type, dtype=torch.bfloat16, enabled=uses_bf16(cfg.precision, z.device)):
            actions, info = self._search(z, pi, q, next, reward, terminal, generator, drift)
        return actions.float(), info

    def _search(self, z, pi, q, next, reward, terminal, generator, drift) -> tuple[Tensor, dict[str, Tensor]]:
        cfg = self.cfg
        B = z.shape[0]
        rows = torch.arange(B, device=z.device)
        z0 = repeat(z, "b z -> (b n) z", n=cfg.num_actions)  # one row per root action
        a0 = _policy(pi, z0)
        q0 = _value(q, z0, a0)
        info = {"candidates": rearrange(a0, "(b n) a -> b n a", b=B), "q": rearrange(q0, "(b n) -> b n", b=B)}
        info["scores"] = info["q"]
        if cfg.depth > 0:
            tree_value, disagreement = (rearrange(x, "(b n) -> b n", b=B)
                                        for x in self._tree_value(z0, a0, pi, q, next, reward, terminal))
            relative = disagreement / disagreement.mean(1, keepdim=True).clamp_min(1e-12)  # u_n / ū
            info["scores"] = (cfg.root_weight * info["q"] + (1.0 - cfg.root_weight) * tree_value
                              - cfg.uncertainty * relative)
            info |= {"tree_value": tree_value, "disagreement": disagreement}
        eligible = torch.ones_like(info["scores"], dtype=torch.bool)
        deviation = candidate_deviation(info["candidates"])
        if cfg.support < 1.0:  # the round(support·N) candidates nearest the mean
            spread = deviation.square().sum(-1)  # [B, N]
            k = max(1, round(cfg.support * cfg.num_actions))
            eligible = spread <= spread.kthvalue(k, dim=1, keepdim=True).values
        if cfg.drift_decay is not None:
            drift = torch.zeros_like(deviation[:, 0]) if drift is None else drift.to(deviation)
            eligible &= torch.einsum("bna,ba->bn", deviation, drift) <= 0
        eligible |= ~eligible.any(1, keepdim=True)  # where no candidate is eligible, all are
        info["index"] = self._select(info["scores"], eligible, generator)
        if cfg.drift_decay is not None:
            info["drift"] = cfg.drift_decay * drift + deviation[rows, info["index"]]
        return info["candidates"][rows, info["index"]], info

    def _tree_value(self, z0: Tensor, a0: Tensor, pi, q, next, reward, terminal) -> tuple[Tensor, Tensor]:
        """(T, u) for each of the M = B·N root actions z0 [M, Z], a0 [M, A]: [M] each; u is the world
        model's disagreement about the root action's next latent (variance over the K samples, mean over Z)."""
        cfg = self.cfg
        M, K, gamma = z0.shape[0], cfg.num_samples, self.gamma
        # The kept nodes [M, P, ...] (P = 1 at the root, then J) with the action expanded from each;
        # `path` is the discounted model return through that action, `alive` the probability that the
        # imagined episode is still running after it.
        z, a = z0[:, None], a0[:, None]
        path, alive = (x[:, None] for x in _reward_and_continuation(reward, terminal, z0, a0))
        estimates = []  # G_d, each [M]
        for d in range(1, cfg.depth + 1):
            z = rearrange(_samples(next, z.flatten(0, 1), a.flatten(0, 1), K), "(m p) k z -> m (p k) z", m=M)
            if d == 1:
                disagreement = z.float().var(1, correction=0).mean(-1)  # 0 where K = 1: nothing to disagree
            path, alive = repeat(path, "m p -> m (p k)", k=K), repeat(alive, "m p -> m (p k)", k=K)
            nodes = z.flatten(0, 1)  # [M·C, Z]
            probe = _policy(pi, nodes)
            returns = path + gamma**d * alive * _value(q, nodes, probe).view(M, -1)  # [M, C]: d-step returns
            keep = returns.topk(cfg.beam, dim=1).indices  # [M, J]
            if d < cfg.depth:
                z, a = _take(z, keep), _take(probe.view(M, -1, probe.shape[-1]), keep)
                path, alive = _take(path, keep), _take(alive, keep)
                # r̂ and the continuation only of the kept nodes (J of every K·P): no other path goes on
                r, cont = (x.view(M, -1) for x in _reward_and_continuation(reward, terminal, z.flatten(0, 1),
                                                                            a.flatten(0, 1)))
                path, alive = path + gamma**d * alive * r, alive * cont
            else:
                L = cfg.leaf_actions
                leaves = repeat(_take(z, keep), "m j z -> (m j l) z", l=L)
                value = reduce(_value(q, leaves, _policy(pi, leaves)), "(m j l) -> m j", "mean", m=M, l=L)
                returns = returns.scatter(1, keep, _take(path, keep) + gamma**d * _take(alive, keep) * value)
            estimates.append(returns.mean(1))
        weights = cfg.lam ** torch.arange(cfg.depth, dtype=z0.dtype, device=z0.device)
        return (torch.stack(estimates, 1) * weights).sum(1) / weights.sum(), disagreement

    def _select(self, scores: Tensor, eligible: Tensor, generator: torch.Generator | None) -> Tensor:
        """scores [B, N], eligible [B, N] (at least one per row) -> chosen index [B], an eligible one."""
        if self.cfg.selection == "random":  # the eligibility rules alone decide: the scores play no part
            probs = eligible.float()
        else:
            scores = scores.masked_fill(~eligible, -torch.inf)
            if self.cfg.selection == "argmax":
                return scores.argmax(1)
            probs = torch.softmax(scores / self.cfg.temperature, dim=1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def candidate_deviation(candidates: Tensor) -> Tensor:
    """candidates [B, N, A] -> [B, N, A]: each candidate's offset from its state's candidate mean, in units of the
    candidates' std per dimension (population std; 0 where they do not differ): how far a pick leans."""
    candidates = candidates.float()
    spread = candidates.std(1, keepdim=True, correction=0).clamp_min(1e-6)
    return (candidates - candidates.mean(1, keepdim=True)) / spread


def plan_reference(
    cfg: QWMConfig,
    z: Tensor,
    pi: Policy,
    q: Critic,
    next: Dynamics,
    reward: Reward | None = None,
    terminal: Terminal | None = None,
    generator: torch.Generator | None = None,
    gamma: float = 0.99,
    drift: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The same search written as a literal tree walk: one env, one root action, one node at a time.

    Slow and shares no search code with `QWMPlanner.plan`; used to test it and as the benchmark's
    baseline. It calls `pi` on the N copies of each root latent and on the N_leaf copies of each leaf
    latent at once (as `plan` does) and on single nodes otherwise, so callables whose randomness is a
    function of their inputs give both versions the same numbers. Softmax selection draws per env,
    so only argmax selection is comparable draw for draw. drift [B, A]: each env's ℓ for the drift guard
    (None: zeros); info["drift"] holds ℓ after the pick when the guard is on.
    """
    actions, all_scores, indices, drifts = [], [], [], []
    for b, z_env in enumerate(z):
        candidates = pi(z_env.expand(cfg.num_actions, -1))
        scores = []
        for a_root in candidates:
            q_root, r_root, cont_root = _node_scalars(z_env, a_root, q, reward, terminal)
            score = q_root
            if cfg.depth > 0:
                root = _Node(z_env, a_root, r_root, cont_root, path=0.0)
                estimates = _depth_estimates(cfg, gamma, root, pi, q, next, reward, terminal)
                weights = [cfg.lam**d for d in range(cfg.depth)]
                tree_value = sum(w * g for w, g in zip(weights, estimates)) / sum(weights)
                score = cfg.root_weight * q_root + (1.0 - cfg.root_weight) * tree_value
            scores.append(score)
        if cfg.uncertainty and cfg.depth > 0:
            spread = [next(z_env[None], a[None], cfg.num_samples)[0].float().var(0, correction=0).mean().item() for a in candidates]
            scores = [s - cfg.uncertainty * u / max(sum(spread) / len(spread), 1e-12) for s, u in zip(scores, spread)]
        ell = torch.zeros(candidates.shape[1]) if drift is None else drift[b].float()
        leans = _leans(candidates.float())
        eligible = _eligible(cfg, leans, ell)
        if cfg.selection == "argmax":
            index = max(eligible, key=lambda n: scores[n])
        elif cfg.selection == "random":
            index = eligible[int(torch.randint(len(eligible), (), generator=generator))]
        else:
            masked = torch.tensor([scores[n] if n in eligible else -math.inf for n in range(len(scores))])
            index = int(torch.multinomial(torch.softmax(masked / cfg.temperature, 0), 1, generator=generator))
        actions.append(candidates[index])
        all_scores.append(scores)
        indices.append(index)
        if cfg.drift_decay is not None:
            drifts.append(cfg.drift_decay * ell + leans[index])
    info = {"scores": torch.tensor(all_scores), "index": torch.tensor(indices)}
    return torch.stack(actions), info | ({"drift": torch.stack(drifts)} if drifts else {})


def _leans(candidates: Tensor) -> Tensor:
    """Reference: candidates [N, A] of one env -> each one's offset from their mean in std units per dimension."""
    mean = sum(candidates) / len(candidates)
    std = (sum((a - mean) ** 2 for a in candidates) / len(candidates)).sqrt().clamp_min(1e-6)
    return torch.stack([(a - mean) / std for a in candidates])


def _eligible(cfg: QWMConfig, leans: Tensor, ell: Tensor) -> list[int]:
    """Reference: the candidates of one env the search may pick: those among the round(support·N) nearest the
    candidate mean (ties kept) whose lean does not go the way ℓ leans; all of them where none is left."""
    spread = [float(lean.square().sum()) for lean in leans]
    k = max(1, round(cfg.support * len(leans)))
    near = [n for n in range(len(leans)) if spread[n] <= sorted(spread)[k - 1]]
    guarded = [n for n in near if cfg.drift_decay is None or float(leans[n] @ ell) <= 0]
    return guarded or list(range(len(leans)))


@dataclass
class _Node:
    """A kept node of the reference tree: its latent and the action expanded from it."""

    z: Tensor  # [Z]
    action: Tensor  # [A]
    reward: float  # r̂(z, action)
    cont: float  # 1 − P(done | z, action)
    path: float  # discounted model return of the actions before this one
    alive: float = 1.0  # probability the imagined episode is still running at z
    ret: float = 0.0  # the node's d-step return


def _depth_estimates(cfg: QWMConfig, gamma: float, root: _Node, pi, q, next, reward, terminal) -> list[float]:
    """[G_1, ..., G_D] for one root action (reference version)."""
    kept, estimates = [root], []
    for d in range(1, cfg.depth + 1):
        nodes = []
        for parent in kept:
            path = parent.path + gamma ** (d - 1) * parent.alive * parent.reward
            alive = parent.alive * parent.cont
            for z_child in next(parent.z[None], parent.action[None], cfg.num_samples)[0]:
                probe = pi(z_child[None])[0]
                value, r, cont = _node_scalars(z_child, probe, q, reward, terminal)
                nodes.append(_Node(z_child, probe, r, cont, path, alive, path + gamma**d * alive * value))
        kept = sorted(nodes, key=lambda n: n.ret, reverse=True)[: cfg.beam]
        if d == cfg.depth:
            for leaf in kept:
                copies = leaf.z.expand(cfg.leaf_actions, -1)
                leaf.ret = leaf.path + gamma**d * leaf.alive * q(copies, pi(copies)).mean().item()
        estimates.append(sum(n.ret for n in nodes) / len(nodes))
    return estimates


def _node_scalars(z: Tensor, a: Tensor, q, reward, terminal) -> tuple[float, float, float]:
    """Q, r̂ and continuation probability of one (z [Z], a [A])."""
    z, a = z[None], a[None]
    r = reward(z, a).item() if reward is not None else 0.0
    cont = 1.0 - terminal(z, a).item() if terminal is not None else 1.0
    return q(z, a).item(), r, cont


# -- batched helpers -----------------------------------------------------------------------------
def _take(x: Tensor, index: Tensor) -> Tensor:
    """x [M, C, ...], index [M, J] -> [M, J, ...] with out[m, j] = x[m, index[m, j]]."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], index]


def _reward_and_continuation(reward, terminal, z: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """r̂ [M] (0 without a reward head) and 1 − P(done) [M] (1 without a termination head)."""
    r = _value(reward, z, a, "reward") if reward is not None else z.new_zeros(z.shape[0])
    cont = 1.0 - _value(terminal, z, a, "terminal") if terminal is not None else z.new_ones(z.shape[0])
    return r, cont


def _policy(pi: Policy, z: Tensor) -> Tensor:
    a = pi(z)
    if a.dim() != 2 or a.shape[0] != z.shape[0]:
        raise ValueError(f"pi(z [M={z.shape[0]}, Z]) must return actions [M, A], got {tuple(a.shape)}")
    return a


def _value(f: Critic, z: Tensor, a: Tensor, name: str = "q") -> Tensor:
    v = f(z, a)
    if v.shape != (z.shape[0],):
        raise ValueError(f"{name}(z, a) must return one value per row [M={z.shape[0]}], got {tuple(v.shape)}")
    return v


def _samples(next: Dynamics, z: Tensor, a: Tensor, K: int) -> Tensor:
    z_next = next(z, a, K)
    if z_next.shape != (z.shape[0], K, z.shape[1]):
        raise ValueError(f"next(z, a, K={K}) must return [M={z.shape[0]}, K={K}, Z={z.shape[1]}], "
                         f"got {tuple(z_next.shape)}")
    return z_next
