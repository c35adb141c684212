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
