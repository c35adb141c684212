"""HDF5 I/O: robomimic round trips, robomimic's own reader on our files, LIBERO layout, bad inputs."""
import json
import os

import h5py
import numpy as np
import pytest

from robo_rl.data.hdf5 import DatasetError, Episode, read_hdf5, write_libero, write_robomimic

LOW_DIM = {"object": 10, "robot0_eef_pos": 3}
ENV_ARGS = {"env_name": "Lift", "type": 1, "env_kwargs": {"robots": ["Panda"], "control_freq": 20}}


def make_episode(rng: np.random.Generator, T: int, name: str | None = None, image: bool = True) -> Episode:
    obs = {k: rng.normal(size=(T + 1, d)).astype(np.float32) for k, d in LOW_DIM.items()}
    if image:
        obs["agentview_image"] = rng.integers(0, 256, size=(T + 1, 3, 8, 6), dtype=np.uint8)
    terminals = np.zeros(T, bool)
    terminals[-1] = True
    return Episode(obs=obs, actions=rng.uniform(-1, 1, size=(T, 7)).astype(np.float32),
                   rewards=(rng.random(T) > 0.8).astype(np.float32), terminals=terminals,
                   states=rng.normal(size=(T, 32)), model_file="<mujoco model='base'/>", task_id=int(rng.integers(3)),
                   instruction="lift the cube", name=name)


def assert_episodes_equal(a: Episode, b: Episode) -> None:
    assert a.obs.keys() == b.obs.keys()
    for k in a.obs:
        assert a.obs[k].dtype == b.obs[k].dtype, k
        np.testing.assert_array_equal(a.obs[k], b.obs[k], err_msg=k)
    for field in ("actions", "rewards", "terminals", "states"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert (a.model_file, a.task_id, a.instruction, a.name) == (b.model_file, b.task_id, b.instruction, b.name)


@pytest.fixture
def episodes():
    rng = np.random.default_rng(0)
    return [make_episode(rng, T, f"demo_{i}") for i, T in enumerate([5, 1, 9, 4, 7])]


def test_round_trip_is_exact(tmp_path, episodes):
    path = tmp_path / "out.hdf5"
    write_robomimic(path, episodes, ENV_ARGS, valid_fraction=0.2, attrs={"note": "x", "meta": {"a": 1}})
    dataset = read_hdf5(path)
    assert dataset.format == "robomimic" and dataset.env_args == ENV_ARGS
    assert dataset.attrs == {"note": "x", "meta": json.dumps({"a": 1})}
    assert [e.name for e in dataset.episodes] == [e.name for e in episodes]
    for written, read in zip(episodes, dataset.episodes):
        assert_episodes_equal(written, read)
    # the filter keys partition the demos
    train = read_hdf5(path, filter_key="train", obs_keys=["object"]).episodes
    valid = read_hdf5(path, filter_key="valid", obs_keys=["object"]).episodes
    assert len(valid) == 1 and len(train) == 4
    assert sorted(e.name for e in train + valid) == sorted(e.name for e in episodes)
    assert list(train[0].obs) == ["object"]


def test_unnamed_episodes_get_demo_names_and_old_file_survives_a_failed_write(tmp_path, episodes):
    path = tmp_path / "out.hdf5"
    for e in episodes:
        e.name = None
    write_robomimic(path, episodes, ENV_ARGS)
    assert [e.name for e in read_hdf5(path).episodes] == [f"demo_{i}" for i in range(len(episodes))]
    before = path.read_bytes()
    with pytest.raises(TypeError):  # h5py cannot store an arbitrary object as an attr: fails mid-write
        write_robomimic(path, episodes, ENV_ARGS, attrs={"bad": object()})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.hdf5"]


def test_layout_matches_robomimic_conventions(tmp_path, episodes):
    path = tmp_path / "out.hdf5"
    write_robomimic(path, episodes, ENV_ARGS)
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert data.attrs["total"] == sum(e.num_steps for e in episodes)
        env_meta = json.loads(data.attrs["env_args"])  # what robomimic's get_env_metadata_from_dataset returns
        assert set(env_meta) >= {"env_name", "type", "env_kwargs"}
        masks = {k: [n.decode() for n in f["mask"][k][()]] for k in f["mask"]}
        assert set(masks) == {"train", "valid"} and f["mask/train"].dtype.kind == "S"
        for e in episodes:
            demo = data[e.name]
            T = e.num_steps
            assert demo.attrs["num_samples"] == T and demo.attrs["model_file"] == e.model_file
            assert demo["actions"].shape == (T, 7) and demo["rewards"].shape == (T,)
            assert demo["dones"].shape == (T,) and demo["dones"].dtype.kind == "i"
            assert demo["states"].shape == (T, 32)
            for group in ("obs", "next_obs"):
                assert demo[f"{group}/object"].shape == (T, 10)
                image = demo[f"{group}/agentview_image"]
                assert image.shape == (T, 8, 6, 3) and image.dtype == np.uint8  # H x W x C, as robomimic stores
            np.testing.assert_array_equal(demo["next_obs/object"][:-1], demo["obs/object"][1:])


def test_robomimic_sequence_dataset_reads_our_file(tmp_path, episodes):
    """robomimic's own loader reads what we write."""
    ObsUtils = pytest.importorskip("robomimic.utils.obs_utils")
    from robomimic.utils.dataset import SequenceDataset

    path = tmp_path / "out.hdf5"
    write_robomimic(path, episodes, ENV_ARGS)
    keys = ["object", "robot0_eef_pos", "agentview_image"]
    ObsUtils.initialize_obs_utils_with_obs_specs({"obs": {"low_dim": keys[:2], "rgb": keys[2:]}})
    loader = SequenceDataset(str(path), obs_keys=keys, dataset_keys=("actions", "rewards", "dones"),
                             seq_length=2, hdf5_cache_mode="low_dim", filter_by_attribute="train")
    ours = {e.name: e for e in episodes}
    assert len(loader) == sum(ours[d].num_steps for d in loader.demos)
    item = loader[0]  # first step of the first training demo
    e = ours[loader.demos[0]]
    np.testing.assert_allclose(item["obs"]["object"], e.obs["object"][:2])
    np.testing.assert_allclose(item["next_obs"]["robot0_eef_pos"], e.obs["robot0_eef_pos"][1:3])
    np.testing.assert_allclose(item["actions"], e.actions[:2])
    np.testing.assert_allclose(item["obs"]["agentview_image"], e.obs["agentview_image"][:2] / 255.0)  # CHW, [0, 1]


def write_libero_file(path, rng, lengths=(4, 6)) -> list[dict]:
    """A file laid out as LIBERO's scripts/create_dataset.py writes it."""
    demos = []
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                 "language_instruction": "put the bowl on the plate"})
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation",
                                             "env_kwargs": {"camera_heights": 16}})
        data.attrs["bddl_file_name"] = "libero/bddl_files/libero_10/task.bddl"
        data.attrs["macros_image_convention"] = "opengl"
        for i, T in enumerate(lengths):
            upright = rng.integers(0, 256, size=(T, 16, 12, 3), dtype=np.uint8)
            g = data.create_group(f"demo_{i}")
            g.create_dataset("obs/agentview_rgb", data=upright[:, ::-1])  # stored upside down
            g.create_dataset("obs/joint_states", data=rng.normal(size=(T, 7)))
            g.create_dataset("actions", data=rng.uniform(-1, 1, size=(T, 7)))
            rewards = np.zeros(T, np.uint8)
            rewards[-1] = 1
            g.create_dataset("rewards", data=rewards)
            g.create_dataset("dones", data=rewards)
            g.create_dataset("states", data=rng.normal(size=(T, 40)))
            g.attrs["num_samples"] = T
            demos.append({"upright": upright, "joint_states": g["obs/joint_states"][()]})
    return demos


def test_libero_file_is_read_upright_with_instruction(tmp_path):
    path = tmp_path / "libero.hdf5"
    truth = write_libero_file(path, np.random.default_rng(1))
    dataset = read_hdf5(path, action_dim=7, task_id=4)
    assert dataset.format == "libero" and dataset.attrs["bddl_file_name"].endswith("task.bddl")
    for e, t in zip(dataset.episodes, truth):
        T = len(t["upright"])
        assert e.instruction == "put the bowl on the plate" and e.task_id == 4
        image = e.obs["agentview_rgb"]
        assert image.shape == (T + 1, 3, 16, 12) and image.dtype == np.uint8
        np.testing.assert_array_equal(image[:T], t["upright"].transpose(0, 3, 1, 2))
        np.testing.assert_array_equal(image[T], image[T - 1])  # no next_obs: the last obs is repeated
        np.testing.assert_array_equal(e.obs["joint_states"][:T], t["joint_states"].astype(np.float32))
        assert e.rewards[-1] == 1 and e.terminals[-1] and not e.terminals[:-1].any()


def test_libero_layout_written_as_libero_writes_it_and_read_back(tmp_path, episodes):
    path = tmp_path / "pick_up_the_x_demo.hdf5"
    write_libero(path, episodes, "pick up the x", "libero_object/pick_up_the_x.bddl",
                 {"env_name": "libero_object", "type": 1, "env_kwargs": {}}, attrs={"expert_success_rate": 0.9})
    with h5py.File(path) as f:
        assert "mask" not in f and not any("next_obs" in f["data"][d] for d in f["data"])
        assert f["data"].attrs["bddl_file_name"] == "libero_object/pick_up_the_x.bddl"
        stored = f["data/demo_2/obs/agentview_image"][()]  # [T, H, W, C], bottom row first
        np.testing.assert_array_equal(stored, episodes[2].obs["agentview_image"][:-1].transpose(0, 2, 3, 1)[:, ::-1])
    dataset = read_hdf5(path, action_dim=7)
    assert dataset.format == "libero" and dataset.attrs["expert_success_rate"] == 0.9
    for written, read in zip(episodes, dataset.episodes):
        assert read.instruction == "pick up the x" and read.num_steps == written.num_steps
        for k, v in written.obs.items():  # LIBERO keeps T observations: the last one read is the one before
            np.testing.assert_array_equal(read.obs[k], np.concatenate([v[:-1], v[-2:-1]]), err_msg=k)
        np.testing.assert_array_equal(read.actions, written.actions)


# -- bad inputs -------------------------------------------------------------------------------
def _damage(path, demo, edit):
    with h5py.File(path, "a") as f:
        edit(f[f"data/{demo}"])


@pytest.mark.parametrize(
    "damage, read_kwargs, expected",
    [
        (lambda g: g.__delitem__("dones"), {}, ["demo_2", "dones", "missing"]),
        (lambda g: g.__delitem__("obs"), {}, ["demo_2", "obs", "missing"]),
        (None, {"obs_keys": ["object", "robot0_joint_vel"]}, ["demo_0", "obs/robot0_joint_vel", "missing"]),
        (lambda g: (g.__delitem__("rewards"), g.create_dataset("rewards", data=np.zeros(3))), {},
         ["demo_2", "rewards", "3 rows", "9"]),
        (lambda g: (g.__delitem__("next_obs/object"), g.create_dataset("next_obs/object", data=np.zeros((4, 10)))),
         {}, ["demo_2", "next_obs/object", "4 rows"]),
        (None, {"action_dim": 6}, ["demo_0", "actions", "dimension 7", "expected 6"]),
        (None, {"filter_key": "20_percent"}, ["mask/20_percent", "train", "valid"]),
    ],
)
def test_bad_inputs_name_file_demo_and_key(tmp_path, episodes, damage, read_kwargs, expected):
    path = tmp_path / "bad.hdf5"
    write_robomimic(path, episodes, ENV_ARGS)
    if damage is not None:
        _damage(path, "demo_2", damage)
    with pytest.raises(DatasetError) as err:
        read_hdf5(path, **read_kwargs)
    message = str(err.value)
    for fragment in [str(path), *expected]:
        assert fragment in message, (fragment, message)


def test_truncated_and_foreign_files(tmp_path, episodes):
    path = tmp_path / "cut.hdf5"
    write_robomimic(path, episodes, ENV_ARGS)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        read_hdf5(path)
    raw = "/work/shared/fixtures/robosuite/robosuite_v140_lift_panda_3demos.hdf5"
    if os.path.exists(raw):
        with pytest.raises(DatasetError, match="convert_robosuite.py"):
            read_hdf5(raw)
    with pytest.raises(DatasetError, match="no such file"):
        read_hdf5(tmp_path / "absent.hdf5")


def test_corrupt_data_names_demo_and_key(tmp_path, episodes):
    path = tmp_path / "corrupt.hdf5"
    write_robomimic(path, episodes, ENV_ARGS)
    with h5py.File(path, "a") as f:  # store demo_2's actions gzip-compressed, then damage the compressed chunk
        actions = f["data/demo_2/actions"][()]
        del f["data/demo_2/actions"]
        f["data/demo_2"].create_dataset("actions", data=actions, chunks=actions.shape, compression="gzip")
        chunk = f["data/demo_2/actions"].id.get_chunk_info(0)
    with open(path, "r+b") as raw:
        raw.seek(chunk.byte_offset + 4)
        raw.write(b"\xff" * 16)
    with pytest.raises(DatasetError) as err:
        read_hdf5(path)
    assert "[data/demo_2/actions]" in str(err.value) and "truncated or corrupt" in str(err.value)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda e: setattr(e, "rewards", e.rewards[:-1]), "rewards: 8 steps but actions has 9"),
        (lambda e: e.obs.__setitem__("object", e.obs["object"][:-1]), "obs/object: 8 steps"),
        (lambda e: e.obs.pop("robot0_eef_pos"), "keys"),
        (lambda e: e.obs.__setitem__("agentview_image", e.obs["agentview_image"].astype(np.float32)), "uint8"),
    ],
)
def test_invalid_episodes_leave_no_file(tmp_path, episodes, edit, expected):
    edit(episodes[2])
    path = tmp_path / "never.hdf5"
    with pytest.raises(DatasetError, match=expected) as err:
        write_robomimic(path, episodes, ENV_ARGS)
    assert "demo_2" in str(err.value)
    assert os.listdir(tmp_path) == []
