"""Real faults, for real: SIGKILL a training run and resume it, leave a torn checkpoint save behind,
kill an env worker mid-episode in training and in evaluation, SIGTERM a run, fill the disk under a
checkpoint, start a second run on a held directory. Nothing made up may reach the buffer or the scores,
and a resumed run must continue as if nothing had happened."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from robo_rl.checkpoint import checkpoint_dir, load_buffer, load_checkpoint
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.rollout import evaluate_actors
from robo_rl.utils.shutdown import GracefulStop, StopRequested

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
            if torch.load(p, weights_only=True)["phase"] == "online"]


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


# -- stopping, full disks, two writers (a long disturbed run: benchmarks/chaos_soak.py) --------------------------
def test_sigterm_mid_online_checkpoints_and_resumes_to_the_same_transitions(tmp_path):
    args = [*SMOKE, f"demo_cache={tmp_path / 'demos'}", "budget.online_steps=200"]
    finish(start("train_qwm.py", tmp_path / "demos_first", *args, "budget.online_steps=2"))  # the demo cache, once
    whole = start("train_qwm.py", tmp_path / "whole", *args)  # the same seed, never stopped
    stopped_dir = tmp_path / "stopped"
    stopped = start("train_qwm.py", stopped_dir, *args)
    wait_for(lambda: checkpoint_dir(stopped_dir).exists() and len(online_checkpoints(stopped_dir)) >= 1)
    stopped.send_signal(signal.SIGTERM)  # to the trainer alone, as a scheduler's preemption notice reaches it
    out, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in err and "resume=true" in err
    state = load_checkpoint(stopped_dir)
    assert state["phase"] == "online" and 0 < state["env_steps"] < 200 and "continuation" in state
    finish(start("train_qwm.py", stopped_dir, *args, "resume=true"))
    finish(whole)
    a, b = (load_buffer(d, load_checkpoint(d)) for d in (tmp_path / "whole", stopped_dir))
    assert a.num_online == b.num_online == 200
    for name, array in a._online.arrays().items():  # every transition, in order, episode boundaries included
        np.testing.assert_array_equal(array, b._online.arrays()[name], err_msg=name)


def test_sigterm_during_an_evaluation_stops_it_at_once_with_a_checkpoint(tmp_path):
    # 2000 episodes per evaluation: the offline start's takes minutes, which the signal must not wait for
    run = start("train_qwm.py", tmp_path / "run", *SMOKE, f"demo_cache={tmp_path / 'demos'}", "budget.eval_episodes=2000")
    output = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: output[k].extend(iter(lambda: s.read(256), "")))
               for k, s in (("out", run.stdout), ("err", run.stderr))]
    for reader in readers:
        reader.start()
    wait_for(lambda: "eval:" in "".join(output["err"]))  # its progress bar: episodes are playing
    run.send_signal(signal.SIGTERM)
    run.wait(timeout=120)
    for reader in readers:
        reader.join()
    err = "".join(output["err"])
    assert run.returncode == 143, err[-3000:]
    assert "during the evaluation 'offline' (not scored)" in err and "resume=true" in err
    assert not (tmp_path / "run" / "offline_eval.json").exists()
    state = load_checkpoint(tmp_path / "run")  # pretraining is done and kept; no online step yet
    assert state["offline_step"] > 0 and state["env_steps"] == 0


def test_an_evaluation_stops_at_the_first_signal_and_leaves_the_stop_mode_it_found():
    with GracefulStop() as stop:
        with stop.at_once_within():
            assert stop.at_once
        assert not stop.at_once  # training goes on stopping at its step boundaries
        stop.stop_at_once()  # as run() does once training is checkpointed to its end
        with stop.at_once_within():
            pass
        assert stop.at_once  # the final evaluation did not undo it
    with GracefulStop() as stop, pytest.raises(StopRequested), stop.at_once_within():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises long before this ends


@pytest.mark.parametrize("failing", ["buffer", "checkpoint"])
def test_a_full_disk_leaves_the_previous_checkpoint_pair_loadable(tmp_path, monkeypatch, failing):
    import h5py

    import robo_rl.checkpoint
    from robo_rl.checkpoint import CheckpointWriteError, save_checkpoint
    from robo_rl.data.buffer import ReplayBuffer

    buffer = ReplayBuffer({"x": (3,)}, None, 2, capacity=50)
    for t in range(5):
        buffer.add({"x": torch.full((1, 3), float(t))}, torch.zeros(1, 2), torch.zeros(1), torch.zeros(1, dtype=bool),
                   torch.zeros(1, dtype=bool), {"x": torch.full((1, 3), t + 1.0)})
    state = {"agent": {}, "config": {}, "obs_shapes": {}, "num_tasks": 1, "offline_step": 0, "env_steps": 5,
             "phase": "online"}
    save_checkpoint(tmp_path, 5, state, buffer)
    buffer.add({"x": torch.full((1, 3), 6.0)}, torch.zeros(1, 2), torch.zeros(1), torch.zeros(1, dtype=bool),
               torch.zeros(1, dtype=bool), {"x": torch.full((1, 3), 7.0)})
    # The kernel's own ENOSPC, injected at the write call: the file written is /dev/full
    if failing == "buffer":
        real = h5py.File
        monkeypatch.setattr(h5py, "File", lambda path, mode: real("/dev/full" if mode == "w" else path, mode))
    else:
        real = torch.save
        monkeypatch.setattr(robo_rl.checkpoint.torch, "save", lambda obj, f: real(obj, open("/dev/full", "wb")))
    directory = checkpoint_dir(tmp_path)
    with pytest.raises(CheckpointWriteError, match="No space left on device") as error:
        save_checkpoint(tmp_path, 6, {**state, "env_steps": 6}, buffer)
    assert "step_00000005.pt is intact" in error.value.strerror
    assert sorted(p.name for p in directory.iterdir()) == ["buffer_00000005.h5", "step_00000005.pt"]  # no partials
    previous = load_checkpoint(tmp_path)
    assert previous["env_steps"] == 5 and load_buffer(tmp_path, previous).num_online == 5


def test_a_run_refuses_a_disk_without_room_for_its_checkpoints(tmp_path):
    from robo_rl.checkpoint import CheckpointWriteError, check_room_for_checkpoints

    check_room_for_checkpoints(tmp_path, 2**20)
    with pytest.raises(CheckpointWriteError, match="free on its disk"):
        check_room_for_checkpoints(tmp_path, 2**60)


def test_a_second_run_on_a_held_directory_is_refused(tmp_path, capsys):
    from robo_rl.utils.runlock import LOCK_FILE, hold_run_dir, release_run_dir

    run_dir = tmp_path / "run"
    hold_run_dir(run_dir)  # this process is the live run
    try:
        proc = start("train_qwm.py", run_dir, *SMOKE)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and f"held by a live run (pid {os.getpid()}" in err
    finally:
        release_run_dir(run_dir)
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / LOCK_FILE).write_text("pid 999999999 on elsewhere")  # its holder died without giving it back
    hold_run_dir(stale)
    release_run_dir(stale)
    assert "took over the lock of a run that is gone (pid 999999999 on elsewhere)" in capsys.readouterr().out


def test_the_soak_checks_catch_a_duplicated_transition(lift_spec):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from chaos_soak import episodes_crossing, repeated_transitions, transitions_vs_steps

    from robo_rl.data.buffer import ReplayBuffer
    from robo_rl.demos.experts import LiftExpert

    with VecEnv(dataclasses.replace(lift_spec, horizon=20), 1, workers="sync") as env:
        obs, expert = env.reset(seed=0), LiftExpert(1)
        buffer = ReplayBuffer({k: tuple(v.shape[1:]) for k, v in obs.items()}, None, 7, capacity=200)
        for _ in range(40):  # two episodes of 20 steps
            actions = expert.act(obs)
            result = env.step(actions)
            buffer.add(obs, actions, result.reward, result.terminated, result.truncated, result.next_obs, result.lost)
            obs = result.obs
    clean = {"env_steps": 40, "lost_steps": 0}
    assert transitions_vs_steps(buffer, clean)["ok"] and repeated_transitions(buffer) == 0
    assert episodes_crossing(buffer, [[21]]) == 0 and episodes_crossing(buffer, [[10]]) == 1  # inside episode 1
    # the same transition stored twice, as a replayed step after a restart would store it
    buffer.add(obs, actions, result.reward, result.terminated, result.truncated, obs)
    buffer.add(obs, actions, result.reward, torch.ones(1, dtype=bool), result.truncated, result.next_obs)
    assert not transitions_vs_steps(buffer, clean)["ok"] and repeated_transitions(buffer) == 1
