"""Potential-based reward shaping (`train.reward_shaping`): online steps and demos are shaped alike."""
import dataclasses
from contextlib import closing

import numpy as np
import pytest

from robo_rl.config import ConfigError, validate
from robo_rl.data.hdf5 import DatasetError, Episode
from robo_rl.demos.collect import collect_demos
from robo_rl.envs.robosuite import RobosuiteEnv
from robo_rl.train.sources import Demos, shaped_rewards
from test_bad_inputs import compose_config

GAMMA = 0.99


def expert_episode(spec, seed: int) -> tuple[Episode, np.ndarray]:
    """One scripted Lift episode as a demo (the env's own sparse rewards), and the rewards the same episode is paid
    online in an env shaped by `spec` (shaping does not touch the simulation, so the two episodes are one)."""
    def collect(spec):
        episodes, _, _ = collect_demos(spec, "lift", 1, noise=0.0, seed=seed, num_envs=1, workers="sync",
                                       progress=False)
        return episodes[0]

    return collect(dataclasses.replace(spec, shaping_gamma=0.0)), collect(spec).rewards


def test_shaped_rewards_pay_progress_and_leave_the_sparse_return_plus_potentials(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=120, shaping_gamma=GAMMA)
    demo, online = expert_episode(spec, seed=3)
    assert demo.terminals[-1], "the expert should lift the cube within 120 steps"
    with closing(RobosuiteEnv(spec)) as env:
        first_potential = env.progress_at(demo.states[:1])[0]
    T = demo.num_steps
    discounts = GAMMA ** np.arange(T)
    # Potential-based: the shaping telescopes, so the shaped return is the sparse one minus Φ(s_0) (Φ = 0 after
    # the terminal success): what the best policy for the sparse task is does not change.
    np.testing.assert_allclose(discounts @ online, discounts @ demo.rewards - first_potential, atol=1e-5)
    # ... while the expert's approach and grasp are paid before the success: most of its steps earn > 0
    assert np.mean(online[:-1] > 0) > 0.5 and sum(online[:-1]) > 0.3


def test_demos_are_shaped_as_the_env_shapes_its_own_steps(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=120, shaping_gamma=GAMMA)
    demo, online = expert_episode(spec, seed=5)
    shaped = next(iter(shaped_rewards(Demos.of([demo]), spec).episodes))
    # Online, robosuite reads positions and contacts as computed before the last 2 ms physics substep of a 50 ms
    # step (mj_step integrates after computing them); a demo's Φ is read at its recorded state: ~1e-3 apart.
    np.testing.assert_allclose(shaped.rewards, online, atol=2e-3)
    assert np.corrcoef(shaped.rewards, online)[0, 1] > 0.99
    unfinished = dataclasses.replace(demo, terminals=np.zeros_like(demo.terminals))
    with pytest.raises(DatasetError, match="no terminal at its end"):
        next(iter(shaped_rewards(Demos.of([unfinished]), spec).episodes))


def test_shaping_is_refused_where_no_robosuite_reward_runs():
    with pytest.raises(ConfigError, match="train.reward_shaping=true.*libero_object"):
        validate(compose_config("config", ["task=libero_object", "train.reward_shaping=true"]), "config")
    with pytest.raises(ConfigError, match="agent.world_model.reward=true.*planner=none"):
        validate(compose_config("config", ["task=can", "train.reward_shaping=true"]), "config")
    validate(compose_config("config", ["task=can", "train.reward_shaping=true", "agent.world_model.reward=true"]),
             "config")
