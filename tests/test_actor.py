"""Acting with an agent: policy only, through QWM search, and with per-group parameter noise."""
import pytest
import torch

from robo_rl.agents.sorl import SORLAgent, SORLConfig
from robo_rl.agents.world_model import WorldModelConfig
from robo_rl.nets.encoders import EncoderConfig
from robo_rl.planning.actor import AgentActor
from robo_rl.planning.qwm import QWMConfig, QWMPlanner

SHAPES = {"state": (5,), "task_id": ()}


def small_agent(action_horizon: int = 1, execute_steps: int | None = None) -> SORLAgent:
    torch.manual_seed(0)
    cfg = SORLConfig(encoder=EncoderConfig(latent_dim=16, hidden_dims=(32,)), actor_hidden_dims=(32, 32),
                     critic_hidden_dims=(32, 32), num_critics=2, action_horizon=action_horizon,
                     execute_steps=execute_steps,
                     world_model=WorldModelConfig(num_heads=4, hidden_dim=32, num_layers=2))
    return SORLAgent(SHAPES, 3, 1, cfg)


def obs(batch: int) -> dict:
    return {"state": torch.randn(batch, 5), "task_id": torch.zeros(batch, dtype=torch.int64)}


def test_search_actor_picks_one_of_the_policy_candidates():
    agent = small_agent()
    actor = AgentActor(agent, QWMPlanner(QWMConfig(num_actions=4, num_samples=4, depth=2, leaf_actions=2)))
    draws = []  # every batch of actions the policy samples during the search
    sample = agent.policy.sample

    def recording_sample(z, *args, **kwargs):
        draws.append(sample(z, *args, **kwargs))
        return draws[-1]

    agent.policy.sample = recording_sample
    actions = actor.act(obs(6))
    assert actions.shape == (6, 3) and actions.device.type == "cpu"
    # The search's first draw holds the N=4 root candidates of each env (rows env-major); later draws
    # (probe actions of imagined states, leaf actions) are other samples, which must not come out.
    roots = draws[0].float().cpu().view(6, 4, 3)
    assert len(draws) > 1
    for env in range(6):
        assert sum(torch.equal(actions[env], c) for c in roots[env]) == 1, (actions[env], roots[env])
        later = torch.cat([d.float().cpu() for d in draws[1:]])
        assert not (later == actions[env]).all(1).any()


def test_param_noise_perturbs_each_group_and_resamples_independently():
    agent = small_agent()
    actor = AgentActor(agent, param_noise_std=0.1, num_groups=2, seed=1)
    base = torch.nn.utils.parameters_to_vector(agent.policy.parameters())
    noisy = [torch.nn.utils.parameters_to_vector(p.parameters()) for p in actor._noisy_policies]
    for vector in noisy:  # θ_g - θ ~ N(0, σ²)
        assert abs((vector - base).std().item() - 0.1) < 0.01
    assert not torch.allclose(noisy[0], noisy[1])
    actor.resample_noise([1])
    after = [torch.nn.utils.parameters_to_vector(p.parameters()) for p in actor._noisy_policies]
    assert torch.equal(after[0], noisy[0]) and not torch.equal(after[1], noisy[1])
    actions = actor.act(obs(4))  # rows 0, 2 act with group 0's copy, rows 1, 3 with group 1's
    assert actions.shape == (4, 3) and actions.abs().max() <= 1.0


def test_pessimistic_search_scores_the_ensemble_lower_bound():
    agent = small_agent()
    z, a = agent.encode(obs(5)), torch.rand(5, 3) * 2 - 1
    heads = agent.critic(z, a)  # [E, B]
    lower = agent.q(z, a, pessimism=2.0)
    torch.testing.assert_close(lower, heads.mean(0) - 2.0 * heads.std(0))
    assert (lower < agent.q(z, a)).all()
    actor = AgentActor(agent, QWMPlanner(QWMConfig(num_actions=4, num_samples=2, depth=1, leaf_actions=2, pessimism=2.0)))
    assert actor.act(obs(3)).shape == (3, 3)


@pytest.mark.parametrize("search", [False, True])
def test_chunks_execute_open_loop_and_replan_when_used_up_or_reset(search):
    agent = small_agent(action_horizon=3)
    planner = QWMPlanner(QWMConfig(num_actions=4, num_samples=2, depth=1, leaf_actions=2)) if search else None
    actor = AgentActor(agent, planner)
    first = actor.act(obs(2))
    chunks = actor._chunks.clone()  # [B, h, A]
    assert chunks.shape == (2, 3, 3) and torch.equal(first, chunks[:, 0])
    # The next two steps finish the chunk whatever the observation says.
    assert torch.equal(actor.act(obs(2)), chunks[:, 1]) and torch.equal(actor.act(obs(2)), chunks[:, 2])
    fresh = actor.act(obs(2))
    assert not torch.equal(actor._chunks, chunks) and torch.equal(fresh, actor._chunks[:, 0])
    chunks = actor._chunks.clone()
    actor.reset([1])  # env 1's episode restarted: it replans, env 0 carries on
    step = actor.act(obs(2))
    assert torch.equal(step[0], chunks[0, 1]) and torch.equal(step[1], actor._chunks[1, 0])
    assert not torch.equal(actor._chunks[1], chunks[1])


def test_receding_horizon_executes_the_first_steps_of_each_chunk_then_replans():
    actor = AgentActor(small_agent(action_horizon=3, execute_steps=2))
    first = actor.act(obs(2))
    chunks = actor._chunks.clone()
    assert torch.equal(first, chunks[:, 0]) and torch.equal(actor.act(obs(2)), chunks[:, 1])
    fresh = actor.act(obs(2))  # the chunk's third action is never executed: a new chunk starts
    assert not torch.equal(actor._chunks, chunks) and torch.equal(fresh, actor._chunks[:, 0])
    with pytest.raises(ValueError, match=r"agent.execute_steps=4: a chunk holds agent.action_horizon=3"):
        small_agent(action_horizon=3, execute_steps=4)


def test_chunk_state_is_kept_per_env_of_the_vec_env():
    agent = small_agent(action_horizon=3)
    actor = AgentActor(agent)
    first = actor.act(obs(2), env_ids=[3, 1])  # rows are envs 3 and 1: state grows to envs 0..3
    assert actor._chunks.shape == (4, 3, 3) and torch.equal(first, actor._chunks[[3, 1], 0])
    chunks = actor._chunks.clone()
    assert torch.equal(actor.act(obs(1), env_ids=[1]), chunks[[1], 1])  # env 1 alone: env 3 does not advance
    actor.reset([3])
    step = actor.act(obs(2), env_ids=[1, 3])
    assert torch.equal(step[0], chunks[1, 2]) and torch.equal(step[1], actor._chunks[3, 0])
    assert not torch.equal(actor._chunks[3], chunks[3]) and actor._next.tolist() == [3, 3, 3, 1]


def test_drift_guard_keeps_each_envs_lean_until_its_episode_restarts():
    agent = small_agent()
    actor = AgentActor(agent, QWMPlanner(QWMConfig(num_actions=4, num_samples=2, depth=1, leaf_actions=2,
                                                   drift_decay=0.5)))
    actor.act(obs(2), env_ids=[2, 0])  # state grows to envs 0..2; env 1 has not acted
    first = actor._drift.clone()
    assert first.shape == (3, 3) and (first[[0, 2]].abs().sum(1) > 0).all() and (first[1] == 0).all()
    # the planner is handed each env's own lean and returns it decayed plus the new pick's deviation
    planned = []
    plan = actor.planner.plan
    actor.planner.plan = lambda *args, **kwargs: planned.append(kwargs["drift"].clone()) or plan(*args, **kwargs)
    actor.act(obs(1), env_ids=[2])
    torch.testing.assert_close(planned[0], first[[2]])
    assert torch.equal(actor._drift[0], first[0]) and not torch.equal(actor._drift[2], first[2])
    actor.reset([2])
    assert (actor._drift[2] == 0).all() and torch.equal(actor._drift[0], first[0])
