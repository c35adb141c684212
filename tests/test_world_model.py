"""Latent world model: ensemble sampling, the loss contract, and learning real Lift dynamics."""
import dataclasses

import numpy as np
import pytest
import torch
from einops import rearrange
from torch import nn

from robo_rl.agents.world_model import LatentWorldModel
from robo_rl.envs.robosuite import RobosuiteEnv

LATENT, ACTION = 8, 3


class ConcatEncoder(nn.Module):
    """A small MLP encoder over the concatenated low-dim keys, standardised by data statistics."""

    def __init__(self, keys, mean, std, latent_dim):
        super().__init__()
        self.keys = keys
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.net = nn.Sequential(nn.Linear(mean.numel(), 64), nn.Tanh(), nn.Linear(64, latent_dim))

    def forward(self, obs):
        x = torch.cat([obs[k] for k in self.keys], dim=-1)
        return self.net((x - self.mean) / self.std)


def random_sequences(batch, horizon, obs_dim=5):
    return {
        "obs": {"state": torch.randn(batch, horizon + 1, obs_dim)},
        "action": torch.rand(batch, horizon, ACTION) * 2 - 1,
        "reward": torch.randn(batch, horizon),
        "terminal": torch.zeros(batch, horizon),
    }


def test_samples_come_from_the_heads_and_k_equal_e_visits_every_head():
    model = LatentWorldModel(LATENT, ACTION, num_heads=4, hidden_dim=16)
    z, a = torch.randn(5, LATENT), torch.rand(5, ACTION)
    heads = model.dynamics(z, a)  # [E, M, Z]
    assert heads.shape == (4, 5, LATENT) and heads.std(0).min() > 0  # heads disagree at initialisation

    samples = model.next(z, a, num_samples=4, generator=torch.Generator().manual_seed(0))
    assert samples.shape == (5, 4, LATENT)
    distance = (samples[:, :, None] - rearrange(heads, "e m z -> m 1 e z")).norm(dim=-1)  # [M, K, E]
    assert distance.min(-1).values.max() < 1e-5  # each sample is one head's prediction...
    assert (distance.argmin(-1).sort(-1).values == torch.arange(4)).all()  # ...and K = E uses each head once

    z_one, a_one = z[:1].expand(400, -1), a[:1].expand(400, -1)  # one sample each: a uniform head
    single = model.next(z_one, a_one, num_samples=1, generator=torch.Generator().manual_seed(1))[:, 0]
    chosen = (single[:, None] - rearrange(heads[:, :1], "e 1 z -> 1 e z")).norm(dim=-1).argmin(-1)
    assert torch.bincount(chosen, minlength=4).min() > 60

    assert not model.has_reward and not model.has_termination
    with pytest.raises(RuntimeError, match="reward=True"):
        model.reward(z, a)
    with pytest.raises(ValueError, match="must be \\[M=5, 3\\]"):
        model.next(z, a[:, :2], num_samples=2)


def test_loss_trains_the_encoder_through_the_first_latent_only_and_names_bad_shapes():
    model = LatentWorldModel(LATENT, ACTION, hidden_dim=16, reward=True, termination=True)
    encoder = nn.Linear(5, LATENT)
    encode = lambda obs: encoder(obs["state"])  # noqa: E731
    assert model.has_reward and model.has_termination
    seq = random_sequences(4, 3)
    state = seq["obs"]["state"].requires_grad_()
    loss, metrics = model.loss(encode, seq)
    loss.backward()
    assert encoder.weight.grad.abs().sum() > 0
    # The targets are read under stop-gradient: only the first observation's latent carries gradient.
    assert state.grad[:, 0].abs().sum() > 0 and state.grad[:, 1:].abs().sum() == 0
    assert {"consistency", "reward", "termination", "ensemble_std", "loss"} <= metrics.keys()

    bad = random_sequences(4, 3)
    bad["reward"] = bad["reward"][:, :2]
    with pytest.raises(ValueError, match='seq\\["reward"\\] must be \\[B=4, H=3\\]'):
        model.loss(encode, bad)


def test_consistency_is_each_heads_own_rollout_against_the_real_next_latents():
    model = LatentWorldModel(LATENT, ACTION, num_heads=3, hidden_dim=16).eval()  # eval: no bootstrap weights
    encoder = nn.Linear(5, LATENT)
    encode = lambda obs: encoder(obs["state"])  # noqa: E731
    seq, horizon = random_sequences(4, 3), 3
    with torch.no_grad():
        _, metrics = model.loss(encode, seq)
        z_real = encoder(seq["obs"]["state"])  # [B, H+1, Z]
        expected = 0.0
        for head in range(model.num_heads):
            z = z_real[:, 0]
            for t in range(horizon):
                z = model.dynamics(z, seq["action"][:, t])[head]
                expected += model.rho**t * (z - z_real[:, t + 1]).pow(2).mean() / (horizon * model.num_heads)
    assert metrics["consistency"] == pytest.approx(expected.item(), rel=1e-5)


def test_in_training_each_head_learns_from_its_own_share_of_the_sequences():
    """split_batch: head e's consistency is its own rollout on its own disjoint B/E sequences."""
    model = LatentWorldModel(LATENT, ACTION, num_heads=4, hidden_dim=16, bootstrap=False, split_batch=True).train()
    encoder = nn.Linear(5, LATENT)
    encode = lambda obs: encoder(obs["state"])  # noqa: E731
    seq, horizon = random_sequences(10, 3), 3
    torch.manual_seed(3)
    rows = model._head_rows(10, torch.device("cpu"))
    assert rows.shape == (4, 2) and len(set(rows.flatten().tolist())) == 8  # 10 // 4 each, none shared
    torch.manual_seed(3)
    with torch.no_grad():
        _, metrics = model.loss(encode, seq)
        z_real = encoder(seq["obs"]["state"])  # [B, H+1, Z]
        expected = 0.0
        for head in range(model.num_heads):
            mine = rows[head]
            z = z_real[mine, 0]
            for t in range(horizon):
                z = model.dynamics(z, seq["action"][mine, t])[head]
                expected += model.rho**t * (z - z_real[mine, t + 1]).pow(2).mean() / (horizon * model.num_heads)
    assert metrics["consistency"] == pytest.approx(expected.item(), rel=1e-5)
    assert torch.equal(model.eval()._head_rows(10, torch.device("cpu"))[2], torch.arange(10))  # eval: all of them


def test_steps_after_a_terminal_do_not_count():
    model = LatentWorldModel(LATENT, ACTION, hidden_dim=16, reward=True).eval()
    encoder = nn.Linear(5, LATENT)
    encode = lambda obs: encoder(obs["state"])  # noqa: E731
    seq = random_sequences(4, 3)
    seq["terminal"][:, 0] = 1.0  # every episode ends after its first step
    padded = {**seq, "obs": {"state": seq["obs"]["state"].clone()}, "reward": seq["reward"].clone()}
    padded["obs"]["state"][:, 2:] = 1e3  # whatever follows the end is padding
    padded["reward"][:, 1:] = -1e3
    loss = model.loss(encode, seq)[0]
    torch.testing.assert_close(loss, model.loss(encode, padded)[0])
    padded["obs"]["state"][:, 1] += 1.0  # the terminal step itself (and the state it ends in) counts
    assert (model.loss(encode, padded)[0] - loss).abs() > 1e-3


def test_reward_and_termination_heads_learn_a_known_rule():
    """A linear latent system whose reward and ending are functions of the state and action."""
    torch.manual_seed(0)
    model = LatentWorldModel(LATENT, ACTION, hidden_dim=64, reward=True, termination=True)
    identity = lambda obs: obs["state"]  # noqa: E731

    def rollouts(batch, horizon=3):
        z = torch.randn(batch, horizon + 1, LATENT)
        a = torch.rand(batch, horizon, ACTION) * 2 - 1
        for t in range(horizon):
            z[:, t + 1] = 0.9 * z[:, t] + 0.3 * torch.nn.functional.pad(a[:, t], (0, LATENT - ACTION))
        reward = z[:, :-1, 0] * a[..., 0]
        terminal = (z[:, 1:, 1] > 1.5).float()  # the episode ends when the next state crosses a line
        return {"obs": {"state": z}, "action": a, "reward": reward, "terminal": terminal}

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss, _ = model.loss(identity, rollouts(64))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = rollouts(1024)
    with torch.no_grad():
        _, metrics = model.eval().loss(identity, held_out)
    assert metrics["reward"] < 0.1 * held_out["reward"].var()
    base_rate = held_out["terminal"].mean()  # BCE of always predicting the base rate
    base_bce = -(base_rate * base_rate.log() + (1 - base_rate) * (1 - base_rate).log())
    assert metrics["termination"] < 0.3 * base_bce


# -- real robosuite Lift transitions ---------------------------------------------------------------
def collect_lift_episodes(spec, num_episodes, steps, seed=0):
    """Short episodes from varied starts, driven by smooth random actions (an AR(1) process, so the
    arm travels instead of jittering in place). Returns per-episode obs {key: [T+1, d]}, actions [T, A]."""
    env = RobosuiteEnv(spec)
    rng = np.random.default_rng(seed)
    episodes = []
    for episode in range(num_episodes):
        obs, action = [env.reset(seed=seed + episode)], np.zeros(7)
        actions = []
        for _ in range(steps):
            action = np.clip(0.8 * action + 0.6 * rng.standard_normal(7), -1, 1)
            obs.append(env.step(action)[0])
            actions.append(action)
        episodes.append(({k: torch.tensor(np.stack([o[k] for o in obs])) for k in spec.low_dim_keys},
                         torch.tensor(np.array(actions), dtype=torch.float32)))
    env.close()
    return episodes


def sequence_sampler(episodes, horizon):
    """All length-H windows of the episodes, as a function batch_size -> seq (the buffer's contract)."""
    keys = episodes[0][0].keys()
    windows = {k: torch.cat([obs[k].unfold(0, horizon + 1, 1) for obs, _ in episodes]) for k in keys}  # [W, d, H+1]
    actions = torch.cat([a.unfold(0, horizon, 1) for _, a in episodes])  # [W, A, H]

    def sample(batch_size, generator):
        index = torch.randint(actions.shape[0], (batch_size,), generator=generator)
        zeros = torch.zeros(batch_size, horizon)
        return {"obs": {k: v[index].transpose(1, 2) for k, v in windows.items()},
                "action": actions[index].transpose(1, 2), "reward": zeros, "terminal": zeros}

    return sample


def test_consistency_loss_learns_real_lift_dynamics(lift_spec):
    """A frozen random encoder isolates the dynamics: the loss can only fall by predicting real next
    latents. (Trained on consistency alone, an encoder could collapse all latents to a constant; in
    the agent the critic's loss prevents that.)"""
    torch.manual_seed(0)
    horizon = 3
    episodes = collect_lift_episodes(dataclasses.replace(lift_spec, horizon=10**6), num_episodes=33, steps=15)
    train, held_out = sequence_sampler(episodes[:-3], horizon), sequence_sampler(episodes[-3:], horizon)
    data = torch.cat([torch.cat([obs[k] for k in lift_spec.low_dim_keys], -1) for obs, _ in episodes[:-3]])
    encoder = ConcatEncoder(lift_spec.low_dim_keys, data.mean(0), data.std(0) + 1e-2, latent_dim=32)
    encoder.requires_grad_(False)
    model = LatentWorldModel(32, 7, hidden_dim=128)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    test_seq = held_out(512, torch.Generator().manual_seed(1))
    with torch.no_grad():
        z_real = rearrange(encoder({k: rearrange(v, "b t d -> (b t) d") for k, v in test_seq["obs"].items()}),
                           "(b t) z -> b t z", t=horizon + 1)

    def prediction_errors(predict) -> torch.Tensor:
        """Latent error after each of H steps [H], measured outside the loss: `predict` maps
        (z_t, a_t) to the next latent, starting from the real z_0."""
        z, errors = z_real[:, 0], []
        for t in range(horizon):
            z = predict(z, test_seq["action"][:, t])
            errors.append((z - z_real[:, t + 1]).pow(2).mean())
        return torch.stack(errors)

    def held_out_errors():  # rolled out as the planner does: a random head per step
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            return prediction_errors(lambda z, a: model.next(z, a, 1, generator=generator)[:, 0])

    before = held_out_errors()
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(300):
        loss, _ = model.loss(encoder, train(64, generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = held_out_errors()
    # Held-out episodes (new object placements); the arm's velocity is not observed, which leaves a
    # floor of unpredictable motion, so "substantially" here means a 2x drop and a clear win over
    # z' = z, at every step of the rollout.
    assert (after < 0.5 * before).all()
    assert (after < 0.8 * prediction_errors(lambda z, a: z)).all()
