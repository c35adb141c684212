"""Acting with a trained agent: the policy alone, or QWM search over the agent's world model.

`AgentActor.act(obs)` is what env loops call (online collection, evaluation). With a planner, the
search imagines futures with `agent.world_model` and scores them with `agent.q`; nothing it
imagines is stored anywhere: only the chosen action reaches the env.
"""
from __future__ import annotations

import copy

import torch
from einops import rearrange

from robo_rl.planning.qwm import QWMPlanner


class AgentActor:
    """obs dict [B, ...] -> actions [B, A] (CPU tensor) from `agent`, optionally through `planner`.

    The policy samples with the agent's own sampler steps (`agent.config.sample_steps`), alone and
    inside the search; best_of_n (None: `agent.config.best_of_n`) critic-verified candidates when
    acting without a planner.

    param_noise_std > 0 gives 3PO-style parameter-space exploration: env group g (env i is in group
    i % num_groups) acts with its own perturbed copy of the policy's velocity net, redrawn by
    `resample_noise()` (the online loop calls it when an episode of that group starts).

    With action chunks (agent.config.action_horizon = h > 1) each env executes its chunk open loop:
    a new chunk is planned for an env only when `agent.config.execute_steps` of its last one are used
    (default all h: a receding horizon with fewer) or `reset()` says its episode restarted. Env loops
    call `reset(env_ids)` whenever episodes start. Chunk state is kept per env of the VecEnv:
    `act(obs, env_ids)` may be given the rows of some envs only (evaluation runs several actors over
    one VecEnv, each on its own envs).

    With the planner's drift guard (`planner.drift_decay`) the actor keeps each env's accumulated lean ℓ of the
    search's picks (`QWMPlanner.plan`'s `drift`), from zero at every `reset`.
    """

    def __init__(self, agent, planner: QWMPlanner | None = None, best_of_n: int | None = None,
                 param_noise_std: float = 0.0, num_groups: int = 1, seed: int = 0):
        self.agent, self.planner, self.best_of_n = agent, planner, best_of_n
        self.param_noise_std, self.num_groups = param_noise_std, num_groups
        self.generator = torch.Generator(device=agent.device).manual_seed(seed)
        self.horizon = agent.config.action_horizon
        self.execute_steps = agent.config.execute_steps or self.horizon
        self._chunks = torch.zeros(0, self.horizon, agent.action_dim)  # [E, h, A]: the chunk env e executes
        self._next = torch.zeros(0, dtype=torch.long)  # [E]: index of its next action; >= execute_steps: replan
        self._drift = torch.zeros(0, agent.policy.flat_dim)  # [E, h*A]: ℓ of env e's picks (the drift guard)
        self._noisy_policies = None
        if param_noise_std > 0:
            self._noisy_policies = [copy.deepcopy(agent.policy).requires_grad_(False) for _ in range(num_groups)]
            self.resample_noise(range(num_groups))

    def state_dict(self) -> dict:
        """Everything a resumed run needs to act on exactly as this actor would: each env's chunk and lean, the
        generator, the perturbed policy copies."""
        return {"chunks": self._chunks.clone(), "next": self._next.clone(), "drift": self._drift.clone(),
                "generator": self.generator.get_state(),
                "noisy_policies": None if self._noisy_policies is None else [p.state_dict() for p in self._noisy_policies]}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()` of an actor of the same agent, planner and groups."""
        self._chunks, self._next, self._drift = state["chunks"].clone(), state["next"].clone(), state["drift"].clone()
        self.generator.set_state(state["generator"])
        for noisy, saved in zip(self._noisy_policies or [], state["noisy_policies"] or []):
            noisy.load_state_dict(saved)

    @torch.no_grad()
    def resample_noise(self, groups) -> None:
        """Perturb group g's policy copy: θ_g = θ + σ·ε, from the agent's current weights."""
        for g in groups:
            for noisy, p in zip(self._noisy_policies[g].parameters(), self.agent.policy.parameters()):
                noisy.copy_(p + self.param_noise_std * torch.randn(p.shape, generator=self.generator, device=p.device))

    def reset(self, env_ids) -> None:
        """Episodes (re)start in `env_ids`: their next `act` plans afresh instead of finishing a chunk."""
        seen = [i for i in env_ids if i < len(self._next)]  # unseen envs start fresh
        self._next[seen] = self.horizon
        self._drift[seen] = 0.0

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], env_ids: list[int] | None = None) -> torch.Tensor:
        """obs dict [n, ...] of the envs `env_ids` (default 0..n-1) -> their actions [n, A] this step (CPU)."""
        ids = torch.arange(next(iter(obs.values())).shape[0]) if env_ids is None else torch.as_tensor(env_ids)
        if (extra := int(ids.max()) + 1 - len(self._next)) > 0:  # first sight of these envs: no chunk, no lean yet
            self._chunks = torch.cat([self._chunks, torch.zeros(extra, self.horizon, self.agent.action_dim)])
            self._next = torch.cat([self._next, torch.full((extra,), self.horizon)])
            self._drift = torch.cat([self._drift, self._drift.new_zeros(extra, self._drift.shape[1])])
        if self.horizon == 1:
            return self._plan(obs, ids)
        stale = torch.nonzero(self._next[ids] >= self.execute_steps).squeeze(1)  # rows of obs
        if len(stale):
            self._chunks[ids[stale]] = self._plan({k: v[stale] for k, v in obs.items()}, ids[stale])
            self._next[ids[stale]] = 0
        actions = self._chunks[ids, self._next[ids]]
        self._next[ids] += 1
        return actions

    def _plan(self, obs: dict[str, torch.Tensor], env_ids: torch.Tensor) -> torch.Tensor:
        """obs of the envs `env_ids` [n] -> their actions [n, A], or chunks [n, h, A] (CPU)."""
        agent = self.agent
        agent.eval()
        if self.planner is None and self._noisy_policies is None:
            actions = agent.act(obs, best_of_n=self.best_of_n)
        else:
            z = agent.encode(obs)
            actions = torch.empty(z.shape[0], agent.policy.flat_dim, device=z.device)
            for g, rows in self._groups(env_ids):
                actions[rows] = self._act_latent(z[rows], g, env_ids[rows])
            actions = rearrange(actions, "n (h a) -> n h a", h=self.horizon) if self.horizon > 1 else actions
        return actions.cpu()

    def _groups(self, env_ids: torch.Tensor):
        """(group, rows of env_ids in it) for each parameter-noise group present."""
        if self._noisy_policies is None:
            return [(None, slice(None))]
        group_of = env_ids % self.num_groups
        return [(g, torch.nonzero(group_of == g).squeeze(1)) for g in range(self.num_groups) if (group_of == g).any()]

    def _act_latent(self, z: torch.Tensor, group: int | None, env_ids: torch.Tensor) -> torch.Tensor:
        agent = self.agent
        policy = agent.policy if group is None else self._noisy_policies[group]
        pi = policy.sample  # z [M, Z] -> a [M, h*A] by the policy's sample_steps Euler steps
        if self.planner is None:
            return pi(z)
        wm = agent.world_model
        reward = wm.reward if wm.has_reward else None
        terminal = wm.terminal if wm.has_termination else None
        kappa = self.planner.cfg.pessimism
        q = (lambda zz, aa: agent.q(zz, aa, kappa)) if kappa else agent.q  # noqa: E731
        actions, info = self.planner.plan(z, pi, q, wm.next, reward, terminal, drift=self._drift[env_ids].to(z.device))
        if "drift" in info:  # the drift guard is on
            self._drift[env_ids] = info["drift"].float().cpu()
        return actions
