"""Raw robosuite demos -> robomimic (real teleoperation fixture), and the dataset registry/downloader."""
import functools
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from robo_rl.data.hdf5 import DatasetError, read_hdf5
from robo_rl.data.registry import DownloadError, RegistryEntry, dataset_files, download, load_registry
from robo_rl.demos.convert import REST_SPEED, convert_robosuite

FIXTURES = Path("/work/shared/fixtures/robosuite")
LIFT = FIXTURES / "robosuite_v140_lift_panda_3demos.hdf5"
STACK = FIXTURES / "robosuite_v10_stack_panda_1demo.hdf5"
REPO = Path(__file__).resolve().parents[1]
ROBOMIMIC_LIFT_LOW_DIM = {"object": 10, "robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2}

needs_fixture = pytest.mark.skipif(not LIFT.exists(), reason=f"fixture {LIFT} not present")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("lift") / "lift_low_dim.hdf5"
    reports = convert_robosuite(str(LIFT), str(out))
    return out, reports


@needs_fixture
def test_fixture_converts_to_robomimic_lift(converted):
    path, reports = converted
    dataset = read_hdf5(path, action_dim=7)
    assert [e.name for e in dataset.episodes] == ["demo_1", "demo_2", "demo_3"]
    assert dataset.env_args["env_name"] == "Lift" and dataset.env_args["type"] == 1
    with h5py.File(LIFT) as raw:
        raw_states = [raw[f"data/demo_{i}/states"][()] for i in (1, 2, 3)]
    for e, states in zip(dataset.episodes, raw_states):
        T = len(states)
        assert e.num_steps == T
        for key, dim in ROBOMIMIC_LIFT_LOW_DIM.items():
            assert e.obs[key].shape == (T + 1, dim) and e.obs[key].dtype == np.float32
        assert e.rewards[-1] == 1.0 and e.terminals[-1]
        assert np.all(e.terminals == (e.rewards == 1.0) | (np.arange(T) == T - 1))  # done: success or last step
        assert np.abs(e.actions).max() <= 1.0
        np.testing.assert_array_equal(e.states, states)
        # obs[t] is the observation *at* states[t]: the cube position is qpos[9:12] (after 7 arm + 2 finger joints)
        np.testing.assert_allclose(e.obs["object"][:T, :3], states[:, 10:13], atol=1e-6)
        assert e.model_file.startswith("<mujoco")
    # replaying the recorded actions open loop from the first state
    assert [r.demo for r in reports] == ["demo_1", "demo_2", "demo_3"]
    for r in reports:
        assert r.success, r
        assert 0.0 < r.max_state_divergence < 5.0  # measured 0.09 / 1.02 / 0.45: human demos replay closely


def reexecuted(tmp_path, converted, **how) -> list:
    """(re-executed episode, recorded episode, report) per fixture demo, converted with `how`; each
    re-execution succeeded and ends there, its last step the only terminal."""
    out = tmp_path / "lift_reexecuted.hdf5"
    reports = convert_robosuite(str(LIFT), str(out), **how)
    assert [r.success for r in reports] == [True, True, True]
    triples = list(zip(read_hdf5(out, action_dim=7).episodes, read_hdf5(converted[0], action_dim=7).episodes, reports))
    for e, _, r in triples:
        assert r.kept_steps == e.num_steps
        assert e.rewards[-1] == 1.0 and e.terminals[-1] and e.terminals.sum() == 1  # the execution stops at success
    return triples


@needs_fixture
def test_drop_idle_keeps_the_moving_steps_and_each_demo_still_lifts(tmp_path, converted):
    for e, f, _ in reexecuted(tmp_path, converted, drop_idle=True):
        T = e.num_steps
        assert T < 0.7 * f.num_steps  # measured 240 of 482, 248 of 510, 128 of 392
        # obs[t] is the observation at states[t] (cube position = qpos[9:12]); robosuite samples env.step's
        # observation within the control period, so it trails the state by up to 2.2 mm while the cube settles
        np.testing.assert_allclose(e.obs["object"][:T, :3], e.states[:, 10:13], atol=3e-3)
        speed = np.maximum(np.abs(e.obs["robot0_joint_vel"][:T]).max(1), np.abs(e.obs["robot0_gripper_qvel"][:T]).max(1))
        waits = ~e.actions[1:, :6].any(1) & (e.actions[1:, 6] == e.actions[:-1, 6]) & (speed[1:] < REST_SPEED)
        assert not waits.any()  # no step left that commands nothing while the robot rests
        assert (~e.actions[:, :6].any(1)).mean() > 0.3  # the coasting and gripper-closing steps stay


@needs_fixture
def test_track_path_reexecutes_each_demo_smoothly_and_it_still_lifts(tmp_path, converted):
    for e, f, _ in reexecuted(tmp_path, converted, track_path=True):
        assert e.num_steps < 0.3 * f.num_steps  # measured 93 of 482, 91 of 510, 73 of 392
        assert np.abs(e.obs["robot0_eef_pos"][0] - f.obs["robot0_eef_pos"][0]).max() < 1e-6  # the demo's start
        np.testing.assert_array_equal(e.states[0], f.states[0])
        # smooth: a step's motion command changes little from the last one, where a key pulse changes it by
        # twice its size (mean |a_t - a_t-1| / mean |a_t| over the position dims: measured 0.16-0.25 tracked,
        # 2.0 recorded), and the hand is commanded to move at most steps (recorded: 91-93% zero commands)
        position = e.actions[:, :3]
        assert np.abs(np.diff(position, axis=0)).mean() < 0.5 * np.abs(position).mean()
        assert (~position.any(1)).mean() < 0.2
        # the gripper switches as often as in the demo (once here: it closes on the cube)
        assert (np.diff(e.actions[:, 6]) != 0).sum() == (np.diff(f.actions[:, 6]) != 0).sum() == 1


@needs_fixture
def test_images_through_the_command_line(tmp_path):
    short = tmp_path / "raw_short.hdf5"
    _copy_raw(LIFT, short, steps=6, demos=("demo_1",))
    out = tmp_path / "image.hdf5"
    run = subprocess.run([sys.executable, "scripts/convert_robosuite.py", f"input={short}", f"output={out}",
                          "cameras=[agentview,robot0_eye_in_hand]", "image_size=32"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "demo_1" in run.stdout and "max state divergence" in run.stdout
    with h5py.File(out) as f:
        assert f["data/demo_1/obs/agentview_image"].shape == (6, 32, 32, 3)
        assert f["data/demo_1/next_obs/robot0_eye_in_hand_image"].dtype == np.uint8
    e = read_hdf5(out).episodes[0]
    for key in ("agentview_image", "robot0_eye_in_hand_image"):
        assert e.obs[key].shape == (7, 3, 32, 32)
        assert e.obs[key].std() > 5  # a rendered scene, not a blank frame
    assert sorted(os.listdir(tmp_path)) == ["image.hdf5", "raw_short.hdf5"]  # no run folders, no temp files


def _copy_raw(src: Path, dst: Path, steps: int, demos=("demo_1", "demo_2")) -> None:
    """A short raw file: the first `steps` steps of some fixture demos, with the file's metadata."""
    with h5py.File(src) as f, h5py.File(dst, "w") as g:
        data = g.create_group("data")
        data.attrs.update(dict(f["data"].attrs))
        for d in demos:
            group = data.create_group(d)
            group.attrs["model_file"] = f[f"data/{d}"].attrs["model_file"]
            for key in ("states", "actions"):
                group.create_dataset(key, data=f[f"data/{d}/{key}"][:steps])


def _replace(group, key, value):
    del group[key]
    group.create_dataset(key, data=value)


@needs_fixture
@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda g: g.__delitem__("states"), ["demo_2/states", "missing"]),
        (lambda g: _replace(g, "states", g["states"][:5]), ["demo_2", "states (5, 32)", "actions (8, 7)"]),
        (lambda g: _replace(g, "actions", g["actions"][:, :6]), ["demo_2/actions", "dimension 6", "takes 7"]),
        (lambda g: _replace(g, "states", g["states"][:, :30]), ["demo_2/states", "30 columns", "32"]),
        (lambda g: g.attrs.__delitem__("model_file"), ["demo_2/model_file", "missing"]),
        (None, ["truncated or corrupt"]),
    ],
)
def test_bad_raw_files_fail_clearly_and_leave_no_output(tmp_path, damage, expected):
    raw = tmp_path / "raw.hdf5"
    _copy_raw(LIFT, raw, steps=8)
    if damage is None:
        raw.write_bytes(raw.read_bytes()[:3000])
    else:
        with h5py.File(raw, "a") as f:
            damage(f["data/demo_2"])
    out = tmp_path / "out.hdf5"
    with pytest.raises(DatasetError) as err:
        convert_robosuite(str(raw), str(out))
    for fragment in [str(raw), *expected]:
        assert fragment in str(err.value), (fragment, str(err.value))
    assert os.listdir(tmp_path) == ["raw.hdf5"]


@pytest.mark.skipif(not STACK.exists(), reason="Stack fixture not present")
def test_robosuite_1_0_demos_are_refused_with_the_reason(tmp_path):
    out = tmp_path / "stack.hdf5"
    with pytest.raises(DatasetError, match=r"demo_1/model_file.*'model_1.xml' is a file name") as err:
        convert_robosuite(str(STACK), str(out))
    assert "robosuite >= 1.2" in str(err.value)
    assert not out.exists()


# -- registry and downloads -------------------------------------------------------------------
def test_registry_lists_the_official_datasets():
    registry = load_registry()
    tasks = {"lift": ("ph", "mh"), "can": ("ph", "mh"), "square": ("ph", "mh"), "tool_hang": ("ph",)}
    for task, types in tasks.items():
        for typ in types:
            low_dim = registry[f"robomimic/{task}/{typ}/low_dim"]
            assert low_dim.sources(low_dim.files[0]) == [
                f"http://downloads.cs.stanford.edu/downloads/rt_benchmark/{task}/{typ}/low_dim_v141.hdf5"]
            assert registry[f"robomimic/{task}/{typ}/raw"].files == (f"robomimic/{task}/{typ}/demo_v141.hdf5",)
            image = registry[f"robomimic/{task}/{typ}/image"]
            assert not image.urls and "convert_robosuite.py" in image.make
            v15 = registry[f"robomimic_v15/{task}/{typ}/low_dim"]
            assert v15.sources(v15.files[0])[0].startswith(
                "https://huggingface.co/datasets/robomimic/robomimic_datasets/resolve/main/v1.5/")
            assert registry[f"robomimic_v01/{task}/{typ}/image"].files[0].endswith("/image.hdf5")
    sizes = {s: len(registry[f"libero/{s}"].files) for s in
             ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")}
    assert sizes == {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
    libero_10 = registry["libero/libero_10"]
    moka = "KITCHEN_SCENE3_turn_on_the_stove_and_put_the_moka_pot_on_it_demo.hdf5"
    assert libero_10.files[2] == f"libero/libero_10/{moka}"
    assert libero_10.sources(libero_10.files[2]) == [
        f"https://huggingface.co/datasets/yifengzhu-hf/LIBERO-datasets/resolve/main/libero_10/{moka}"]


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="download_datasets.py name=robomimic/can/ph/low_dim") as err:
        dataset_files("robomimic/can/ph/low_dim", root=tmp_path)
    assert str(tmp_path / "robomimic/can/ph/low_dim_v141.hdf5") in str(err.value)
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_files("robomimic/lift/xx/low_dim", root=tmp_path)


def test_unreachable_download_fails_fast_and_leaves_nothing(tmp_path):
    entry = RegistryEntry("toy", "robomimic", ("toy/low_dim.hdf5",), ("http://127.0.0.1:9/{name}",))
    start = time.monotonic()
    with pytest.raises(DownloadError, match="put it at") as err:
        download("toy", tmp_path, timeout=2, registry={"toy": entry})
    assert time.monotonic() - start < 5
    assert str(tmp_path / "toy/low_dim.hdf5") in str(err.value)
    assert os.listdir(tmp_path) == []


def test_download_from_a_local_server(tmp_path):
    served = tmp_path / "server"
    served.mkdir()
    payload = np.random.default_rng(0).bytes(3 << 20)
    (served / "a.hdf5").write_bytes(payload)
    handler = functools.partial(_QuietHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        entry = RegistryEntry("toy", "robomimic", ("toy/a.hdf5",),
                              ("http://127.0.0.1:9/{name}", f"http://127.0.0.1:{port}/{{name}}"))  # first URL is dead
        root = tmp_path / "root"
        [path] = download("toy", root, timeout=2, registry={"toy": entry})
        server.shutdown()
    assert path == root / "toy/a.hdf5" and path.read_bytes() == payload
    assert os.listdir(path.parent) == ["a.hdf5"]
    assert download("toy", root, registry={"toy": entry}) == [path]  # present files are not fetched again
    assert dataset_files("toy", root, registry={"toy": entry}) == [path]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
