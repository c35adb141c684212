"""Real faults, for real: SIGKILL a training run and resume it, leave a torn checkpoint save behind,
kill an env worker mid-episode in training and in evaluation. Nothing made up may reach the buffer
or the scores, and a resumed run must continue as if nothing had happened."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from robo_rl.checkpoint import checkpoint_dir, load_buffer, load_checkpoint
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.rollout import evaluate_actors

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["task=lift", "budget=smoke", "logger.mode=disabled", "env.num_envs=2"]
MAX_EEF_STEP_M = 0.1  # OSC moves the end effector at most ~0.05 m per control step


def start(script: str, run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / script), f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: int = 900) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return out + err


def wait_for(condition, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out waiting for the run"
        time.sleep(0.2)


def online_checkpoints(run_dir: Path) -> list[Path]:
    return [p for p in sorted(checkpoint_dir(run_dir).glob("step_*.pt"))
            if torch.load(p, weights_only=False)["phase"] == "online"]


def env_workers(pid: int) -> list[psutil.Process]:
    """The spawned env worker processes of `pid` (not multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(pid).children(recursive=True)
            if "spawn_main" in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline())]


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_buffer_holds_real_episodes(run_dir: Path) -> None:
    """Every stored episode moves the end effector continuously, and no transition repeats its observation."""
    buffer = load_buffer(run_dir, load_checkpoint(run_dir))
    for episode in buffer.online_episodes():
        eef = episode.obs["robot0_eef_pos"]
        jumps = np.linalg.norm(np.diff(eef, axis=0), axis=1)
        assert jumps.max() < MAX_EEF_STEP_M, f"{episode.name}: the end effector jumps {jumps.max():.3f} m"
        state = np.concatenate([episode.obs[k] for k in ("object", "robot0_eef_pos", "robot0_gripper_qpos")], 1)
        assert (np.abs(np.diff(state, axis=0)).max(1) > 0).all(), f"{episode.name}: a transition with no change"


def test_kill_during_online_training_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMOKE, f"demo_cache={tmp_path / 'demos'}", "budget.online_steps=120"]
    proc = start("train_qwm.py", run_dir, *args)
    wait_for(lambda: checkpoint_dir(run_dir).exists() and len(online_checkpoints(run_dir)) >= 2)
    os.killpg(proc.pid, signal.SIGKILL)  # a crash mid-episode: no clean shutdown
    proc.wait()
    killed_at = load_checkpoint(run_dir)["env_steps"]
    assert 0 < killed_at < 120
    steps_before = [r["step"] for r in logged(run_dir)]

    out = finish(start("train_qwm.py", run_dir, *args, "resume=true"))
    assert "resuming from" in out
    result = json.loads((run_dir / "eval.json").read_text())
    state = load_checkpoint(run_dir)
    assert state["env_steps"] == 120 and result["num_online_transitions"] == 120
    assert_buffer_holds_real_episodes(run_dir)  # the interrupted episodes were not joined to new ones
    steps = [r["step"] for r in logged(run_dir)]
    assert steps == sorted(steps), "metrics.jsonl goes back in steps"
    assert len(steps_before) > 0 and max(steps) == 30 + 120  # one axis: offline steps, then env steps after them
    online = [r for r in logged(run_dir) if "online/critic_loss" in r]
    assert len({r["step"] for r in online}) == len(online), "an online step was logged twice"


def test_torn_save_between_buffer_and_checkpoint_resumes_from_the_previous_pair(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMOKE, f"demo_cache={tmp_path / 'demos'}", "budget.online_steps=80"]
    finish(start("train_qwm.py", run_dir, *args))
    newest = sorted(checkpoint_dir(run_dir).glob("step_*.pt"))[-1]
    assert (checkpoint_dir(run_dir) / newest.name.replace("step_", "buffer_").replace(".pt", ".h5")).exists()
    # What a kill after the buffer's write and before the checkpoint's rename leaves on disk:
    newest.rename(newest.with_suffix(".pt.tmp"))
    previous = load_checkpoint(run_dir)
    assert previous["env_steps"] == 60

    fresh = start("train_qwm.py", run_dir, *args)  # without resume=true: must not mix two runs in one directory
    out, err = fresh.communicate(timeout=300)
    assert fresh.returncode == 2 and "already holds a run" in err and "resume=true" in err

    finish(start("train_qwm.py", run_dir, *args, "resume=true"))
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["num_online_transitions"] == result["online_env_steps"] == 80
    assert load_buffer(run_dir, load_checkpoint(run_dir)).num_online == 80
    assert not list(checkpoint_dir(run_dir).glob("*.tmp*")), "the torn save was not cleaned up"


def test_dead_worker_in_training_stores_no_made_up_transition(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMOKE, f"demo_cache={tmp_path / 'demos'}", "budget.online_steps=300", "budget.log_every=2"]
    proc = start("train_qwm.py", run_dir, *args)
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and any("online/critic_loss" in r for r in logged(run_dir)))
    workers = env_workers(proc.pid)
    assert len(workers) == 1  # of 2 envs: env 0 steps in the main process (env.inline_envs=1)
    workers[0].kill()  # mid-episode: episodes are 50 steps, the online phase has begun
    out = finish(proc)
    assert "died; restarting it" in out
    assert max(r.get("rollout/worker_restarts", 0) for r in logged(run_dir)) >= 1
    buffer = load_buffer(run_dir, load_checkpoint(run_dir))
    assert buffer.num_online == 300 - 1  # every env step but the one the dead worker never took
    assert_buffer_holds_real_episodes(run_dir)


def test_dead_worker_in_evaluation_reruns_the_episode(tmp_path):
    proc = start("evaluate.py", tmp_path, "task=lift", "policy=scripted", "episodes=40", "videos=0",
                 "env.num_envs=2")
    wait_for(lambda: len(env_workers(proc.pid)) == 1, timeout=300)  # env 1's; env 0 steps inline
    time.sleep(2.0)  # building, resetting or stepping: a worker lost at any point is replaced
    env_workers(proc.pid)[0].kill()
    out = finish(proc)
    assert "restarting it" in out
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["worker_restarts"] >= 1 and result["num_episodes"] == 40
    assert result["success_rate"] == 1.0  # the scripted expert solves Lift: a lost episode is rerun, not failed


class KillsItsWorker:
    """Zero actions; kills env 0's worker at the 3rd step of the first `kills` episodes it starts."""

    def __init__(self, env: VecEnv, kills: int):
        self.env, self.kills, self.t = env, kills, 0

    def reset(self, env_ids: list[int]) -> None:
        self.t = 0

    def act(self, obs, env_ids: list[int]) -> np.ndarray:
        self.t += 1
        if self.t == 3 and self.kills:
            self.kills -= 1
            os.kill(self.env.pids[0], signal.SIGKILL)
        return np.zeros((len(env_ids), 7), np.float32)


def test_episode_whose_worker_dies_twice_is_recorded_as_failed_with_the_reason(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=8)
    with VecEnv(spec, 1, workers="subprocess", autoreset=False) as env:
        result = evaluate_actors(env, {"policy": KillsItsWorker(env, kills=2)}, episodes=2, progress=False)
    first, second = result["actors"]["policy"]["per_episode"]
    assert not first["success"] and "died twice in this episode" in first["failure"] and "died" in first["failure"]
    assert second["failure"] is None and second["length"] == 8  # the next episode runs as usual
    assert result["worker_restarts"] == 2 and result["actors"]["policy"]["failed_episodes"] == 1
