"""Acting with a trained agent: the policy alone, or QWM search over the agent's world model.

`AgentActor.act(obs)` is what env loops call (online collection, evaluation). With a planner, the
search imagines futures with `agent.world_model` and scores them with `agent.q`; nothing it
imagines is stored anywhere: only the chosen action reaches the env.
"""
from __future__ import annotations

import copy

import torch

from robo_rl.planning.qwm import QWMPlanner


class AgentActor:
    """obs dict [B, ...] -> actions [B, A] (CPU tensor) from `agent`, optionally through `planner`.

    param_noise_std > 0 gives 3PO-style parameter-space exploration: env group g (env i is in group
    i % num_groups) acts with its own perturbed copy of the policy's velocity net, redrawn by
    `resample_noise()` (the online loop calls it when an episode of that group starts).
    """

    def __init__(self, agent, planner: QWMPlanner | None = None, sample_steps: int | None = None,
                 best_of_n: int | None = None, param_noise_std: float = 0.0, num_groups: int = 1,
                 seed: int = 0):
        self.agent, self.planner = agent, planner
        self.sample_steps, self.best_of_n = sample_steps, best_of_n
        self.param_noise_std, self.num_groups = param_noise_std, num_groups
        self.generator = torch.Generator(device=agent.device).manual_seed(seed)
        self._noisy_policies = None
        if param_noise_std > 0:
            self._noisy_policies = [copy.deepcopy(agent.policy).requires_grad_(False) for _ in range(num_groups)]
            self.resample_noise(range(num_groups))

    @torch.no_grad()
    def resample_noise(self, groups) -> None:
        """Perturb group g's policy copy: θ_g = θ + σ·ε, from the agent's current weights."""
        for g in groups:
            for noisy, p in zip(self._noisy_policies[g].parameters(), self.agent.policy.parameters()):
                noisy.copy_(p + self.param_noise_std * torch.randn(p.shape, generator=self.generator, device=p.device))

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        agent = self.agent
        agent.eval()
        if self.planner is None and self._noisy_policies is None:
            actions = agent.act(obs, steps=self.sample_steps, best_of_n=self.best_of_n)
        else:
            z = agent.encode(obs)
            actions = torch.empty(z.shape[0], agent.action_dim, device=z.device)
            for g, rows in self._groups(z.shape[0]):
                actions[rows] = self._act_latent(z[rows], g)
        return actions.cpu()

    def _groups(self, batch: int):
        if self._noisy_policies is None:
            return [(None, slice(None))]
        ids = torch.arange(batch)
        return [(g, ids[ids % self.num_groups == g]) for g in range(self.num_groups) if (ids % self.num_groups == g).any()]

    def _act_latent(self, z: torch.Tensor, group: int | None) -> torch.Tensor:
        agent = self.agent
        steps = self.sample_steps or (self.planner.cfg.policy_steps if self.planner else None)
        policy = agent.policy if group is None else self._noisy_policies[group]
        pi = lambda zz: policy.sample(zz, steps)  # noqa: E731
        if self.planner is None:
            return pi(z)
        wm = agent.world_model
        reward = wm.reward if wm.has_reward else None
        terminal = wm.terminal if wm.has_termination else None
        kappa = self.planner.cfg.pessimism
        q = (lambda zz, aa: agent.q(zz, aa, kappa)) if kappa else agent.q  # noqa: E731
        actions, _ = self.planner.plan(z, pi, q, wm.next, reward, terminal)
        return actions
