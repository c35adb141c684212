"""scripts/train_qwm.py end to end on tiny budgets: checkpoints, eval.json, videos, resume."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from robo_rl.checkpoint import load_buffer, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["budget=smoke", "logger.mode=disabled", "env.num_envs=2"]


def train(run_dir: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_qwm.py"), *SMOKE, f"hydra.run.dir={run_dir}",
         f"demo_cache={run_dir.parent / 'demos'}", *overrides],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, f"train_qwm.py failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def lift_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("train") / "lift"
    # planner.support: a search setting of its own, which evaluating its checkpoint must keep
    train(run_dir, "task=lift", "budget.offline_eval_every=15", "budget.eval_every=40", "planner.support=0.75",
          "resume=auto")  # nothing to resume: starts fresh
    return run_dir


def test_lift_smoke_run_produces_checkpoint_eval_and_video(lift_run):
    run_dir = lift_run
    result = json.loads((run_dir / "eval.json").read_text())
    # One pass of paired episodes with search (top level) and without, budget.eval_episodes (2) of each.
    assert set(result["actors"]) == {"qwm", "none"} and result["episodes"] == result["search_gain"]["episodes"] == 2
    assert result["actors"]["qwm"]["success_rate"] == result["success_rate"]
    assert result["actors"]["none"]["success_rate"] == result["success_rate_no_search"]
    for rate, (lo, hi), name in ((result["success_rate"], result["success_ci"], "qwm"),
                                 (result["success_rate_no_search"], result["success_ci_no_search"], "none")):
        episodes = result["actors"][name]["per_episode"]
        assert len(episodes) == 2 and rate == sum(e["success"] for e in episodes) / 2  # the rate of these episodes
        assert lo <= rate <= hi
    # The offline start: the policy alone right after pretraining, on its own 2 episodes.
    offline = json.loads((run_dir / "offline_eval.json").read_text())
    assert offline["episodes"] == 2 and result["offline_success_rate"] == offline["success_rate"] == (
        sum(e["success"] for e in offline["per_episode"]) / 2)
    gain = result["search_gain"]
    assert gain["mean"] == pytest.approx(result["success_rate"] - result["success_rate_no_search"])
    assert gain["ci_low"] <= gain["mean"] <= gain["ci_high"]
    assert sorted((run_dir / "checkpoints").glob("step_*.pt")), "no checkpoint written"
    assert list((run_dir / "videos").rglob("*.mp4")), "no evaluation video"
    # Only real transitions are learned from: the online buffer holds exactly the env steps taken.
    buffer = load_buffer(run_dir, load_checkpoint(run_dir))
    assert buffer.num_online == result["online_env_steps"] == 60
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("online/critic_loss" in l for l in lines) and any("offline/fm_loss" in l for l in lines)
    steps = [l["step"] for l in lines]
    assert steps == sorted(steps) and max(steps) == 30 + 60  # one axis: offline steps, then env steps after them
    curves = json.loads((run_dir / "curves.json").read_text())
    offline_curve = {k: curves.pop(k) for k in ("offline_steps", "offline_success")}
    # budget.eval_every=40 of 60 env steps: a point at 40, then the final evaluation's at 60
    assert curves["env_steps"] == [40, 60] and curves["offline_success_rate"] == result["offline_success_rate"]
    assert curves["success"][-1] == result["success_rate"]
    assert curves["success_no_search"][-1] == result["success_rate_no_search"]
    # budget.offline_eval_every=15 of 30 offline steps: the policy alone at 15 and 30, 2 episodes each
    assert offline_curve["offline_steps"] == [15, 30]
    assert all(rate in (0.0, 0.5, 1.0) for rate in offline_curve["offline_success"])
    assert offline_curve["offline_success"][-1] == result["offline_success_rate"]  # the last point is the offline start
    logged = [(l["step"], l["eval/offline_curve_success_rate"]) for l in lines if "eval/offline_curve_success_rate" in l]
    assert logged == list(zip([15, 30], offline_curve["offline_success"]))
    assert (run_dir / "curves.png").exists()
    # the run directory's log holds what the run printed, results included, progress bars as lines
    log = (run_dir / "train_qwm.log").read_text()
    assert "[eval] final qwm: success" in log and "[run] lift: success" in log and "\r" not in log


def test_checkpoint_rebuilds_the_trained_agent(lift_run):
    from omegaconf import OmegaConf

    from robo_rl.checkpoint import actor_from_checkpoint

    state = load_checkpoint(lift_run)
    cfg = OmegaConf.create(state["config"])
    actor = actor_from_checkpoint(state, cfg)
    rebuilt = actor.agent.state_dict()
    assert rebuilt.keys() == state["agent"].keys()
    assert all(torch.equal(rebuilt[k], state["agent"][k]) for k in rebuilt)
    assert actor.planner is not None  # trained with planner=qwm: the actor searches
    # ... discounting as the critic learned to (train.gamma) and sampling the policy as trained
    assert actor.planner.gamma == state["config"]["train"]["gamma"]
    assert actor.agent.policy.sample_steps == state["config"]["agent"]["sample_steps"]


def test_checkpoint_holds_the_keys_its_docstring_names(lift_run):
    import re

    import robo_rl.checkpoint

    named = re.search(r"\{(\"agent\".*?)\}", robo_rl.checkpoint.__doc__, re.S).group(1)
    documented = set(re.findall(r'"(\w+)"', named))
    state = load_checkpoint(lift_run)  # the last one is online: it also names its buffer
    assert set(state) == documented | {"buffer"} and set(state["buffer"]) == {"file", "write_counts"}


def test_checkpoints_open_safely_and_older_ones_upgrade(lift_run, tmp_path):
    import numpy as np

    from robo_rl.checkpoint import read_checkpoint
    from robo_rl.utils.schema import ConfigError

    newest = sorted((lift_run / "checkpoints").glob("step_*.pt"))[-1]
    torch.load(newest, weights_only=True)  # tensors and plain values only: opening it runs no code
    state = load_checkpoint(newest)
    assert isinstance(state["rng"]["numpy"][1], np.ndarray)  # numpy state comes back as numpy
    old = tmp_path / "old.pt"
    torch.save(state, old)  # the format before: numpy pickled
    with pytest.raises(ConfigError, match="upgrade_checkpoint.py"):
        read_checkpoint(old)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "upgrade_checkpoint.py"), str(old)], check=True)
    upgraded = read_checkpoint(old)
    np.testing.assert_array_equal(upgraded["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert all(torch.equal(upgraded["agent"][k], v) for k, v in state["agent"].items())


def test_curve_points_keep_their_agent_for_paired_comparisons_along_the_run(lift_run, tmp_path):
    import re

    import robo_rl.checkpoint

    # the offline curve's points (15, 30 offline steps; 30 is the offline start), then 30 offline + 40, + 60 env steps
    kept = sorted((lift_run / "checkpoints" / "curve").glob("step_*.pt"))
    assert [p.name for p in kept] == ["step_00000015.pt", "step_00000030.pt", "step_00000070.pt", "step_00000090.pt"]
    snapshots = [torch.load(p, weights_only=True) for p in kept]
    documented = set(re.findall(r'"(\w+)"', re.findall(r"\{(\"agent\".*?)\}", robo_rl.checkpoint.__doc__, re.S)[1]))
    assert all(set(s) == documented for s in snapshots) and "optimizer" not in documented
    assert [(s["offline_step"], s["env_steps"]) for s in snapshots] == [(15, 0), (30, 0), (30, 40), (30, 60)]
    final = load_checkpoint(lift_run)["agent"]  # the last point evaluated the final agent
    assert all(torch.equal(snapshots[-1]["agent"][k], final[k]) for k in final)
    kept = kept[2:]

    def compare(checkpoint: Path, out: str, seed: int) -> None:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"checkpoint={checkpoint}",
                        "compare=[none,qwm]", "episodes=2", "videos=0", "task.horizon=30", f"seed={seed}",
                        f"hydra.run.dir={tmp_path / out}"], check=True, capture_output=True, timeout=600, cwd=ROOT)

    compare(kept[0], "at40", 0)
    compare(kept[1], "at60", 0)
    compare(kept[1], "at60_more", 2)  # episodes 2 and 3 of the same checkpoint: pooled with the ones above
    evals = [json.loads((tmp_path / d / "eval.json").read_text()) for d in ("at40", "at60", "at60_more")]
    assert [(e["env_steps"], e["offline_step"]) for e in evals] == [(40, 30), (60, 30), (60, 30)]

    def plot(*dirs: str) -> subprocess.CompletedProcess:
        evals = ",".join(str(tmp_path / d) for d in dirs)
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_evals.py"), f"evals=[{evals}]",
                               f"output={tmp_path / 'gain.png'}"], capture_output=True, text=True, timeout=300, cwd=ROOT)

    assert plot("at60", "at40", "at60_more").returncode == 0
    series = json.loads((tmp_path / "gain.json").read_text())
    assert series["env_steps"] == [40, 60] and series["episodes"] == [2, 4]
    success = {n: [[float(e["success"]) for ev in group for e in ev["actors"][n]["per_episode"]]
                   for group in ([evals[0]], evals[1:])] for n in ("none", "qwm")}
    assert series["actors"]["qwm"]["success"] == [sum(s) / len(s) for s in success["qwm"]]
    assert series["gains"]["qwm"]["mean"] == pytest.approx(
        [(sum(q) - sum(n)) / len(q) for q, n in zip(success["qwm"], success["none"])])
    assert (tmp_path / "gain.png").stat().st_size > 1000
    twice = plot("at60", "at60")  # the same episodes twice would count twice
    assert twice.returncode == 2 and "seed=" in twice.stderr


def test_evaluate_checkpoint_with_and_without_search(lift_run, tmp_path):
    trained = json.loads((lift_run / "eval.json").read_text())["actors"]["none"]["per_episode"]
    for planner in ("none", "qwm"):
        out_dir = tmp_path / planner
        subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"checkpoint={lift_run}",
                        f"planner={planner}", "episodes=2", "videos=0", "agent.sample_steps=2", "agent.best_of_n=4",
                        f"hydra.run.dir={out_dir}"], check=True, capture_output=True, timeout=600, cwd=ROOT)
        result = json.loads((out_dir / "eval.json").read_text())
        assert result["planner"] == planner and result["num_episodes"] == 2
        assert result["acting"]["sources"] == {"agent.sample_steps": "command line", "agent.best_of_n": "command line",
                                               "agent.execute_steps": "checkpoint", "planner": "command line (planner=)"}
        assert result["policy"] == str(lift_run)
        # One seed convention: evaluate.py (seed=0) plays the episodes of the final evaluation of the run
        # it evaluates (trained with seed=0).
        assert [(e["seed"], e["init_digest"]) for e in result["per_episode"]] == [
            (e["seed"], e["init_digest"]) for e in trained]


def test_evaluate_compares_actors_on_paired_episodes(lift_run, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"checkpoint={lift_run}",
                           "compare=[none,guard,best_of_n,qwm]", "episodes=4", "videos=0", "task.horizon=30",
                           "planner.num_actions=4", f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gain vs none [CI]" in proc.stdout and "best_of_n" in proc.stdout  # the table
    result = json.loads((tmp_path / "eval.json").read_text())
    assert list(result["actors"]) == ["none", "guard", "best_of_n", "qwm"]
    assert result["episodes"] == 4 and result["checkpoint"] == str(lift_run) and result["task"] == "lift"
    for r in result["actors"].values():
        lo, hi = r["success_ci"]
        assert r["episodes"] == 4 and 0.0 <= lo <= r["success_rate"] <= hi <= 1.0 and r["ms_per_decision"] > 0
        assert r["mean_length"] <= 30
    assert result["search_gain"]["episodes"] == 4 and set(result["gains"]) == {"guard", "best_of_n", "qwm"}
    # the search as the run trained with it, said and recorded, with the command line's planner.* on top
    assert result["acting"]["planner"]["support"] == 0.75 and result["acting"]["planner"]["num_actions"] == 4
    assert result["acting"]["sources"]["planner"] == "checkpoint, num_actions from the command line"
    assert "num_actions=4, depth=2, drift_decay=0.9, support=0.75 (checkpoint, num_actions from the command line)" \
        in proc.stdout
    digests = {name: [e["init_digest"] for e in r["per_episode"]] for name, r in result["actors"].items()}
    assert digests["none"] == digests["guard"] == digests["best_of_n"] == digests["qwm"]
    assert len(set(digests["none"])) == 4


def test_action_chunks_train_and_act_end_to_end(tmp_path):
    run_dir = tmp_path / "chunks"
    train(run_dir, "task=lift", "agent.action_horizon=2", "train.nstep=1", "budget.eval_episodes=1")
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["num_episodes"] == 1 and "success_rate_no_search" in result
    buffer = load_buffer(run_dir, load_checkpoint(run_dir))
    assert buffer.num_online == result["online_env_steps"]  # chunks still enter the buffer one step at a time
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("online/wm_consistency" in l for l in lines)
    for execute_steps, returncode in ((1, 0), (3, 2)):  # receding horizon on the checkpoint; 3 > its chunk of 2
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"checkpoint={run_dir}",
                               "episodes=1", "videos=0", "task.horizon=20", f"agent.execute_steps={execute_steps}",
                               f"hydra.run.dir={tmp_path / f'execute{execute_steps}'}"],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == returncode, proc.stderr[-3000:]
    # the evaluation acted with K = 1, not the trained default: its episode journal records the setting
    journal = (tmp_path / "execute1" / "episodes.jsonl").read_text().splitlines()
    assert json.loads(journal[0])["settings"]["acting"]["execute_steps"] == 1
    assert "agent.execute_steps=3: a chunk holds agent.action_horizon=2" in proc.stderr
    # the simulator oracle measures a chunk checkpoint too: its world model and critic step a chunk at a time
    oracle = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_oracle.py"), "--checkpoint", str(run_dir),
                             "--json", str(tmp_path / "oracle.json"), "--states", "2", "--rollouts", "1", "--envs", "1"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert oracle.returncode == 0, oracle.stderr[-3000:]
    report = json.loads((tmp_path / "oracle.json").read_text())
    assert len(report["latent_error"]) >= 1 and report["q_calibration"]["states"] == 2


def test_online_episodes_start_at_demo_states_when_asked(tmp_path):
    run_dir = tmp_path / "demo_resets"
    # 10-step episodes: 60 env steps over 2 envs end 6 episodes, each begun at a scripted demo's state
    train(run_dir, "task=lift", "train.demo_resets=1.0", "planner=none", "task.horizon=10", "budget.eval_episodes=1")
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [l for l in lines if "rollout/steps_per_s" in l][-1]
    assert last["rollout/demo_start_episodes"] == 6 and "rollout/episodes" not in last  # none from the env's reset
    assert len(load_buffer(run_dir, load_checkpoint(run_dir)).online_episodes()) == 6  # real steps, stored as usual


def test_resume_after_kill_continues_from_last_checkpoint(tmp_path):
    run_dir = tmp_path / "resume"
    overrides = ["task=lift", "budget.offline_steps=400", "budget.checkpoint_every=50", "budget.online_steps=40"]
    cmd = [sys.executable, str(ROOT / "scripts" / "train_qwm.py"), *SMOKE, f"hydra.run.dir={run_dir}",
           f"demo_cache={tmp_path / 'demos'}", *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt_dir = run_dir / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and not (ckpt_dir.exists() and any(p.name >= "step_00000100.pt" for p in ckpt_dir.glob("step_*.pt"))):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # a crash: no clean shutdown
    proc.wait()
    saved = sorted(ckpt_dir.glob("step_*.pt"))
    assert saved, "no checkpoint before the kill"
    killed_at = torch.load(saved[-1], weights_only=True)["offline_step"]
    assert 100 <= killed_at < 400
    out = train(run_dir, *overrides, "resume=auto").stdout  # auto: resumes the run that is there
    assert f"resuming from {saved[-1]}" in out
    # the resumed run did not redo the checkpointed steps: each of them was logged once, by the first run
    steps = [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "offline/fm_loss" in l]
    before = [s for s in steps if s <= killed_at]
    assert before and len(before) == len(set(before))
    assert max(steps) == 400
    final = torch.load(sorted(ckpt_dir.glob("step_*.pt"))[-1], weights_only=True)
    assert final["offline_step"] == 400 and final["env_steps"] == 40


@pytest.mark.slow
def test_libero_10_smoke_run_from_scratch(tmp_path):
    run_dir = tmp_path / "libero"
    # task.expert=null: no scripted demos (tests/test_libero_10.py covers them); chunks of 5: with no demos
    # the first updates must wait for an episode with 5 steps
    out = train(run_dir, "task=libero_10", "task.expert=null", "task.task_ids=[0,1]", "task.horizon=15",
                "env.image_size=64",
                "budget.online_steps=40", "budget.batch_size=16", "agent.action_horizon=5", "train.nstep=1").stdout
    assert "starting online from scratch" in out
    result = json.loads((run_dir / "eval.json").read_text())
    assert [p["task_id"] for p in result["per_task"]] == [0, 1]
    assert "basket" in result["per_task"][0]["instruction"]
    assert list((run_dir / "videos").rglob("*.mp4"))
    assert (run_dir / "instruction_embeddings.json").exists()  # conditioned on language, embedded once
    assert sorted((run_dir / "checkpoints").glob("step_*.pt"))


def write_libero_demo_file(path: Path, obs: list[dict], actions: list, instruction: str) -> None:
    """Real LIBERO observations saved the way LIBERO's create_dataset.py lays files out: 128 px images
    stored upside down, no next_obs, the instruction in `problem_info`."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": instruction})
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "libero", "env_kwargs": {}})
        demo = data.create_group("demo_0")
        for key in ("agentview_rgb", "eye_in_hand_rgb"):
            upright = np.stack([o[key] for o in obs]).transpose(0, 2, 3, 1)  # [T, H, W, C]
            demo.create_dataset(f"obs/{key}", data=upright[:, ::-1])
        for key in ("joint_states", "gripper_states", "ee_states"):
            demo.create_dataset(f"obs/{key}", data=np.stack([o[key] for o in obs]).astype(np.float64))
        demo.create_dataset("actions", data=np.asarray(actions))
        rewards = np.zeros(len(actions))
        rewards[-1] = 1
        demo.create_dataset("rewards", data=rewards)
        demo.create_dataset("dones", data=rewards.astype(np.uint8))
        demo.attrs["num_samples"] = len(actions)


@pytest.mark.slow
def test_libero_10_pretrains_on_libero_files(tmp_path):
    import numpy as np

    from robo_rl.envs.spec import EnvSpec
    from robo_rl.envs.vector import VecEnv

    spec = EnvSpec(suite="libero", env_name="libero_10", low_dim_keys=("joint_states", "gripper_states", "ee_states"),
                   rgb_keys=("agentview_rgb", "eye_in_hand_rgb"), image_size=128, horizon=100,
                   task_ids=(0, 1))
    data_dir = tmp_path / "libero_data"
    data_dir.mkdir()
    with VecEnv(spec, 2, workers="subprocess") as env:
        obs, instructions = env.reset(seed=0), env.instructions
        trace, actions = [obs], []
        for _ in range(12):
            actions.append(np.random.default_rng(len(actions)).uniform(-0.3, 0.3, (2, 7)))
            trace.append(env.step(actions[-1]).obs)
    for i in range(2):  # one file per task, named as LIBERO names them
        write_libero_demo_file(data_dir / f"task{i}_demo.hdf5", [{k: v[i].numpy() for k, v in o.items()} for o in trace[:-1]],
                               [a[i] for a in actions], instructions[i])
    run_dir = tmp_path / "run"
    out = train(run_dir, "task=libero_10", "task.task_ids=[0,1]", "task.horizon=15", "env.image_size=64",
                f"dataset={data_dir}", "budget.online_steps=20", "budget.batch_size=16").stdout
    assert "[data] 2 demos (24 steps)" in out
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if "offline/fm_loss" in l] == [10, 20, 30], "no offline pretraining on the files"
    state = load_checkpoint(run_dir)
    assert state["offline_step"] == 30 and load_buffer(run_dir, state).num_offline == 24  # both files' steps
    # The offline start was evaluated (the pretrained policy alone, one episode per task) and reported.
    offline = json.loads((run_dir / "offline_eval.json").read_text())
    assert [p["task_id"] for p in offline["per_task"]] == [0, 1] and offline["episodes"] == 2
    assert json.loads((run_dir / "eval.json").read_text())["offline_success_rate"] == offline["success_rate"]
