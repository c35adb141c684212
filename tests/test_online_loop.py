"""The online loop: one thread policy for every process, and env stepping overlapped with learning that stores
exactly what lockstep stores."""
import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from robo_rl.data.buffer import ReplayBuffer
from robo_rl.demos.experts import LiftExpert
from robo_rl.envs import env_spec, make_vec_env
from robo_rl.envs.vector import VecEnv
from robo_rl.utils import threads

ROOT = Path(__file__).resolve().parents[1]


def test_auto_threads_take_this_process_share_of_the_cores_and_one_without_the_short_spin(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 16)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    assert threads.resolve_threads("auto") == threads.MAX_AUTO_THREADS  # 16 cores: capped
    assert threads.resolve_threads("auto", processes=4) == 4  # torchrun's 4 ranks share the node
    assert threads.resolve_threads(3) == 3
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert threads.resolve_threads("auto") == 1  # threads that spin at length would starve other processes


def test_a_spawned_entry_point_sets_the_policy_itself(tmp_path):
    # The test process's own settings must not leak into the child: the script has to set them before torch loads.
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/evaluate.py"), "task=lift", "policy=random",
                           "episodes=1", "videos=0", "task.horizon=5", f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads((tmp_path / "eval.json").read_text())["threads"]
    cores = len(os.sched_getaffinity(0))
    assert recorded == {"torch_threads": min(cores, threads.MAX_AUTO_THREADS), "omp_spin": str(threads.SPIN_COUNT),
                        "omp_wait_policy": None, "cores": cores}
    assert f"GOMP_SPINCOUNT={threads.SPIN_COUNT}" in proc.stdout


class ScriptedActor:
    """The online loop's actor interface around the scripted Lift expert (deterministic without noise)."""

    param_noise_std = 0.0

    def __init__(self, num_envs: int):
        self.expert = LiftExpert(num_envs)

    def act(self, obs: dict) -> torch.Tensor:
        return torch.from_numpy(self.expert.act(obs))

    def reset(self, env_ids) -> None:
        self.expert.reset(np.asarray(list(env_ids), dtype=np.int64))

    def state_dict(self) -> dict:  # checkpoints hold the actor's per-env state (its phases here)
        return copy.deepcopy(vars(self.expert))

    def load_state_dict(self, state: dict) -> None:
        vars(self.expert).update(copy.deepcopy(state))


def online_transitions(tmp_path: Path, overlap: bool) -> tuple[list, dict]:
    """The online episodes a short smoke-budget loop stores when the expert acts, and the loop's last metrics."""
    from robo_rl.checkpoint import build_agent
    from robo_rl.train.curves import LearningCurve
    from robo_rl.train.online import OnlineTrainer
    from robo_rl.train.run import build_buffer
    from robo_rl.train.sources import offline_episodes
    from robo_rl.train.trainer import Progress
    from robo_rl.utils.logging import RunLogger

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[
            "budget=smoke", "task=lift", "logger.mode=disabled", "budget.online_steps=200", "budget.eval_episodes=1",
            "budget.checkpoint_every=1000", f"train.overlap={str(overlap).lower()}",
            f"demo_cache={tmp_path / 'demos'}"])
    run_dir = tmp_path / f"overlap_{overlap}"
    demos = offline_episodes(cfg, env_spec(cfg))
    env = make_vec_env(cfg)
    try:
        shapes = {k: s for k, s in demos.obs_shapes.items() if k != "task_id"} | {"task_id": ()}
        agent = build_agent(cfg.agent, shapes, 1)
        buffer = build_buffer(cfg, shapes, demos)
        agent.set_normalization(buffer.obs_stats())
        logger = RunLogger(run_dir, cfg, "test")
        trainer = OnlineTrainer(cfg, env, agent, buffer, logger, run_dir, Progress(),
                                LearningCurve(run_dir, no_search_actor="policy"))
        trainer.actor = ScriptedActor(env.num_envs)
        trainer.train()
        logger.close()
    finally:
        env.close()
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return buffer.online_episodes(), last


@pytest.mark.slow  # two short online loops with updates: ~60 s on 2 cores
def test_overlapped_loop_stores_what_lockstep_stores(tmp_path):
    lockstep, _ = online_transitions(tmp_path, overlap=False)
    overlapped, metrics = online_transitions(tmp_path, overlap=True)
    # 100 steps of each of 2 envs: the expert lifts in ~35, so each env ends two or more episodes
    assert len(lockstep) == len(overlapped) >= 4
    for a, b in zip(lockstep, overlapped):
        assert a.num_steps == b.num_steps and (a.terminals == b.terminals).all()
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
        for key in a.obs:
            np.testing.assert_array_equal(a.obs[key], b.obs[key])
    # the overlapped loop did learn while the envs stepped, and its split adds up
    split = {k: v for k, v in metrics.items() if k.startswith("rollout/seconds_")}
    assert set(split) == {f"rollout/seconds_{k}" for k in ("act", "env", "buffer", "update", "other")}
    assert split["rollout/seconds_update"] > 0 and "online/critic_loss" in metrics


def test_worker_killed_during_an_overlapped_step_is_replaced_and_nothing_made_up_is_stored(lift_spec):
    with VecEnv(lift_spec, 2, workers="subprocess", inline_envs=1, step_timeout=30) as env:
        obs = env.reset(seed=0)
        buffer = ReplayBuffer({k: tuple(v.shape[1:]) for k, v in obs.items() if k != "task_id"} | {"task_id": ()},
                              None, 7, capacity=100, num_envs=2)
        actions = np.zeros((2, 7))
        env.step_async(actions)
        old_pid = env.pids[0]  # env 1's worker (env 0 steps in this process)
        os.kill(old_pid, signal.SIGKILL)
        result = env.step_wait()
        assert result.lost.tolist() == [False, True] and result.truncated.tolist() == [False, True]
        assert env.num_restarts == 1 and env.pids[0] != old_pid
        buffer.add(obs, actions, result.reward, result.terminated, result.truncated, result.next_obs, result.lost)
        assert buffer.num_online == 1  # env 0's real step only
        env.step_async(actions)  # the replaced worker steps on in its new episode
        assert not env.step_wait().lost.any()
        with pytest.raises(RuntimeError, match="without step_async"):
            env.step_wait()


@pytest.mark.slow  # a smoke run and three small benchmarks: ~3 min on 2 cores
def test_gpu_check_runs_its_cpu_path_to_one_json(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "PY": sys.executable, "QWM_ENVS": "4", "WARP_WORLDS": "", "BATCHES": "32",
           "WHEELS": str(tmp_path / "no_wheels")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out/gpu_check.json").read_text())
    assert set(report["steps"]) == {"smoke", "qwm_search_4", "offline_updates_32"}
    assert all(s["status"] == 0 for s in report["steps"].values()), report["steps"]
    assert report["smoke"]["videos"] and 0.0 <= report["smoke"]["success_rate"] <= 1.0
    assert report["qwm_search_ms"]["4"] > 0 and report["qwm_speedup_vs_loop"]["4"] > 1
    assert report["offline_updates_per_s"]["32"] > 0
