"""Demos slower than the task's horizon are flagged, with the horizon that fits them."""
import numpy as np

from robo_rl.train.sources import check_pace


def demo(steps: int, success_at: int | None) -> np.ndarray:
    """A demo's rewards [steps]: 1 from `success_at` on."""
    rewards = np.zeros(steps, np.float32)
    if success_at is not None:
        rewards[success_at - 1:] = 1.0
    return rewards


def test_demos_slower_than_the_horizon_are_flagged_with_the_horizon_that_fits(capsys):
    slow = [demo(482, 470), demo(510, 498), demo(392, 380), demo(50, None)]  # robosuite's 3 human Lift demos' pace
    check_pace(slow, 200, "lift3.hdf5")
    out = capsys.readouterr().out
    assert "3 of 3 demos in lift3.hdf5" in out and "up to 498" in out and "task.horizon=622" in out
    check_pace(slow, 622, "lift3.hdf5")  # the suggested horizon fits them all
    check_pace([demo(100, 90)], 200, "fast.hdf5")
    assert capsys.readouterr().out == ""
