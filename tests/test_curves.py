"""Learning curves: aligned lists in curves.json, a PNG, points after a resumed checkpoint dropped."""
import json

from robo_rl.train.curves import LearningCurve


def test_curve_points_align_and_a_resume_drops_the_later_ones(tmp_path):
    curve = LearningCurve(tmp_path)
    curve.set_offline(0.4)
    for steps, with_search, without in ((500, 0.5, 0.45), (1000, 0.7, 0.6), (1000, 0.75, 0.6), (1500, 0.8, 0.7)):
        curve.add(steps, with_search, without)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data == {"env_steps": [500, 1000, 1500], "success": [0.5, 0.75, 0.8],
                    "success_no_search": [0.45, 0.6, 0.7], "offline_success_rate": 0.4}
    assert (tmp_path / "curves.png").stat().st_size > 1000

    resumed = LearningCurve(tmp_path, resume_env_steps=1200)  # the checkpoint before the crash was at 1200
    resumed.add(1500, 0.9)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data["env_steps"] == [500, 1000, 1500] and data["success"] == [0.5, 0.75, 0.9]
    assert data["success_no_search"] == [0.45, 0.6, None] and data["offline_success_rate"] == 0.4
