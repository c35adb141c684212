"""LIBERO's evaluation protocol on real LIBERO envs: episode j of a task from its init state j after the
settling steps, the per-task table, one video per task, and an evaluation that survives SIGKILL."""
import json
import os
import signal

import numpy as np
import pytest

from robo_rl.envs.libero import NOOP_ACTION, SETTLE_STEPS
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.rollout import evaluate_actors
from test_faults import finish, start, wait_for

PROPRIO = ("joint_states", "gripper_states", "ee_states")


class StartStates:
    """Random actions; keeps the MuJoCo state each episode's first action is asked in (one env)."""

    def __init__(self, env: VecEnv):
        self.env, self.starts, self.fresh = env, [], False

    def reset(self, env_ids: list[int]) -> None:
        self.fresh = True

    def act(self, obs, env_ids: list[int]) -> np.ndarray:
        if self.fresh:
            self.starts.append(self.env.get("sim_state")[0])
            self.fresh = False
        return np.random.default_rng(len(self.starts)).uniform(-1, 1, (len(env_ids), 7))


@pytest.mark.slow
def test_episode_j_of_a_task_starts_from_its_init_state_j():
    spec = EnvSpec(suite="libero", env_name="libero_10", low_dim_keys=PROPRIO, horizon=5, task_ids=(0,))
    with VecEnv(spec, 1, workers="sync", autoreset=False) as env:
        policy = StartStates(env)
        result = evaluate_actors(env, {"policy": policy}, episodes=3, progress=False)["actors"]["policy"]
        assert [(e["init_state_id"], e["length"]) for e in result["per_episode"]] == [(0, 5), (1, 5), (2, 5)]
        # The published procedure (openpi examples/libero/main.py), by hand on the same env: reset, set init
        # state j, 10 no-op steps with the gripper open; the policy's first step comes after them.
        libero = env.workers[0].runner.env
        expected = []
        for j in range(3):
            libero.env.reset()
            libero.env.set_init_state(libero.init_states[j])
            for _ in range(SETTLE_STEPS):
                libero.env.step(NOOP_ACTION)
            expected.append(libero.sim_state())
    distance = np.array([[np.abs(a - b).max() for b in expected] for a in policy.starts])
    assert np.all(np.diag(distance) == 0.0), distance  # episode j began exactly there
    assert np.all(distance[~np.eye(3, dtype=bool)] > 0.01)  # and the init states are told apart
    assert np.allclose([s[0] for s in policy.starts], SETTLE_STEPS * 0.05)  # sim time: 10 control steps of 50 ms


def journal_records(run_dir) -> list[dict]:
    """The complete episode records of run_dir/episodes.jsonl (a half-written last line is not one)."""
    records = []
    for line in (run_dir / "episodes.jsonl").read_text().splitlines()[1:]:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


@pytest.mark.slow
def test_killed_evaluation_resumes_without_repeating_finished_episodes(tmp_path):
    run_dir = tmp_path / "eval"
    args = ["task=libero_10", "task.task_ids=[0,1]", "env=state", "policy=random", "episodes_per_task=8",
            "task.horizon=10", "videos=1", "wrist_video=false"]
    proc = start("evaluate.py", run_dir, *args)
    wait_for(lambda: (run_dir / "episodes.jsonl").exists() and len(journal_records(run_dir)) >= 2, timeout=300)
    os.killpg(proc.pid, signal.SIGKILL)  # no clean shutdown: whatever is running is lost
    proc.wait()
    before = journal_records(run_dir)
    assert 2 <= len(before) < 16, "the kill came too late to test a resume"

    out = finish(start("evaluate.py", run_dir, *args))
    assert f"{len(before)} of 16 episodes already in" in out
    records = journal_records(run_dir)
    keys = [(r["task_id"], r["init_state_id"], r["seed"]) for r in records]
    assert len(keys) == len(set(keys)) == 16  # each episode played and recorded once
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["episodes_per_task"] == 8 and result["num_episodes"] == 16
    assert all(r in result["per_episode"] for r in before)  # the first run's episodes, as they were
    assert sorted((e["task_id"], e["init_state_id"]) for e in result["per_episode"]) == [
        (t, j) for t in (0, 1) for j in range(8)]
    assert all(e["length"] == 10 and not e["success"] for e in result["per_episode"])  # random: step limit
    per_task = result["per_task"]
    assert [(p["task_id"], p["episodes"], p["success_rate"]) for p in per_task] == [(0, 8, 0.0), (1, 8, 0.0)]
    assert "basket" in per_task[0]["instruction"] and per_task[0]["instruction"] in out  # the printed table
    assert sorted(p.name.split("_fail")[0] for p in (run_dir / "videos").glob("*.mp4")) == [
        "policy_episode000_task0", "policy_episode008_task1"]  # one video per task
