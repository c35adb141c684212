"""scripts/evaluate.py end to end: eval.json and a playable mp4; paired episodes across actors."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import pytest
import yaml
from omegaconf import OmegaConf

from robo_rl.envs import env_spec
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.policies import RandomPolicy
from robo_rl.eval.rollout import evaluate_actors

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *overrides: str, timeout: int = 600) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *overrides],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_evaluate_scripted_lift_writes_json_and_video(tmp_path):
    run_script("evaluate.py", "task=lift", "policy=scripted", "episodes=3", "videos=1", f"hydra.run.dir={tmp_path}")
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["num_episodes"] == result["episodes"] == 3 and len(result["per_episode"]) == 3
    assert result["success_rate"] >= 2 / 3
    lo, hi = result["success_ci"]
    assert 0.0 <= lo <= result["success_rate"] <= hi <= 1.0 and hi - lo > 0.3  # 3 episodes: a wide interval
    assert [(p["task_id"], p["instruction"], p["episodes"]) for p in result["per_task"]] == [(0, "Lift", 3)]
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 1
    frames = [f for f in imageio.get_reader(videos[0], format="FFMPEG")]  # list() trips on len=inf
    assert videos[0].name.startswith("policy_episode000_task0_")
    assert len(frames) == result["per_episode"][0]["length"]
    assert frames[0].shape == (128, 256, 3)  # agentview | wrist side by side
    assert frames[0].std() > 10  # a rendered scene, not a blank frame


def test_random_policy_fails_lift(tmp_path):
    run_script("evaluate.py", "task=lift", "policy=random", "episodes=2", "videos=0", "task.horizon=30",
               f"hydra.run.dir={tmp_path}")
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["success_rate"] == 0.0 and result["mean_length"] == 30


def test_libero_10_config_means_the_ten_tasks():
    cfg = yaml.safe_load(run_script("evaluate.py", "--cfg", "job", "task=libero_10"))
    assert cfg["task"]["env_name"] == "libero_10" and cfg["task"]["task_ids"] == list(range(10))
    assert cfg["env"]["modality"] == "image"
    spec = env_spec(OmegaConf.create(cfg))  # what the envs run: task i of the suite for i < 10
    assert spec.task_ids == tuple(range(10)) and spec.num_tasks == 10


def test_actors_share_each_episodes_initial_state(lift_spec):
    spec = dataclasses.replace(lift_spec, horizon=8)
    actors = {"none": RandomPolicy(2, 7, seed=1), "other": RandomPolicy(2, 7, seed=2)}
    with VecEnv(spec, 2, workers="sync", autoreset=False) as env:
        result = evaluate_actors(env, actors, episodes=4, seed=5, progress=False)
    runs = {name: r["per_episode"] for name, r in result["actors"].items()}
    assert [e["index"] for e in runs["none"]] == [e["index"] for e in runs["other"]] == [0, 1, 2, 3]
    assert [e["seed"] for e in runs["none"]] == [e["seed"] for e in runs["other"]] == [5, 6, 7, 8]
    digests = [e["init_digest"] for e in runs["none"]]
    assert digests == [e["init_digest"] for e in runs["other"]]  # episode i starts from one state for both
    assert len(set(digests)) == 4  # and each episode from its own
    for r in result["actors"].values():
        assert r["episodes"] == 4 and r["mean_length"] == 8 and r["ms_per_decision"] > 0
        assert r["success_rate"] == 0.0 and r["success_ci"][0] == 0.0 < r["success_ci"][1]
    assert result["gains"]["other"] == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0, "episodes": 4}
    assert "search_gain" not in result  # no "qwm" actor


def test_unknown_compare_actor_and_a_guard_without_the_guard_are_refused():
    from robo_rl.config import ConfigError, validate
    from robo_rl.eval.runner import check_evaluation
    from robo_rl.schemas import EvaluateConfig
    from robo_rl.utils.schema import from_dict, to_plain
    from test_bad_inputs import compose_config

    with pytest.raises(ConfigError, match=r"compare\[1\]='beam'.*none, guard, best_of_n, qwm"):
        validate(compose_config("evaluate", ["compare=[none,beam]"]), "evaluate")
    node = to_plain(validate(compose_config("evaluate", ["planner=qwm", "planner.drift_decay=null"]), "evaluate"))
    unguarded = from_dict(EvaluateConfig, {**node, "checkpoint": "run", "compare": ["none", "guard"]})
    with pytest.raises(ConfigError, match="guard.*planner.drift_decay=null"):
        check_evaluation(unguarded, None, [])