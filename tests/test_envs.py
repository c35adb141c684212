"""Real robosuite / LIBERO envs behind the batched interface."""
import dataclasses
import os
import signal

import numpy as np
import pytest
import torch

from robo_rl.demos.experts import LiftExpert, SquareExpert
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv


def test_lift_random_actions_shapes_dtypes(lift_spec):
    with VecEnv(lift_spec, 2, workers="subprocess") as env:
        obs = env.reset(seed=0)
        assert obs["object"].shape == (2, 10) and obs["object"].dtype == torch.float32
        assert obs["robot0_eef_pos"].shape == (2, 3) and obs["robot0_eef_quat"].shape == (2, 4)
        assert obs["robot0_gripper_qpos"].shape == (2, 2)
        assert obs["task_id"].dtype == torch.int64
        # per-env seeds: the two cubes start in different places
        assert not torch.allclose(obs["object"][0, :3], obs["object"][1, :3])
        for _ in range(5):
            result = env.step(np.random.uniform(-1, 1, (2, 7)))
        assert result.reward.shape == (2,) and result.reward.dtype == torch.float32
        assert result.success.dtype == torch.bool and not result.success.any()
        assert torch.all(result.reward == 0.0)  # sparse reward: nothing lifted by random motion
        # the arm moved: observations change under actions
        assert not torch.allclose(result.obs["robot0_eef_pos"], obs["robot0_eef_pos"])


def test_same_seed_same_start(lift_spec):
    with VecEnv(lift_spec, 1, workers="sync") as env:
        first = env.reset(seed=3)["object"].clone()
        env.step(np.ones((1, 7)))
        assert torch.allclose(env.reset(seed=3)["object"], first)
        assert not torch.allclose(env.reset(seed=4)["object"], first)


def test_autoreset_reports_final_obs(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=3)
    with VecEnv(spec, 2, workers="sync") as env:
        env.reset(seed=0)
        for t in range(3):
            result = env.step(np.zeros((2, 7)))
            assert bool(result.truncated.all()) == (t == 2)
        # after auto-reset obs is the new episode's first obs, next_obs the last obs of the old one
        assert not torch.allclose(result.obs["object"], result.next_obs["object"])
        assert not result.terminated.any()


def test_killed_worker_is_replaced(lift_spec):
    with VecEnv(lift_spec, 2, workers="subprocess", step_timeout=30) as env:
        env.reset(seed=0)
        old_pid = env.pids[0]
        os.kill(old_pid, signal.SIGKILL)
        result = env.step(np.zeros((2, 7)))
        assert result.truncated.tolist() == [True, False] and result.lost.tolist() == [True, False]
        assert env.num_restarts == 1 and env.pids[0] != old_pid
        result = env.step(np.zeros((2, 7)))  # the batch keeps going
        assert result.obs["object"].shape == (2, 10) and not result.truncated.any()


def test_an_inline_env_steps_as_its_worker_would(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=4)  # auto-resets within the run
    actions = np.random.default_rng(0).uniform(-1, 1, (6, 2, 7))
    runs = []
    for inline in (0, 1):
        with VecEnv(spec, 2, workers="subprocess", inline_envs=inline) as env:
            assert len(env.pids) == 2 - inline  # env 0 steps in this process
            steps = [env.reset(seed=5)["object"]]
            for a in actions:
                result = env.step(a)
                steps += [result.obs["object"], result.next_obs["object"], result.truncated]
            runs.append(steps)
    for with_workers, with_inline in zip(*runs):
        torch.testing.assert_close(with_inline, with_workers, rtol=0, atol=0)


def test_non_finite_actions_never_reach_the_simulator(lift_spec):
    with VecEnv(lift_spec, 1, workers="sync") as env:
        env.reset(seed=0)
        before = env.get("sim_state")[0]
        with pytest.raises(FloatingPointError, match=r"non-finite actions for envs \[0\]"):
            env.step(np.array([[0.1, np.nan, 0, 0, 0, 0, 0]]))
        np.testing.assert_array_equal(env.get("sim_state")[0], before)


def expert_successes(spec: EnvSpec, expert, rounds: int, seed: int) -> int:
    """Successful episodes of a scripted expert in `rounds` batches of 2 subprocess envs (seeds from `seed`)."""
    successes = 0
    with VecEnv(spec, 2, workers="subprocess") as env:
        for round_ in range(rounds):
            obs = env.reset(seed=seed + 2 * round_)
            expert.reset()
            done = np.zeros(2, bool)
            succeeded = np.zeros(2, bool)
            while not done.all():
                result = env.step(expert.act(obs), active=~done)
                obs = result.obs
                succeeded |= result.success.numpy() & ~done
                done |= result.done.numpy()
            successes += int(succeeded.sum())
    return successes


def test_scripted_lift_expert_succeeds(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=120)
    successes = expert_successes(spec, LiftExpert(2, noise=0.0, seed=0), rounds=5, seed=100)
    assert successes >= 8, f"scripted expert succeeded in {successes}/10 episodes"


def test_scripted_square_expert_puts_the_nut_on_its_peg(lift_spec):
    # The noise scripted demos are collected with (conf/collect_demos.yaml), the task's horizon (conf/task/square.yaml).
    spec = dataclasses.replace(lift_spec, env_name="NutAssemblySquare", horizon=400)
    successes = expert_successes(spec, SquareExpert(2, noise=0.1, seed=0), rounds=3, seed=100)
    assert successes >= 5, f"scripted square expert succeeded in {successes}/6 episodes"


@pytest.mark.slow
def test_libero_10_image_obs_language_and_init_states():
    spec = EnvSpec(
        suite="libero", env_name="libero_10", low_dim_keys=("joint_states", "gripper_states", "ee_states"),
        rgb_keys=("agentview_rgb", "eye_in_hand_rgb"), image_size=64, horizon=20, task_ids=tuple(range(10)),
    )
    with VecEnv(spec, 2, workers="subprocess") as env:
        options = [{"init_state_id": 3}, {"init_state_id": 3}]
        obs = env.reset(seed=0, options=options)
        assert obs["agentview_rgb"].shape == (2, 3, 64, 64) and obs["agentview_rgb"].dtype == torch.uint8
        assert obs["eye_in_hand_rgb"].shape == (2, 3, 64, 64)
        assert obs["joint_states"].shape == (2, 7) and obs["ee_states"].shape == (2, 6)
        assert obs["task_id"].tolist() == [0, 1]
        instructions = env.instructions
        assert instructions[0] != instructions[1] and "basket" in instructions[0]
        first = obs["agentview_rgb"].clone()
        env.step(np.random.uniform(-1, 1, (2, 7)))
        again = env.reset(seed=0, options=options)["agentview_rgb"]
        assert torch.equal(again, first), "same init state must reproduce the same first frame"
        other = env.reset(seed=0, options=[{"init_state_id": 7}, {"init_state_id": 7}])["agentview_rgb"]
        assert not torch.equal(other, first)


def test_worker_that_dies_while_starting_is_replaced_again(lift_spec, monkeypatch):
    from robo_rl.envs import vector

    real_init = vector._ProcessWorker.__init__
    deaths = iter([True, True])  # env 1's first two workers die before their env is built

    def dying_init(self, *args):
        real_init(self, *args)
        if next(deaths, False):
            self.process.kill()

    monkeypatch.setattr(vector._ProcessWorker, "__init__", dying_init)
    with VecEnv(lift_spec, 2, workers="subprocess", inline_envs=1) as env:
        assert env.num_restarts == 2
        env.reset(seed=0)
        assert not env.step(np.zeros((2, 7))).lost.any()
