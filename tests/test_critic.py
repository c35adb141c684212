"""Q ensemble: batched heads, target aggregation, Polyak target, TD learning to a known fixed point."""
from __future__ import annotations

import pytest
import torch

from robo_rl.agents.critic import QEnsemble


def test_forward_shapes_and_disagreement():
    critic = QEnsemble(6, 3, (32, 32), num_heads=5)
    z, a = torch.randn(9, 6), torch.randn(9, 3)
    q = critic(z, a)
    assert q.shape == (5, 9)
    torch.testing.assert_close(critic.disagreement(z, a), q.std(0))
    for e in range(5):  # head e alone equals row e of the batched forward
        torch.testing.assert_close(critic.net(torch.cat([z, a], -1), torch.tensor([e]))[0, :, 0], q[e])


def test_target_aggregations():
    torch.manual_seed(0)
    z, a = torch.randn(9, 6), torch.randn(9, 3)
    full_min = QEnsemble(6, 3, (16,), num_heads=4, target_agg="min", target_subset=4)
    target_q = full_min.target_net(torch.cat([z, a], -1)).squeeze(-1)
    torch.testing.assert_close(full_min.target_value(z, a), target_q.min(0).values)

    subset = QEnsemble(6, 3, (16,), num_heads=4, target_agg="min", target_subset=2)
    target_q = subset.target_net(torch.cat([z, a], -1)).squeeze(-1)
    value = subset.target_value(z, a)
    pairs = [target_q[[i, j]].min(0).values for i in range(4) for j in range(i + 1, 4)]
    assert any(torch.allclose(value, pair) for pair in pairs)

    pessimistic = QEnsemble(6, 3, (16,), num_heads=4, target_agg="mean_std", target_beta=0.5)
    target_q = pessimistic.target_net(torch.cat([z, a], -1)).squeeze(-1)
    torch.testing.assert_close(pessimistic.target_value(z, a), target_q.mean(0) - 0.5 * target_q.std(0))

    with pytest.raises(ValueError, match="target_agg"):
        QEnsemble(6, 3, (16,), target_agg="max")


def test_target_starts_equal_and_follows_by_polyak_averaging():
    critic = QEnsemble(4, 2, (8,), num_heads=3)
    z, a = torch.randn(5, 4), torch.randn(5, 2)
    torch.testing.assert_close(critic.target_net(torch.cat([z, a], -1)).squeeze(-1), critic(z, a))
    assert not any(p.requires_grad for p in critic.target_net.parameters())
    old = critic.target_net.linears[0].weight.clone()
    with torch.no_grad():
        critic.net.linears[0].weight.add_(1.0)
    critic.update_target(0.1)
    torch.testing.assert_close(critic.target_net.linears[0].weight, old + 0.1)


def test_detach_params_keeps_critic_weights_out_of_the_actor_gradient():
    critic = QEnsemble(4, 2, (8,), num_heads=3)
    z, a = torch.randn(5, 4), torch.randn(5, 2, requires_grad=True)
    critic(z, a, detach_params=True).mean().backward()
    assert a.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def test_td_learning_reaches_the_fixed_point():
    """A single state looping to itself with reward 1 and discount 0.5: Q* = 1 / (1 - 0.5) = 2."""
    torch.manual_seed(0)
    critic = QEnsemble(4, 1, (32, 32), num_heads=4)
    optimizer = torch.optim.Adam(critic.net.parameters(), lr=3e-3)
    z = torch.ones(64, 4)
    for _ in range(400):
        a = torch.rand(64, 1) * 2 - 1
        target = 1.0 + 0.5 * critic.target_value(z, torch.rand(64, 1) * 2 - 1)
        loss = (critic(z, a) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        critic.update_target(0.05)
    q = critic(z, torch.rand(64, 1) * 2 - 1)
    assert q.mean().item() == pytest.approx(2.0, abs=0.05)
