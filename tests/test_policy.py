"""Shortcut-flow policy: multimodal flow matching, self-consistency, k-step sampling, best-of-N."""
from __future__ import annotations

import copy

import pytest
import torch

from robo_rl.agents.policy import ShortcutFlowPolicy
from robo_rl.nets.mlp import ema_update_

MODES = 0.6  # the toy action distribution: +-0.6 with equal mass, std 0.05


def bimodal_actions(n: int) -> torch.Tensor:
    sign = torch.randint(0, 2, (n, 1)) * 2 - 1
    return MODES * sign + 0.05 * torch.randn(n, 1)


def train_toy_policy(self_consistency: bool, steps: int = 1000) -> ShortcutFlowPolicy:
    """Fit the bimodal toy with flow matching (+ self-consistency against an EMA target)."""
    torch.manual_seed(0)
    policy = ShortcutFlowPolicy(4, 1, (64, 64))
    target = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    z = torch.zeros(256, 4)
    for _ in range(steps):
        actions = bimodal_actions(256)
        loss = policy.flow_matching_loss(z, actions)
        if self_consistency:
            loss = loss + policy.self_consistency_loss(z, actions, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema_update_(target, policy, 0.02)
    return policy


@pytest.fixture(scope="module")
def flow_only() -> ShortcutFlowPolicy:
    return train_toy_policy(self_consistency=False)


@pytest.fixture(scope="module")
def shortcut() -> ShortcutFlowPolicy:
    return train_toy_policy(self_consistency=True)


def fraction_near(actions: torch.Tensor, value: float) -> float:
    return ((actions - value).abs() < 0.2).float().mean().item()


@torch.no_grad()
def test_flow_matching_learns_both_modes(flow_only):
    torch.manual_seed(1)
    actions = flow_only.sample(torch.zeros(2000, 4), steps=8)
    assert fraction_near(actions, MODES) > 0.3
    assert fraction_near(actions, -MODES) > 0.3
    # A Gaussian fit (mean 0, std 0.6) would put 26% of its samples here.
    assert fraction_near(actions, 0.0) < 0.1


@torch.no_grad()
def test_one_step_matches_eight_steps_after_shortcut_training(flow_only, shortcut):
    torch.manual_seed(1)
    z, noise = torch.zeros(2000, 4), torch.randn(2000, 1)
    gap = (shortcut.sample(z, 1, noise) - shortcut.sample(z, 8, noise)).abs().mean()
    # Flow matching alone never trains the 1-step size: its 1-step samples are far from its 8-step ones.
    gap_without = (flow_only.sample(z, 1, noise) - flow_only.sample(z, 8, noise)).abs().mean()
    assert gap < 0.15 < 0.3 < gap_without
    one_step = shortcut.sample(z, 1, noise)
    assert fraction_near(one_step, MODES) > 0.3 and fraction_near(one_step, -MODES) > 0.3


def test_self_consistency_is_zero_for_a_constant_velocity_field():
    torch.manual_seed(0)
    policy = ShortcutFlowPolicy(3, 2, (16, 16))
    last = policy.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.3, -0.7]))
    target = copy.deepcopy(policy)
    z, actions = torch.randn(64, 3), torch.rand(64, 2) * 2 - 1
    assert policy.self_consistency_loss(z, actions, target).item() == pytest.approx(0.0, abs=1e-12)
    with torch.no_grad():  # a field that depends on x_t: two half steps no longer equal one full step
        last.weight.normal_()
    target = copy.deepcopy(policy)
    assert policy.self_consistency_loss(z, actions, target).item() > 1e-3


def test_sample_shapes_clipping_and_step_validation():
    policy = ShortcutFlowPolicy(5, 3, (16,), horizon=2)
    z = torch.randn(7, 5)
    for steps in (1, 2, 4, 8):
        actions = policy.sample(z, steps, noise=torch.randn(7, 6) * 10)
        assert actions.shape == (7, 6)
        assert actions.abs().max() <= 1.0
    with pytest.raises(ValueError, match="power of 2"):
        policy.sample(z, 3)
    with pytest.raises(ValueError, match="power of 2"):
        policy.sample(z, 16)


def test_best_of_n_picks_the_highest_scoring_candidate():
    torch.manual_seed(0)
    policy = ShortcutFlowPolicy(4, 2, (16,))
    z, noise = torch.randn(5, 4), torch.randn(5, 6, 2)
    goal = torch.tensor([0.3, -0.2])

    def q_fn(z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return -(a - goal).square().sum(-1)

    with torch.no_grad():
        chosen = policy.sample_best_of_n(z, 6, q_fn, steps=2, noise=noise)
        candidates = torch.stack([policy.sample(z, 2, noise[:, i]) for i in range(6)], 1)  # [B, N, A]
    scores = -(candidates - goal).square().sum(-1)  # [B, N]
    expected = candidates[torch.arange(5), scores.argmax(1)]
    torch.testing.assert_close(chosen, expected)
    assert (scores.argmax(1) != 0).any()  # not trivially the first candidate


def test_flow_matching_clones_only_the_rows_it_is_given():
    """bc_data="offline": actions of the other rows (online exploration) must not move the BC loss."""
    torch.manual_seed(0)
    policy = ShortcutFlowPolicy(4, 2, (32,))
    z, actions = torch.randn(8, 4), torch.rand(8, 2) * 2 - 1
    rows = torch.tensor([True, False] * 4)
    changed = actions.clone()
    changed[~rows] = -changed[~rows]

    def loss(a, rows=None):
        torch.manual_seed(1)  # the same noise and times for both action sets
        return policy.flow_matching_loss(z, a, rows)

    assert loss(changed, rows) == loss(actions, rows)
    assert loss(changed) != loss(actions)
    assert loss(actions, torch.zeros(8, dtype=torch.bool)) == 0


def test_self_consistency_trains_only_the_rows_it_is_given():
    """sc_data="bc": states and actions of the other rows must not move the loss or reach the gradient; with
    every row given, the loss and gradient equal the unmasked ones bit for bit (an offline phase is unchanged)."""
    torch.manual_seed(0)
    policy, target = ShortcutFlowPolicy(4, 2, (32,)), ShortcutFlowPolicy(4, 2, (32,))
    z, actions = torch.randn(8, 4), torch.rand(8, 2) * 2 - 1
    rows = torch.tensor([True, False] * 4)
    z_changed, actions_changed = z.clone(), actions.clone()
    z_changed[~rows], actions_changed[~rows] = 3 * z[~rows], -actions[~rows]

    def loss_and_grad(z, a, rows=None):
        policy.zero_grad()
        torch.manual_seed(1)  # the same noise and times for every input
        loss = policy.self_consistency_loss(z, a, target, rows)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in policy.parameters()])

    kept, kept_grad = loss_and_grad(z, actions, rows)
    changed, changed_grad = loss_and_grad(z_changed, actions_changed, rows)
    assert kept == changed and torch.equal(kept_grad, changed_grad)
    assert loss_and_grad(z_changed, actions_changed)[0] != loss_and_grad(z, actions)[0]
    unmasked, unmasked_grad = loss_and_grad(z, actions)
    every, every_grad = loss_and_grad(z, actions, torch.ones(8, dtype=torch.bool))
    assert every == unmasked and torch.equal(every_grad, unmasked_grad)
    assert loss_and_grad(z, actions, torch.zeros(8, dtype=torch.bool))[0] == 0
