"""Potential-based reward shaping (`train.reward_shaping`): online steps and demos are shaped alike."""
import dataclasses

import numpy as np
import pytest

from robo_rl.config import ConfigError, validate
from robo_rl.data.hdf5 import Episode
from robo_rl.demos.experts import LiftExpert
from robo_rl.envs.robosuite import RobosuiteEnv
from robo_rl.train.sources import Demos, shaped_rewards
from test_bad_inputs import compose_config

GAMMA = 0.99


def expert_episode(spec, seed: int) -> tuple[Episode, list[float], float]:
    """The scripted Lift expert's episode in an env shaped by `spec`, recorded as a demo (its MuJoCo states and
    the env's rewards), with the rewards the shaped env paid online and Φ of its first state."""
    env, expert = RobosuiteEnv(spec), LiftExpert(1, noise=0.0, seed=seed)
    obs = env.reset(seed=seed)
    first_potential = env._potential
    frames, states, actions, rewards, terminals, sparse = [obs], [], [], [], [], []
    for _ in range(spec.horizon):
        states.append(env.sim_state())
        action = expert.act({k: v[None] for k, v in obs.items()})[0]
        obs, reward, terminated, truncated, success = env.step(action)
        frames.append(obs)
        actions.append(action)
        rewards.append(reward)
        terminals.append(terminated)
        sparse.append(float(success))
        if terminated or truncated:
            break
    env.close()
    demo = Episode(obs={k: np.stack([f[k] for f in frames]) for k in frames[0]}, actions=np.stack(actions),
                   rewards=np.array(sparse, np.float32), terminals=np.array(terminals), states=np.stack(states))
    return demo, rewards, first_potential


def test_shaped_rewards_pay_progress_and_leave_the_sparse_return_plus_potentials(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=120, shaping_gamma=GAMMA)
    demo, online, first_potential = expert_episode(spec, seed=3)
    assert demo.terminals[-1], "the expert should lift the cube within 120 steps"
    T = demo.num_steps
    discounts = GAMMA ** np.arange(T)
    # Potential-based: the shaping telescopes, so the shaped return is the sparse one minus Φ(s_0) (Φ = 0 after
    # the terminal success): what the best policy for the sparse task is does not change.
    np.testing.assert_allclose(discounts @ np.array(online), discounts @ demo.rewards - first_potential, atol=1e-5)
    # ... while the expert's approach and grasp are paid before the success: most of its steps earn > 0
    assert np.mean(np.array(online[:-1]) > 0) > 0.5 and sum(online[:-1]) > 0.3


def test_demos_are_shaped_as_the_env_shapes_its_own_steps(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=120, shaping_gamma=GAMMA)
    demo, online, _ = expert_episode(spec, seed=5)
    shaped = next(iter(shaped_rewards(Demos.of([demo]), spec).episodes))
    # Online, robosuite reads positions and contacts as computed before the last 2 ms physics substep of a 50 ms
    # step (mj_step integrates after computing them); a demo's Φ is read at its recorded state: ~1e-3 apart.
    np.testing.assert_allclose(shaped.rewards, online, atol=2e-3)
    assert np.corrcoef(shaped.rewards, online)[0, 1] > 0.99
    unfinished = dataclasses.replace(demo, terminals=np.zeros_like(demo.terminals))
    with pytest.raises(Exception, match="no terminal at its end"):
        next(iter(shaped_rewards(Demos.of([unfinished]), spec).episodes))


def test_shaping_is_refused_where_no_robosuite_reward_runs():
    with pytest.raises(ConfigError, match="train.reward_shaping=true.*libero_object"):
        validate(compose_config("config", ["task=libero_object", "train.reward_shaping=true"]), "config")
    with pytest.raises(ConfigError, match="agent.world_model.reward=true.*planner=none"):
        validate(compose_config("config", ["task=can", "train.reward_shaping=true"]), "config")
    validate(compose_config("config", ["task=can", "train.reward_shaping=true", "agent.world_model.reward=true"]),
             "config")
