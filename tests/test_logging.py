"""RunLogger: one monotonic step axis, and a resumed run drops what it will log again."""
import json

import pytest
from omegaconf import OmegaConf

from robo_rl.utils.logging import RunLogger

CFG = OmegaConf.create({"logger": {"mode": "disabled"}})


def steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_steps_never_go_back(tmp_path):
    logger = RunLogger(tmp_path, CFG, "t")
    logger.log({"a": 1}, 10)
    logger.log({"b": 2}, 10)  # several records at one step are fine
    with pytest.raises(ValueError, match="below the last logged step 10"):
        logger.log({"a": 1}, 5)


def test_resume_drops_records_after_the_checkpoint_and_a_torn_last_line(tmp_path):
    logger = RunLogger(tmp_path, CFG, "t")
    for step in (10, 20, 30, 40):
        logger.log({"x": step}, step)
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 50, "x"')  # a write the crash cut short
    resumed = RunLogger(tmp_path, CFG, "t", resume_step=20)
    with pytest.raises(ValueError):
        resumed.log({"x": 0}, 15)
    resumed.log({"x": 30}, 30)
    resumed.close()
    assert steps(tmp_path) == [10, 20, 30]


def test_eval_videos_reach_wandb_when_it_is_on(tmp_path, monkeypatch):
    import numpy as np

    from robo_rl.eval.video import write_mp4

    monkeypatch.setenv("WANDB_SILENT", "true")
    video = write_mp4(tmp_path / "videos" / "ep0.mp4", [np.zeros((32, 32, 3), np.uint8)] * 4)
    cfg = OmegaConf.create({"logger": {"mode": "offline", "project": "t", "entity": None}})
    logger = RunLogger(tmp_path, cfg, "t")
    logger.log_videos([str(video)], 5)
    logger.close()
    assert list((tmp_path / "wandb").rglob("media/videos/eval/video_0_*.mp4"))


def test_piped_progress_is_one_line_per_tenth_and_the_run_log_gets_every_line(tmp_path):
    import subprocess
    import sys

    code = ("from robo_rl.utils.logging import progress_bar, tee_output\n"
            "with tee_output('run.log'):\n"
            "    print('[data] start')\n"
            "    bar = progress_bar(range(95), total=95, desc='offline')\n"
            "    for i in bar:\n"
            "        bar.set_postfix(loss=i)\n"
            "    bar.close()\n"
            "    print('[eval] success 1.00')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    bars = proc.stderr.splitlines()
    assert "\r" not in proc.stderr and 10 <= len(bars) <= 12  # 0%, every 9 steps, 100%
    assert all(line.startswith("offline:") for line in bars) and "95/95" in bars[-1]
    logged = (tmp_path / "run.log").read_text().splitlines()
    assert logged[0] == "[data] start" and logged[-1] == "[eval] success 1.00" and logged[1:-1] == bars
