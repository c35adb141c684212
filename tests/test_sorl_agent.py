"""SORLAgent: updates that learn on a synthetic batch, acting, chunks, images, checkpoints."""
from __future__ import annotations

import math

import pytest
import torch

from robo_rl.agents.sorl import SORLAgent, SORLConfig
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.nets.encoders import EncoderConfig

LIFT_SHAPES = {"object": (10,), "robot0_eef_pos": (3,), "robot0_eef_quat": (4,), "robot0_gripper_qpos": (2,)}
ACTION_DIM = 7


def small_config(**overrides) -> SORLConfig:
    encoder = EncoderConfig(latent_dim=32, hidden_dims=(64,), cnn_channels=8, image_feature_dim=16)
    defaults = dict(actor_hidden_dims=(64, 64), critic_hidden_dims=(64, 64), num_critics=4, lr=3e-3)
    return SORLConfig(encoder=encoder, **(defaults | overrides))


def synthetic_batch(shapes: dict, batch_size: int = 64, action_shape: tuple = (ACTION_DIM,)) -> dict:
    """Actions and rewards are fixed functions of the observation, so both are learnable."""
    def obs() -> dict[str, torch.Tensor]:
        return {
            k: torch.randint(0, 256, (batch_size, *s), dtype=torch.uint8) if k.endswith("_image")
            else torch.randn(batch_size, *s)
            for k, s in shapes.items()
        }  # fmt: skip

    current = obs()
    action = torch.tanh(current["object"][:, : math.prod(action_shape)])
    return {
        "obs": current,
        "action": action.reshape(batch_size, *action_shape),
        "reward": (current["object"][:, 0] > 0).float(),
        "discount": torch.where(torch.arange(batch_size) % 4 == 0, 0.0, 0.99),
        "next_obs": obs(),
        "offline": torch.ones(batch_size, dtype=torch.bool),
    }


def test_update_decreases_losses_and_act_returns_actions_in_bounds():
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config())
    batch = synthetic_batch(LIFT_SHAPES)
    error_before = (agent.act(batch["obs"]) - batch["action"]).square().mean()
    history = [agent.update(batch) for _ in range(100)]
    assert set(history[0]) >= {"critic_loss", "fm_loss", "sc_loss", "q_loss", "actor_loss", "q", "td_target"}
    assert all(torch.isfinite(torch.tensor(list(h.values()))).all() for h in history)

    def mean(key: str, steps: list[dict]) -> float:
        return sum(h[key] for h in steps) / len(steps)

    assert mean("critic_loss", history[-10:]) < 0.5 * mean("critic_loss", history[:10])
    assert mean("fm_loss", history[-10:]) < 0.5 * mean("fm_loss", history[:10])

    actions = agent.act(batch["obs"])
    assert actions.shape == (64, ACTION_DIM)
    assert actions.abs().max() <= 1.0
    assert (actions - batch["action"]).square().mean() < 0.5 * error_before  # imitates the data
    assert agent.act(batch["obs"], steps=1, best_of_n=4).shape == (64, ACTION_DIM)
    assert agent.training  # act() restores the mode it found


def test_targets_follow_online_networks_slowly():
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(tau=0.1))
    batch = synthetic_batch(LIFT_SHAPES)
    before = agent.target_policy.net[0].weight.clone()
    agent.update(batch)
    online, target = agent.policy.net[0].weight, agent.target_policy.net[0].weight
    assert not torch.equal(target, before)
    torch.testing.assert_close(target, 0.9 * before + 0.1 * online.detach())


def test_bc_only_when_q_weight_is_zero():
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(q_weight=0.0))
    info = agent.update(synthetic_batch(LIFT_SHAPES))
    assert "q_loss" not in info
    assert info["actor_loss"] == pytest.approx(10 * info["fm_loss"] + 10 * info["sc_loss"], rel=1e-5)


@pytest.mark.parametrize("bc_data, cloned", [("offline", (True, False, False, True)),
                                             ("successes", (True, True, False, False)),
                                             ("all", (True, True, True, True))])
def test_bc_data_picks_the_rows_flow_matching_clones(bc_data, cloned):
    """Rows in four groups: demos, online rows of successful episodes, other online rows, offline rows of a
    failed rollout (no terminal step). Changing the actions of a group moves the flow-matching loss exactly
    when bc_data clones that group."""
    batch = synthetic_batch(LIFT_SHAPES)
    group = torch.arange(64) % 4
    batch |= {"offline": (group == 0) | (group == 3), "success": group <= 1}  # demos count as successes too

    def fm_loss(b: dict) -> float:
        torch.manual_seed(0)
        agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(bc_data=bc_data, q_weight=0.0))
        torch.manual_seed(1)  # the same noise and flow times for every action set
        return agent.update(b)["fm_loss"]

    reference = fm_loss(batch)
    for g in range(4):
        changed = batch | {"action": torch.where((group == g)[:, None], -batch["action"], batch["action"])}
        assert (fm_loss(changed) != reference) == cloned[g], g
    if bc_data == "successes":
        with pytest.raises(ValueError, match="success"):
            fm_loss({k: v for k, v in batch.items() if k != "success"})


@pytest.mark.parametrize("sc_data, trained", [("all", (True, True)), ("bc", (True, False))])
def test_sc_data_picks_the_rows_self_consistency_trains_on(sc_data, trained):
    """Demo rows and online rows (bc_data=offline): changing the states and actions of a group moves the
    self-consistency loss exactly when sc_data trains on that group."""
    batch = synthetic_batch(LIFT_SHAPES)
    demo = torch.arange(64) % 2 == 0
    batch |= {"offline": demo, "success": demo}

    def sc_loss(b: dict) -> float:
        torch.manual_seed(0)
        agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(sc_data=sc_data, q_weight=0.0))
        torch.manual_seed(1)  # the same noise and flow times for every batch
        return agent.update(b)["sc_loss"]

    reference = sc_loss(batch)
    for group, is_trained in zip((demo, ~demo), trained):
        obs = {k: torch.where(group.view(-1, *[1] * (v.dim() - 1)), 2 * v + 1, v) for k, v in batch["obs"].items()}
        action = torch.where(group[:, None], -batch["action"], batch["action"])
        assert (sc_loss(batch | {"obs": obs, "action": action}) != reference) == is_trained
    with pytest.raises(ValueError, match="sc_data"):
        small_config(sc_data="online")


def test_action_chunks_and_image_obs():
    torch.manual_seed(0)
    shapes = {"agentview_image": (3, 48, 48), "object": (10,), "task_id": ()}
    agent = SORLAgent(shapes, 2, num_tasks=3, config=small_config(action_horizon=3))
    batch = synthetic_batch(shapes, batch_size=8, action_shape=(3, 2))
    batch["obs"]["task_id"] = batch["next_obs"]["task_id"] = torch.randint(0, 3, (8,))
    info = agent.update(batch)
    assert torch.isfinite(torch.tensor(list(info.values()))).all()
    assert agent.act(batch["obs"]).shape == (8, 3, 2)
    z = agent.encode(batch["obs"])
    assert agent.pi(z).shape == (8, 6) and agent.q(z, agent.pi(z)).shape == (8,)
    with pytest.raises(ValueError, match="expected"):
        agent.update(dict(batch, action=torch.zeros(8, 5)))


def test_state_dict_round_trip_keeps_normalization_and_behaviour():
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config())
    agent.set_normalization({"object": (torch.ones(10), torch.full((10,), 3.0))})
    torch.testing.assert_close(agent.target_encoder.low_dim_std, agent.encoder.low_dim_std)
    batch = synthetic_batch(LIFT_SHAPES)
    agent.update(batch)

    restored = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config())
    restored.load_state_dict(agent.state_dict())
    noise = torch.randn(64, ACTION_DIM)
    with torch.no_grad():
        torch.testing.assert_close(
            restored.policy.sample(restored.encode(batch["obs"]), 4, noise),
            agent.policy.sample(agent.encode(batch["obs"]), 4, noise),
        )


def test_gradient_routing_of_the_actor_terms():
    """The SC and Q terms train only the policy: no gradient reaches the encoder or the critic."""
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(fm_weight=0.0))
    batch = synthetic_batch(LIFT_SHAPES)
    z = agent.encode(batch["obs"])
    loss, info = agent.actor_loss(z, batch["action"])
    assert "q_loss" in info
    loss.backward()
    assert all(has_gradient(p) for p in agent.policy.parameters())
    assert not any(has_gradient(p) for p in agent.encoder.parameters())  # fm_weight 0: only zeros arrive
    assert not any(has_gradient(p) for p in agent.critic.parameters())

    agent.optimizer.zero_grad(set_to_none=True)
    z = agent.encode(batch["obs"])
    critic_loss, _ = agent.critic_loss(z, batch["action"], batch["reward"], batch["discount"], z.detach())
    critic_loss.backward()  # the critic loss trains the critic and the encoder, never the policy
    assert not any(has_gradient(p) for p in agent.policy.parameters())
    assert all(has_gradient(p) for p in agent.critic.net.parameters())
    assert any(has_gradient(p) for p in agent.encoder.parameters())


def has_gradient(param: torch.Tensor) -> bool:
    return param.grad is not None and bool(param.grad.any())


@pytest.mark.parametrize("weight", [0.0, 0.1])
def test_conservative_term_ranks_actions_the_data_never_took_lower(weight):
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(conservative_weight=weight))
    batch = synthetic_batch(LIFT_SHAPES)
    for _ in range(150):
        info = agent.update(batch)
    assert ("conservative_gap" in info) == (weight > 0)
    with torch.no_grad():
        z = agent.encode(batch["obs"])
        q_data = agent.q(z, batch["action"])
        q_uniform = agent.q(z, torch.rand_like(batch["action"]) * 2 - 1)
    margin = (q_data - q_uniform).mean().item()
    if weight:  # uniform actions end up clearly below the data's
        assert margin > 0.5
    else:  # plain TD extrapolates: no such ordering is learned
        assert margin < 0.5


def test_td_target_takes_the_best_of_n_policy_samples_by_the_target_critic():
    """The target's next action is the target critic's pick among n samples at each next state: the value
    equals the max over that state's own candidates (not a neighbour's), and more candidates raise it."""
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(target_best_of_n=6, target_agg="mean_std"))
    next_z = agent.encode(synthetic_batch(LIFT_SHAPES, batch_size=32)["next_obs"]).detach()

    torch.manual_seed(1)
    picked = agent.next_value(next_z)  # [32]
    torch.manual_seed(1)  # the same draws, by hand: k, then the 6 candidates of each state in turn
    steps = agent._draw_q_steps()
    candidates = agent.policy.sample(next_z.repeat_interleave(6, 0), steps)
    values = agent.critic.target_value(next_z.repeat_interleave(6, 0), candidates).view(32, 6)
    torch.testing.assert_close(picked, values.max(1).values)
    assert (values.max(1).values > values.min(1).values).all()  # the candidates differ, so the pick matters

    agent.config.target_best_of_n = 1
    single = torch.stack([agent.next_value(next_z) for _ in range(20)]).mean()
    agent.config.target_best_of_n = 16
    best_of_16 = torch.stack([agent.next_value(next_z) for _ in range(20)]).mean()
    assert best_of_16 > single
    assert math.isfinite(agent.update(synthetic_batch(LIFT_SHAPES))["td_target"])


def test_update_trains_the_world_model_through_the_agents_own_optimizer():
    """The agent's update must step every module it computes gradients for. The world model once had
    gradients but no optimizer entry, so QWM searched with its random initialisation."""
    torch.manual_seed(0)
    config = small_config(world_model=WorldModelConfig(num_heads=4, hidden_dim=64, num_layers=2))
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=config)
    batch = synthetic_batch(LIFT_SHAPES)
    # Sequences whose next observation is a fixed function of the current one and the action: learnable.
    action = torch.tanh(torch.randn(64, 2, ACTION_DIM))
    steps = [{k: torch.randn(64, *s) for k, s in LIFT_SHAPES.items()}]
    for t in range(2):
        moved = dict(steps[-1])
        moved["object"] = moved["object"] + 0.5 * torch.nn.functional.pad(action[:, t], (0, 3))
        steps.append(moved)
    obs = {k: torch.stack([step[k] for step in steps], dim=1) for k in LIFT_SHAPES}  # [B, 3, ...]
    seq = {"obs": obs, "action": action, "reward": torch.zeros(64, 2), "terminal": torch.zeros(64, 2, dtype=torch.bool)}
    before = [p.detach().clone() for p in agent.world_model.parameters()]
    history = [agent.update(batch, seq) for _ in range(60)]
    assert all(not torch.equal(b, p) for b, p in zip(before, agent.world_model.parameters()))
    # Learned, not just moved: one step ahead, the heads predict the encoder's next latent better than
    # "nothing changes" does (the observation moves with the action, so a model must use it).
    with torch.no_grad():
        z0, z1 = agent.encode({k: v[:, 0] for k, v in obs.items()}), agent.encode({k: v[:, 1] for k, v in obs.items()})
        model_error = (agent.world_model.dynamics(z0, action[:, 0]) - z1).square().mean()
        copy_error = (z0 - z1).square().mean()
    assert model_error < 0.5 * copy_error


def test_an_update_without_sequences_leaves_the_world_model_out():
    """update(batch) alone gives the world model no gradient: it must not report (or clip) one. Its
    norm was a CPU zero among the CUDA norms, which broke every such update with device=cuda."""
    torch.manual_seed(0)
    config = small_config(world_model=WorldModelConfig(num_heads=4, hidden_dim=64, num_layers=2))
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=config)
    before = [p.detach().clone() for p in agent.world_model.parameters()]
    metrics = agent.update(synthetic_batch(LIFT_SHAPES))
    assert "world_model_grad_norm" not in metrics and "critic_grad_norm" in metrics
    assert all(torch.equal(b, p) for b, p in zip(before, agent.world_model.parameters()))
