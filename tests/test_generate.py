"""More demos from the 3 human Lift demos: each one's hand path, moved with the cube to new scenes."""
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from robo_rl.data.hdf5 import DatasetError, read_hdf5, write_robomimic
from robo_rl.demos.convert import convert_robosuite
from robo_rl.demos.generate import _turn, generate_demos

LIFT = Path("/work/shared/fixtures/robosuite/robosuite_v140_lift_panda_3demos.hdf5")
needs_fixture = pytest.mark.skipif(not LIFT.exists(), reason=f"fixture {LIFT} not present")


@pytest.mark.parametrize("symmetry, expected_degrees", [(1, 100.0), (4, 10.0), (0, 0.0)])
def test_a_turn_is_the_least_among_the_objects_equivalent_poses(symmetry, expected_degrees):
    source = Rotation.from_euler("xz", [20, 30], degrees=True)  # tilted, so "about its own z" matters
    now = source * Rotation.from_euler("z", 100, degrees=True)  # turned 100° about its own z since
    turn = _turn(now, source, symmetry)
    assert np.degrees(turn.magnitude()) == pytest.approx(expected_degrees, abs=0.6)  # 0: on a 1° grid
    # the source pose moved by the turn is the object now, turned about its own z by a symmetry of it
    about_z = ((turn * source).inv() * now).as_rotvec(degrees=True)
    assert np.abs(about_z[:2]).max() < 1e-6
    if symmetry:
        assert abs((about_z[2] + 1) % (360 / symmetry) - 1) < 1e-6


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    source, out = root / "lift3_track.hdf5", root / "lift3_generated.hdf5"
    convert_robosuite(str(LIFT), str(source), track_path=True)
    report = generate_demos(str(source), str(out), num_demos=4, object_symmetry=4, seed=0, max_attempts=24,
                            progress=False)
    return read_hdf5(source), read_hdf5(out), report


@needs_fixture
def test_generated_demos_lift_the_cube_in_new_scenes(generated):
    source, out, report = generated
    assert report.generated == 4 and 4 <= report.attempts <= 24  # measured: 100 of 224 (noise 0.1)
    assert report.env_steps >= sum(e.num_steps for e in out.episodes[3:])
    assert [e.name for e in out.episodes[:3]] == ["demo_0", "demo_1", "demo_2"]  # the sources come first
    for s, o in zip(source.episodes, out.episodes[:3]):
        np.testing.assert_array_equal(s.actions, o.actions)
    starts = np.stack([e.obs["object"][0, :3] for e in out.episodes])  # [7, 3] cube positions at the start
    for e in out.episodes[3:]:
        assert e.rewards[-1] == 1.0 and e.terminals[-1] and not e.terminals[:-1].any()  # it ends at success
        assert e.obs["object"][-1, 2] > e.obs["object"][:, 2].min() + 0.015  # the cube is up from where it lay
    distances = np.linalg.norm(starts[:, None] - starts[None], axis=-1)  # [7, 7]
    assert (distances[np.triu_indices(len(starts), 1)] > 1e-3).all()  # every demo is a different scene


@needs_fixture
def test_the_grasp_moves_with_the_cube(generated):
    """Where the gripper closes, the hand sits on the cube as in one of the sources, in the cube's frame
    (its position to within 1.5 cm and its turn about the vertical to within 10°, both up to the cube's quarter
    turns; the hand nudges the cube on the way down by up to ~1 cm)."""
    source, out, _ = generated

    def grasp_in_cube_frame(e):
        t = int(np.flatnonzero(np.diff(e.actions[:, -1]) != 0)[0]) + 1  # the step that closes the gripper
        cube = Rotation.from_quat(e.obs["object"][t, 3:7])
        position = cube.inv().apply(e.obs["robot0_eef_pos"][t] - e.obs["object"][t, :3])
        yaw = (cube.inv() * Rotation.from_quat(e.obs["robot0_eef_quat"][t])).as_euler("xyz", degrees=True)[2]
        return position, yaw

    sources = [grasp_in_cube_frame(e) for e in source.episodes]
    for e in out.episodes[3:]:
        position, yaw = grasp_in_cube_frame(e)
        quarter_turns = Rotation.from_euler("z", [[0], [90], [180], [270]], degrees=True)  # the cube looks alike
        gaps = [(np.linalg.norm(quarter_turns.apply(position) - p, axis=1).min(), abs((yaw - y + 45) % 90 - 45))
                for p, y in sources]
        assert any(d < 0.015 and turn < 10 for d, turn in gaps), gaps


def test_a_dataset_without_the_hand_orientation_is_refused(tmp_path):
    from test_bad_inputs import lift_episodes  # robomimic Lift demos with the state keys training reads

    episodes = lift_episodes()
    for e in episodes:
        del e.obs["robot0_eef_quat"]
    path = tmp_path / "lift.hdf5"
    write_robomimic(path, episodes, {"env_name": "Lift", "type": 1, "env_kwargs": {}})
    with pytest.raises(DatasetError, match=r"observations lack \['robot0_eef_quat'\].*convert_robosuite"):
        generate_demos(str(path), str(tmp_path / "out.hdf5"), num_demos=1, progress=False)
    assert not (tmp_path / "out.hdf5").exists()


@needs_fixture
def test_a_run_makes_its_demos_from_raw_human_ones_and_counts_their_env_steps(tmp_path):
    """`train_qwm.py dataset=RAW demos.generate=N`: the path tracker's conversion, then N generated demos, trained
    on, with the simulator steps of both in eval.json; a resumed run reads them instead of generating again."""
    from test_train import train

    run_dir = tmp_path / "run"
    overrides = ("task=lift", f"dataset={LIFT}", "demos.generate=2", "planner=none")
    train(run_dir, *overrides)
    record_path = run_dir / "demos" / "generated2_seed0.json"
    record = json.loads(record_path.read_text())
    tracked = read_hdf5(run_dir / "demos" / f"{LIFT.stem}_tracked.hdf5")
    trained_on = read_hdf5(run_dir / "demos" / "generated2_seed0.hdf5")
    assert len(trained_on.episodes) == len(tracked.episodes) + 2 == 5  # every human demo still lifts tracked
    assert record["conversion_env_steps"] == sum(e.num_steps for e in tracked.episodes)
    assert record["generation_env_steps"] >= sum(e.num_steps for e in trained_on.episodes[3:])
    assert record["env_steps"] == record["conversion_env_steps"] + record["generation_env_steps"]
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["demo_env_steps"] == record["env_steps"]
    assert result["env_steps_total"] == result["online_env_steps"] + record["env_steps"]

    made = record_path.stat().st_mtime_ns
    proc = train(run_dir, *overrides, "resume=true")
    assert "generated from" in proc.stdout and "before" in proc.stdout
    assert record_path.stat().st_mtime_ns == made
    assert json.loads((run_dir / "eval.json").read_text())["demo_env_steps"] == record["env_steps"]
