"""env.backend=ray: real robosuite Lift envs in Ray actors on a local Ray cluster, against the subprocess backend."""
import dataclasses
import json
import time

import numpy as np
import psutil
import pytest
import ray
import torch

from robo_rl.demos.experts import LiftExpert
from robo_rl.envs.ray_runners import RayVecEnv
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.journal import EpisodeJournal
from robo_rl.eval.rollout import evaluate


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield
    if ray.is_initialized():
        ray.shutdown()


def kill_runner(env: RayVecEnv, r: int) -> None:
    """Kill runner r as a crash would (Ray restarts it) and wait until its process is gone: ray.kill only
    asks, and a call that reaches the old actor first would succeed and make the test depend on timing."""
    pid = env.pids[r]
    ray.kill(env.workers[r], no_restart=False)
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, f"runner {r} (pid {pid}) still alive 30 s after ray.kill"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


def test_killed_runner_is_restarted_and_all_its_episodes_come_back_truncated_and_lost(lift_spec):
    with RayVecEnv(lift_spec, 3, num_runners=2, step_timeout=60) as env, \
            VecEnv(lift_spec, 1, workers="sync") as reference:
        assert env.env_ids == [[0, 2], [1]]
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros((3, 7)))
        old_pid, other_pid = env.pids
        kill_runner(env, 0)  # as a crash would: Ray restarts the actor
        # env 2 is not stepped in this call (as an evaluation's idle env), but lives in runner 0 too
        result = env.step(np.zeros((3, 7)), active=np.array([True, True, False]))
        assert result.truncated.tolist() == [True, False, True] and result.lost.tolist() == [True, False, True]
        assert env.num_restarts == 1 and env.pids[0] != old_pid and env.pids[1] == other_pid
        assert "runner 0" in env.lost_reasons[0] and "runner 0" in env.lost_reasons[2]
        # both of runner 0's envs began new episodes from their seed streams (seed i + num_envs)
        for i in (0, 2):
            torch.testing.assert_close(result.obs["object"][i], reference.reset(seed=i + 3)["object"][0],
                                       rtol=0, atol=0)
        for _ in range(3):  # and stepping goes on in both runners
            result = env.step(np.zeros((3, 7)))
        assert not result.lost.any() and env.num_restarts == 1
        # a runner lost outside a step (here in `get`): the next step reports its episode, without stepping it
        kill_runner(env, 1)
        env.get("instruction")
        result = env.step(np.ones((3, 7)))
        assert result.lost.tolist() == [False, True, False] and env.num_restarts == 2
        torch.testing.assert_close(result.obs["object"][1], reference.reset(seed=1 + 3)["object"][0], rtol=0, atol=0)
        # lost while another env of the runner is reset (an evaluation handing env 0 its next job): env 0 starts
        # the episode asked for, env 2's episode is lost
        kill_runner(env, 0)
        obs = env.reset_envs([0], seed=[100])
        torch.testing.assert_close(obs["object"][0], reference.reset(seed=100)["object"][0], rtol=0, atol=0)
        assert env.step(np.zeros((3, 7))).lost.tolist() == [False, False, True] and env.num_restarts == 3
        assert not env.step(np.zeros((3, 7))).lost.any()


def test_evaluation_on_ray_runners_plays_the_subprocess_backends_episodes(lift_spec, tmp_path):
    # 5 episodes over 3 envs (2 runners): envs free up at different steps (the noisy expert succeeds after
    # 36-53 steps, or not within 45), so the jobs handed to freed envs and their seeds are compared too
    spec = dataclasses.replace(lift_spec, horizon=45)
    results = {}
    for name, make in (("subprocess", lambda: VecEnv(spec, 3, workers="subprocess", autoreset=False)),
                       ("ray", lambda: RayVecEnv(spec, 3, num_runners=2, autoreset=False))):
        with make() as env:
            journal = EpisodeJournal(tmp_path / f"{name}_episodes.jsonl", {"task": "lift"})
            results[name] = evaluate(env, LiftExpert(3, noise=0.15, seed=0), episodes=5, seed=10, progress=False,
                                     journal=journal)
        lines = (tmp_path / f"{name}_episodes.jsonl").read_text().splitlines()[1:]
        assert sorted(json.loads(line)["index"] for line in lines) == [0, 1, 2, 3, 4]  # each written as it ended
    fields = ("index", "seed", "init_digest", "success", "length", "return")
    expected, got = ([tuple(e[f] for f in fields) for e in results[b]["per_episode"]] for b in ("subprocess", "ray"))
    assert got == expected
    assert 0 < sum(e[3] for e in got) < 5 and len({e[2] for e in got}) == 5  # mixed outcomes, distinct starts
    assert results["ray"]["worker_restarts"] == 0
