"""Bad inputs are stopped at the door: malformed datasets, configs, diverging updates, environment setup.

Every case ends in one line naming the bad value and the fix, exit code 2 from the scripts, and no work
done: config errors are found before Hydra creates the run directory, dataset errors before training.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from robo_rl.agents.sorl import NonFiniteUpdateError, SORLAgent
from robo_rl.config import ConfigError, validate
from robo_rl.data.hdf5 import DatasetError, Episode, write_robomimic
from robo_rl.demos.convert import read_raw_robosuite
from robo_rl.envs import env_spec
from robo_rl.train.sources import offline_episodes
from test_hdf5 import write_libero_file
from test_sorl_agent import ACTION_DIM, LIFT_SHAPES, small_config, synthetic_batch

ROOT = Path(__file__).resolve().parents[1]
RAW_LIFT = Path("/work/shared/fixtures/robosuite/robosuite_v140_lift_panda_3demos.hdf5")
NUM_DEMOS = 6


def lift_episodes(seed: int = 0) -> list[Episode]:
    """Demos with Lift's state observation keys and shapes (robomimic layout), actions in [-1, 1]."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(NUM_DEMOS):
        T = 12
        terminals = np.zeros(T, bool)
        terminals[-1] = True
        episodes.append(Episode(
            obs={k: rng.normal(size=(T + 1, *shape)).astype(np.float32) for k, shape in LIFT_SHAPES.items()},
            actions=rng.uniform(-1, 1, (T, ACTION_DIM)).astype(np.float32), rewards=terminals.astype(np.float32),
            terminals=terminals, name=f"demo_{i}"))
    return episodes


def write_lift(path: Path, edit=None) -> Path:
    """A Lift dataset written by robo_rl's own writer, then `edit(file)` applied to it in place."""
    write_robomimic(path, lift_episodes(), {"env_name": "Lift", "type": 1, "env_kwargs": {}})
    if edit is not None:
        with h5py.File(path, "a") as f:
            edit(f)
    return path


def scale(key: str, factor: float):
    def edit(f):
        for demo in f["data"]:
            f[f"data/{demo}/{key}"][...] = f[f"data/{demo}/{key}"][()] * factor
    return edit


def nan_states(demos: dict):
    """Give every demo a `states` column [T, 32] of zeros, NaN at `demos[demo]` (a row or one element)."""
    def edit(f):
        for demo in f["data"]:
            states = np.zeros((len(f[f"data/{demo}/actions"]), 32))
            if demo in demos:
                states[demos[demo]] = np.nan
            f.create_dataset(f"data/{demo}/states", data=states)
    return edit


def set_values(key: str, value: float, demos: dict):
    """Set `data/<demo>/<key>[index]` to `value` for each demo -> index (a row, rows, or one element)."""
    def edit(f):
        for demo, index in demos.items():
            data = f[f"data/{demo}/{key}"][()]
            data[index] = value
            f[f"data/{demo}/{key}"][...] = data
    return edit


@pytest.fixture(scope="module")
def lift_file(tmp_path_factory) -> Path:
    return write_lift(tmp_path_factory.mktemp("data") / "lift.hdf5")


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(name, overrides=overrides, return_hydra_config=True)


# -- datasets, read the way training reads them ------------------------------------------------
def make_libero(path: Path) -> Path:
    write_libero_file(path, np.random.default_rng(0))
    return path


def make_empty_dir(path: Path) -> Path:
    path.mkdir()
    return path


DATASETS = {
    # case: (make(path) -> dataset path, task, fragments the one-line message must hold)
    "nan_actions_in_2_demos": (lambda p: write_lift(p, set_values("actions", np.nan, {"demo_1": 3, "demo_4": [0, 5]})),
                               "lift", ["non-finite values in 2 of 6 demos", "demo_1 actions (7 NaN)",
                                        "demo_4 actions (14 NaN)", "clean or drop"]),
    "one_nan_observation": (lambda p: write_lift(p, set_values("obs/object", np.nan, {"demo_2": (4, 1)})),
                            "lift", ["1 of 6 demos", "demo_2 obs/object (1 NaN)"]),
    "inf_in_last_next_obs": (lambda p: write_lift(p, set_values("next_obs/robot0_eef_pos", np.inf, {"demo_0": (11, 0)})),
                             "lift", ["demo_0 obs/robot0_eef_pos (1 Inf)"]),
    "inf_reward": (lambda p: write_lift(p, set_values("rewards", -np.inf, {"demo_5": 2})),
                   "lift", ["demo_5 rewards (1 Inf)"]),
    "nan_state": (lambda p: write_lift(p, nan_states({"demo_3": (2, 5)})), "lift", ["1 of 6 demos", "demo_3 states (1 NaN)"]),
    "actions_times_50": (lambda p: write_lift(p, scale("actions", 50.0)), "lift",
                         ["actions outside [-1, 1] in 6 of 6 demos", "max |a| = 4", "normalized delta actions"]),
    "lift_file_for_can": (lambda p: write_lift(p), "can", ["recorded in Lift", "task=can runs PickPlaceCan",
                                                           "pass task=lift", "or a PickPlaceCan dataset"]),
    "libero_file_for_lift": (make_libero, "lift", ["is a LIBERO file", "task=lift is a robosuite task",
                                                   "robomimic files of Lift"]),
    "robomimic_file_for_libero": (lambda p: write_lift(p), "libero_10", ["robomimic file of Lift",
                                                                         "task=libero_10 is a LIBERO suite",
                                                                         "task=lift for this file"]),
    "empty_directory": (lambda p: make_empty_dir(p.parent / "empty"), "lift", ["dataset=", "folder without .hdf5 files", "expected robomimic/LIBERO"]),
    "missing_file": (lambda p: p, "lift", ["dataset=", "no such file or folder", "expected a robomimic/LIBERO HDF5"]),
}


@pytest.mark.parametrize("case", DATASETS)
def test_bad_dataset_is_refused_before_training(tmp_path, case):
    make, task, fragments = DATASETS[case]
    path = make(tmp_path / "data.hdf5")
    cfg = compose_config("config", [f"task={task}", f"dataset={path}", "task.task_ids=[0]"])
    with pytest.raises((DatasetError, ConfigError)) as err:
        offline_episodes(cfg, env_spec(cfg))
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_actions_within_tolerance_are_clipped_onto_the_bounds(tmp_path):
    # float round-off just past +-1 is not an error: robosuite clips to [-1, 1] before acting
    path = write_lift(tmp_path / "data.hdf5", set_values("actions", 1.0005, {"demo_0": 0}))
    cfg = compose_config("config", ["task=lift", f"dataset={path}"])
    episodes = list(offline_episodes(cfg, env_spec(cfg)).episodes)
    assert len(episodes) == NUM_DEMOS and (episodes[0].actions[0] == 1.0).all()
    assert max(np.abs(e.actions).max() for e in episodes) <= 1.0


@pytest.mark.skipif(not RAW_LIFT.exists(), reason=f"fixture {RAW_LIFT} not present")
def test_raw_demo_with_nan_state_is_refused_before_replay(tmp_path):
    raw = tmp_path / "raw.hdf5"
    shutil.copy(RAW_LIFT, raw)
    with h5py.File(raw, "a") as f:
        f["data/demo_2/states"][7, :3] = np.nan
    with pytest.raises(DatasetError, match=r"demo_2/states\]: 3 NaN values; clean or drop"):
        read_raw_robosuite(str(raw))


# -- configs, through the real entry points ----------------------------------------------------
def run_script(script: str, *args: str, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, fragments: list[str], before_work: bool = True) -> None:
    """Exit code 2 and stderr ending in one `error: ...` line (before any work: nothing else on stderr)."""
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and (len(lines) == 1 or not before_work), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])


SMOKE = ["budget=smoke", "logger.mode=disabled"]
CONFIGS = {
    # case: (script, overrides; {lift}, {empty} and {libero} stand for dataset paths, fragments of the message)
    "misspelt_added_group": ("train_qwm.py", ["+planer.depth=3"], ["unknown key planer", "did you mean planner?"]),
    # Hydra's own composition errors (exit 1, six lines, a `+key` hint) become the same one line
    "misspelt_key": ("train_qwm.py", ["budget.onlin_steps=5"], ["unknown key budget.onlin_steps",
                                                                "did you mean budget.online_steps?"]),
    "misspelt_group": ("train_qwm.py", ["planer.depth=3"], ["unknown key planer.depth", "did you mean planner?"]),
    "no_such_task": ("train_qwm.py", ["task=lfit"], ["task=lfit: no such option", "did you mean lift?",
                                                     "libero_10"]),
    "unparsable_override": ("train_qwm.py", ["agent.lr=="], ["agent.lr==: not an override Hydra can parse"]),
    "eval_misspelt_key": ("evaluate.py", ["episods=3"], ["unknown key episods", "did you mean episodes?"]),
    "resume_without_a_run": ("train_qwm.py", ["resume=true"], ["resume=true: no checkpoint in hydra.run.dir=",
                                                               "resume=auto"]),
    "compare_without_checkpoint": ("evaluate.py", ["compare=[none,qwm]"], ["compare=[...]", "pass checkpoint=PATH"]),
    "added_unknown_agent_key": ("train_qwm.py", ["+agent.q_wieght=5"], ["unknown key agent.q_wieght",
                                                                        "agent.q_weight?"]),
    "no_envs": ("train_qwm.py", ["env.num_envs=0"], ["env.num_envs=0: must be >= 1"]),
    "inline_envs_over_num_envs": ("train_qwm.py", ["env.inline_envs=9"], ["env.inline_envs=9: at most num_envs"]),
    "checkpoint_every_0": ("train_qwm.py", ["budget.checkpoint_every=0"], ["budget.checkpoint_every=0: must be >= 1"]),
    "batch_size_0": ("train_qwm.py", ["budget.batch_size=0"], ["budget.batch_size=0: must be >= 1"]),
    "negative_online_steps": ("train_qwm.py", ["budget.online_steps=-5"], ["budget.online_steps=-5: must be >= 0"]),
    "no_root_actions": ("train_qwm.py", ["planner.num_actions=0"], ["planner.num_actions=0: must be >= 1"]),
    "disagreement_of_one_sample": ("train_qwm.py", ["planner.uncertainty=0.1", "planner.num_samples=1"],
                                   ["planner.uncertainty=0.1: the world model's disagreement needs num_samples >= 2"]),
    "lr_not_a_number": ("train_qwm.py", ["agent.lr=fast"], ["agent.lr='fast': expected a number"]),
    "unknown_backend": ("train_qwm.py", ["env.backend=threads"], ["env.backend='threads'", "subprocess, sync, warp, ray"]),
    "empty_dataset_dir": ("train_qwm.py", ["dataset={empty}"], ["dataset={empty}: folder without .hdf5 files"]),
    "lift_dataset_for_can": ("train_qwm.py", ["task=can", "dataset={lift}"], ["recorded in Lift", "task=can",
                                                                              "pass task=lift"]),
    "libero_dataset_for_square": ("pretrain_offline.py", ["task=square", "dataset={libero}"],
                                  ["is a LIBERO file", "task=square is a robosuite task"]),
    "eval_zero_episodes": ("evaluate.py", ["episodes=0"], ["episodes=0: must be >= 1"]),
    "eval_missing_checkpoint": ("evaluate.py", ["checkpoint={empty}"], ["checkpoint={empty}: no checkpoint there"]),
    "demos_without_expert": ("collect_demos.py", ["task=tool_hang", "output=x.hdf5"], ["task.expert=None",
                                                                                       "task=lift"]),
    "libero_demos_with_failures": ("collect_demos.py", ["task=libero_object", "output=d", "keep_failures=true"],
                                   ["keep_failures=true", "task=libero_object", "robosuite task"]),
    "convert_without_input": ("convert_robosuite.py", ["output=x.hdf5"], ["input is required"]),
    "generate_for_another_task": ("generate_demos.py", ["task=can", "source={lift}", "output=x.hdf5"],
                                  ["recorded in Lift", "task=can", "pass task=lift"]),
    "generate_no_demos": ("generate_demos.py", ["source={lift}", "output=x.hdf5", "num_demos=0"],
                          ["num_demos=0: must be >= 1"]),
    "generate_without_dataset": ("train_qwm.py", ["demos.generate=10"], ["demos.generate=10", "pass dataset=FILE"]),
    "generate_from_raw_demos_of_another_task": ("train_qwm.py", ["task=can", "dataset={raw}", "demos.generate=10"],
                                                ["raw demos recorded in Lift", "task=can runs PickPlaceCan"]),
    "generate_for_image_obs": ("train_qwm.py", ["env=image", "dataset={lift}", "demos.generate=10"],
                               ["demos.generate=10 with env=image", "pass env=state"]),
    "convert_two_reexecutions": ("convert_robosuite.py", ["input=x.hdf5", "output=y.hdf5", "drop_idle=true",
                                                          "track_path=true"], ["track_path=true with drop_idle=true"]),
    "plot_not_png": ("plot_evals.py", ["evals=[{empty}]", "output=gain.jpg"], ["output=gain.jpg", "output=NAME.png"]),
    "plot_no_evaluation": ("plot_evals.py", ["evals=[{empty}]", "output=gain.png"], ["{empty} holds no eval.json"]),
}
if not torch.cuda.is_available():
    CONFIGS["cuda_without_gpu"] = ("train_qwm.py", ["device=cuda"], ["device=cuda", "no CUDA GPU", "device=cpu"])


@pytest.mark.parametrize("case", CONFIGS)
def test_bad_config_stops_before_the_run_directory_exists(tmp_path, lift_file, case):
    script, overrides, fragments = CONFIGS[case]
    paths = {"lift": lift_file, "empty": make_empty_dir(tmp_path / "empty"),
             "libero": make_libero(tmp_path / "libero.hdf5"), "raw": RAW_LIFT}
    run_dir = tmp_path / "run"
    training = [*SMOKE, f"demo_cache={tmp_path / 'demos'}"] if script in ("train_qwm.py", "pretrain_offline.py") else []
    proc = run_script(script, *training, f"hydra.run.dir={run_dir}", *[o.format(**paths) for o in overrides],
                      cwd=tmp_path)
    assert_one_line_error(proc, [f.format(**paths) for f in fragments])
    assert not run_dir.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["empty", "libero.hdf5"]


def test_evaluate_refuses_a_checkpoint_of_another_task(tmp_path):
    lift = OmegaConf.to_container(compose_config("config", ["task=lift"]), resolve=False)
    lift.pop("hydra")
    checkpoints = tmp_path / "lift_run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save({"agent": {}, "config": lift, "obs_shapes": {}, "num_tasks": 1, "phase": "offline",
                "offline_step": 10, "env_steps": 0}, checkpoints / "step_00000010.pt")
    out = tmp_path / "eval"
    proc = run_script("evaluate.py", f"checkpoint={tmp_path / 'lift_run'}", "task=can", f"hydra.run.dir={out}")
    assert_one_line_error(proc, ["task=can", "trained on task=lift", "drop task="])
    assert not out.exists()


def _truncated(path: Path) -> None:
    torch.save({"agent": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:300])  # a copy that did not finish


def _foreign(path: Path) -> None:
    torch.save({"state_dict": {"w": torch.zeros(3)}}, path)  # some other project's weights


def _pickled_numpy(path: Path) -> None:
    """The format before checkpoints were safe: every key there, the RNG state as pickled numpy."""
    torch.save({"agent": {}, "config": {}, "obs_shapes": {}, "num_tasks": 1, "phase": "offline", "offline_step": 1,
                "env_steps": 0, "rng": {"numpy": np.random.get_state()}}, path)


@pytest.mark.parametrize("write, fragments", [
    (_truncated, ["not readable (PytorchStreamReader", "truncated or corrupt"]),
    (_foreign, ["not a robo_rl checkpoint (no agent, config"]),
    (_pickled_numpy, ["written by an older robo_rl", "python scripts/upgrade_checkpoint.py"]),
], ids=["truncated", "foreign", "pickled_numpy"])
def test_evaluate_refuses_an_unsafe_or_broken_checkpoint_before_the_run_directory(tmp_path, write, fragments):
    checkpoint = tmp_path / "step_00000010.pt"
    write(checkpoint)
    out = tmp_path / "eval"
    proc = run_script("evaluate.py", f"checkpoint={checkpoint}", f"hydra.run.dir={out}")
    assert_one_line_error(proc, [f"checkpoint={checkpoint}", *fragments])
    assert not out.exists()


@pytest.mark.parametrize("override", ["agent.lr=1e10", "agent.q_weight=1e30"])
def test_diverging_updates_stop_the_run(tmp_path, lift_file, override):
    run_dir = tmp_path / "run"
    proc = run_script("pretrain_offline.py", "task=lift", f"dataset={lift_file}", override, *SMOKE,
                      f"hydra.run.dir={run_dir}", cwd=tmp_path)
    key = override.split("=")[0]
    assert_one_line_error(proc, ["10 gradient updates in a row had a non-finite loss or gradient norm",
                                 f"{key}={float(override.split('=')[1]):g}", "none changed the weights"],
                          before_work=False)  # the progress bar of the updates it did shares stderr
    assert not list(run_dir.rglob("step_*.pt")) and not (run_dir / "eval.json").exists()


# -- each update: skip and count non-finite ones, stop after too many in a row ---------------------
def test_nonfinite_update_changes_no_weight_and_is_counted():
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(max_nonfinite_updates=3))
    good = synthetic_batch(LIFT_SHAPES)
    bad = {**good, "reward": good["reward"].clone()}
    bad["reward"][5] = float("nan")
    assert agent.update(good)["nonfinite_skipped"] == 0
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    adam_steps = [float(s["step"]) for s in agent.optimizer.state.values()]
    for expected in (1, 2):
        assert agent.update(bad)["nonfinite_skipped"] == expected
    after = agent.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # online and target weights, normalization
    assert [float(s["step"]) for s in agent.optimizer.state.values()] == adam_steps
    agent.update(good)  # a finite update ends the streak but not the count
    assert agent.update(bad)["nonfinite_skipped"] == 3
    agent.update(bad)
    with pytest.raises(NonFiniteUpdateError, match="3 gradient updates in a row.*agent.lr=0.003"):
        agent.update(bad)


@pytest.mark.parametrize("setting", [{"lr": 1e10}, {"q_weight": 1e30}])
def test_extreme_settings_stop_instead_of_learning_nan_or_nothing(setting):
    torch.manual_seed(0)
    agent = SORLAgent(LIFT_SHAPES, ACTION_DIM, config=small_config(**setting))
    with pytest.raises(NonFiniteUpdateError, match=f"agent.{next(iter(setting))}="):
        for _ in range(30):
            agent.update(synthetic_batch(LIFT_SHAPES))
    assert all(torch.isfinite(p).all() for p in agent.state_dict().values() if p.is_floating_point())


# -- every preset and override the project uses still validates -------------------------------
@pytest.mark.parametrize("name, overrides", [
    *[("config", [f"budget={b}", f"task={t}"]) for b in ("smoke", "cpu", "gpu")
      for t in ("lift", "can", "square", "tool_hang", "libero_10", "libero_90")],
    ("config", ["env=image", "explore=param_noise", "agent.action_horizon=2", "train.nstep=1", "agent.q_weight=0",
                "planner=none"]),
    ("config", ["budget=smoke", "env.num_envs=2", "task.task_ids=[0,1]", "task=libero_10", "env.image_size=64",
                "budget.batch_size=16", "budget.online_steps=40", "budget.eval_episodes=1", "resume=true"]),
    ("pretrain_offline", ["task=lift"]),
    ("evaluate", ["task=lift", "policy=scripted", "episodes=3", "videos=1", "task.horizon=30"]),
    ("evaluate", ["policy=random", "planner=qwm", "agent.sample_steps=1", "agent.best_of_n=8"]),  # compare=: test_train
    ("collect_demos", ["task=can", "num_demos=50", "output=can.hdf5", "env=image", "noise=0.1"]),
    ("convert_robosuite", ["input=a.hdf5", "output=b.hdf5", "cameras=[agentview,robot0_eye_in_hand]"]),
    ("download_datasets", ["name=list"]),
])
def test_presets_and_documented_overrides_validate(name, overrides):
    validate(compose_config(name, overrides), name)


# -- the environment around the runs ----------------------------------------------------------
def test_mujoco_warnings_leave_no_log_file_in_the_working_directory(tmp_path):
    code = ("import numpy as np; from robo_rl.envs.robosuite import make_robosuite_env; "
            "from robo_rl.envs.spec import EnvSpec; "
            "env = make_robosuite_env(EnvSpec(suite='robosuite', env_name='Lift', low_dim_keys=('object',))); "
            "env.reset(); env.sim.data.qvel[:] = np.nan; env.sim.step()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[mujoco] WARNING: Nan, Inf or huge value" in proc.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_libero_imports_without_a_prompt_in_a_fresh_process(tmp_path):
    pytest.importorskip("libero")
    env = {k: v for k, v in os.environ.items() if k != "LIBERO_CONFIG_PATH"}
    env["HOME"] = str(tmp_path)  # no ~/.libero/config.yaml to fall back on
    code = "import libero.libero as l; print(l.get_libero_path('bddl_files'))"
    proc = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and "EOFError" not in proc.stderr, proc.stderr[-2000:]
    assert Path(proc.stdout.strip().splitlines()[-1]).is_dir()
