"""scripts/train_qwm.py scaled out, end to end on tiny budgets: envs in Ray runners, and two torchrun ranks."""
import json
import subprocess
import sys

import pytest
from test_train import ROOT, SMOKE, train

from robo_rl.checkpoint import load_buffer, load_checkpoint

# The smoke budget shortened (one evaluation episode, no search, 20 env steps): each run takes ~1.5 min here.
SHORT = ["task=lift", "planner=none", "budget.eval_episodes=1", "budget.online_steps=20"]


@pytest.mark.slow
def test_train_qwm_on_ray_env_runners(tmp_path):
    run_dir = tmp_path / "ray"
    train(run_dir, *SHORT, "env.backend=ray")
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["episodes"] == 1 and result["worker_restarts"] == 0
    buffer = load_buffer(run_dir, load_checkpoint(run_dir))
    assert buffer.num_online == result["online_env_steps"] == 20  # every step the Ray runners took, stored


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_train_one_agent(tmp_path):
    run_dir = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "scripts" / "train_qwm.py"), *SMOKE, *SHORT, f"hydra.run.dir={run_dir}",
         f"demo_cache={tmp_path / 'demos'}"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    # rank 0 wrote the run's files; rank 1 only its own metrics
    assert json.loads((run_dir / "eval.json").read_text())["online_env_steps"] == 20
    assert sorted((run_dir / "checkpoints").glob("step_*.pt"))
    assert not (run_dir / "rank1" / "checkpoints").exists() and not (run_dir / "rank1" / "eval.json").exists()

    def online(path):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["step"]: r for r in records if "online/critic_loss" in r}

    ranks = online(run_dir / "metrics.jsonl"), online(run_dir / "rank1" / "metrics.jsonl")
    assert ranks[0].keys() == ranks[1].keys() and ranks[0]
    for step in ranks[0]:
        a, b = ranks[0][step], ranks[1][step]
        # one averaged gradient on both ranks, from two different batches
        assert a["online/critic_grad_norm"] == b["online/critic_grad_norm"], step
        assert a["online/critic_loss"] != b["online/critic_loss"], step
