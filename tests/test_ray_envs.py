"""env.backend=ray: real robosuite Lift envs in Ray actors on a local Ray cluster, against the subprocess backend."""
import dataclasses

import numpy as np
import pytest
import ray
import torch

from robo_rl.envs.ray_runners import RayVecEnv
from robo_rl.envs.vector import VecEnv


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield
    if ray.is_initialized():
        ray.shutdown()


def rollout(env, actions: np.ndarray, seed: int) -> list:
    """Every step's StepResult (plus the first obs) for actions [T, B, A]."""
    out = [env.reset(seed=seed)]
    for a in actions:
        out.append(env.step(a))
    return out


@pytest.mark.slow  # ~45 s here: a Ray cluster, 2 runners and 3 subprocess workers start
def test_ray_runners_give_the_subprocess_backends_transitions(lift_spec):
    # horizon 6: every env auto-resets twice in 14 steps, so the per-env seed streams are compared too
    spec = dataclasses.replace(lift_spec, horizon=6)
    actions = np.random.default_rng(0).uniform(-1, 1, (14, 3, 7))
    with VecEnv(spec, 3, workers="subprocess") as env:
        expected = rollout(env, actions, seed=5)
    with RayVecEnv(spec, 3, num_runners=2) as env:
        assert env.env_ids == [[0, 2], [1]]
        got = rollout(env, actions, seed=5)
    for k in expected[0]:
        torch.testing.assert_close(got[0][k], expected[0][k], rtol=0, atol=0)
    for e, g in zip(expected[1:], got[1:]):
        for field in ("reward", "terminated", "truncated", "success", "lost"):
            assert torch.equal(getattr(g, field), getattr(e, field)), field
        for k in e.obs:
            torch.testing.assert_close(g.obs[k], e.obs[k], rtol=0, atol=0)
            torch.testing.assert_close(g.next_obs[k], e.next_obs[k], rtol=0, atol=0)
    assert sum(bool(r.truncated.any()) for r in got[1:]) == 2


def test_killed_runner_is_restarted_and_its_episodes_come_back_truncated_and_lost(lift_spec):
    with RayVecEnv(lift_spec, 2, num_runners=2, step_timeout=60) as env:
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros((2, 7)))
        old_pid, other_pid = env.pids
        ray.kill(env.workers[0], no_restart=False)  # as a crash would: Ray restarts the actor
        result = env.step(np.zeros((2, 7)))
        assert result.truncated.tolist() == [True, False] and result.lost.tolist() == [True, False]
        assert env.num_restarts == 1 and env.pids[0] != old_pid and env.pids[1] == other_pid
        assert "runner 0" in env.lost_reasons[0]
        # the restarted runner's env began a new episode from its seed stream (seed 0 + num_envs)
        with VecEnv(lift_spec, 1, workers="sync") as reference:
            fresh = reference.reset(seed=2)["object"][0]
        torch.testing.assert_close(result.obs["object"][0], fresh, rtol=0, atol=0)
        for _ in range(3):  # and stepping goes on in both runners
            result = env.step(np.zeros((2, 7)))
        assert not result.lost.any() and env.num_restarts == 1
