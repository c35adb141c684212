"""Learning curves: aligned lists in curves.json, a PNG, points after a resumed checkpoint dropped."""
import json
from pathlib import Path

from matplotlib.image import imread

from robo_rl.train.curves import LearningCurve


def test_curve_points_align_and_a_resume_drops_the_later_ones(tmp_path):
    curve = LearningCurve(tmp_path)
    curve.set_offline(0.4)
    for steps, with_search, without in ((500, 0.5, 0.45), (1000, 0.7, 0.6), (1000, 0.75, 0.6), (1500, 0.8, 0.7)):
        curve.add(steps, with_search, without)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data == {"env_steps": [500, 1000, 1500], "success": [0.5, 0.75, 0.8],
                    "success_no_search": [0.45, 0.6, 0.7], "offline_success_rate": 0.4,
                    "offline_steps": [], "offline_success": []}
    assert (tmp_path / "curves.png").stat().st_size > 1000

    resumed = LearningCurve(tmp_path, resume_env_steps=1200)  # the checkpoint before the crash was at 1200
    resumed.add(1500, 0.9)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data["env_steps"] == [500, 1000, 1500] and data["success"] == [0.5, 0.75, 0.9]
    assert data["success_no_search"] == [0.45, 0.6, None] and data["offline_success_rate"] == 0.4


def test_offline_points_get_their_own_panel_and_a_resume_drops_the_later_ones(tmp_path):
    curve = LearningCurve(tmp_path)
    for step, rate in ((1000, 0.7), (2000, 0.8), (3000, 0.2)):
        curve.add_offline(step, rate)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data["offline_steps"] == [1000, 2000, 3000] and data["offline_success"] == [0.7, 0.8, 0.2]
    assert data["env_steps"] == []
    (tmp_path / "online_only").mkdir()
    one_panel = LearningCurve(tmp_path / "online_only")
    one_panel.add(500, 0.5)
    # the offline panel makes the figure wider (10 x 4 in against 6 x 4 in at 100 dpi)
    assert imread(tmp_path / "curves.png").shape[1] == 1000 and imread(tmp_path / "online_only" / "curves.png").shape[1] == 600

    resumed = LearningCurve(tmp_path, resume_env_steps=0, resume_offline_step=2500)  # offline checkpoint at 2500
    resumed.add_offline(3000, 0.6)
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data["offline_steps"] == [1000, 2000, 3000] and data["offline_success"] == [0.7, 0.8, 0.6]


def test_the_legend_names_what_acts_without_search(tmp_path):
    """A run acting by critic best-of-N must not have its curve labelled as the policy's own samples."""
    def legend(curve):
        return [t.get_text() for t in curve.figure().axes[-1].get_legend().get_texts()]

    (tmp_path / "searched").mkdir()
    alone = LearningCurve(tmp_path, no_search_actor="critic best-of-8")
    alone.add(500, 0.5)
    assert legend(alone) == ["critic best-of-8"]
    searched = LearningCurve(tmp_path / "searched")
    searched.set_offline(0.4)
    searched.add(500, 0.6, 0.5)
    assert legend(searched) == ["offline start (0.40)", "with search", "without search (policy)"]


def test_every_budget_but_smoke_draws_at_least_three_points():
    from hydra import compose, initialize_config_dir

    root = Path(__file__).resolve().parents[1]
    for budget in ("cpu", "cpu_long", "gpu"):
        with initialize_config_dir(config_dir=str(root / "conf"), version_base=None):
            b = compose("config", [f"budget={budget}"]).budget
        periodic = b.online_steps // b.eval_every if b.eval_every else 0
        final = 0 if b.eval_every and b.online_steps % b.eval_every == 0 else 1  # the final point, unless periodic
        assert 1 + periodic + final >= 3, budget  # with the offline start at 0 env steps
