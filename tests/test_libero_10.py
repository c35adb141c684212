"""LIBERO-10's scripted expert on real LIBERO envs: the skills each task's goal asks for, env=state's goal regions and
articulated joints against the simulator, the expert on the protocol's init states, and its demos as LIBERO files."""
import dataclasses

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from robo_rl.core import ACTION_DIM
from robo_rl.data.hdf5 import read_hdf5
from robo_rl.demos.collect import collect_libero_demos
from robo_rl.demos.experts import EXPERTS
from robo_rl.demos.libero_tasks import plan
from robo_rl.envs import env_spec
from robo_rl.envs.libero import NOOP_ACTION, OBJECT_OBS_DIM, split_object_obs, task_problem
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.rollout import evaluate_actors
from test_bad_inputs import ROOT


def libero_10_state_spec() -> EnvSpec:
    """env=state of task=libero_10, as the config composes it."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=["task=libero_10", "env=state"])
    return env_spec(cfg)


def test_each_tasks_skills_are_read_from_its_goal():
    rng = np.random.default_rng(0)
    skills = {t: [type(make(rng)).__name__.removesuffix("Skill") for make in plan(task_problem("libero_10", t))]
              for t in range(10)}
    pick = "PickPlace"
    assert skills == {
        0: [pick, pick], 1: [pick, pick], 7: [pick, pick],  # two items into the basket
        2: ["TwistKnob", pick],                             # turn on the stove, then the moka pot onto it
        3: [pick, "PushClosed"], 9: [pick, "PushClosed"],   # into the drawer / microwave, then close it
        4: [pick, pick], 6: [pick, pick],                   # mugs onto plates, the pudding right of the plate
        5: [pick],                                          # the book into the caddy
        8: ["TwistKnob", pick, pick],                       # the stove is on already: its knob is left alone
    }


@pytest.mark.slow  # a LIBERO scene build: 23 s on the shared 2 cores
def test_state_variant_observes_goal_regions_and_articulated_joints():
    spec = libero_10_state_spec()
    with VecEnv(spec, 1, workers="sync", autoreset=False) as env:
        obs = env.reset(options=[{"task_id": 3, "init_state_id": 0}])  # the bowl into the bottom drawer, close it
        libero = env.workers[0].runner.env._robosuite_env
        assert obs["object"].shape == (1, OBJECT_OBS_DIM)
        assert libero.sim.model._model.narena == 64 * 2**20  # MUJOCO_ARENA, not robosuite's 1.26 GB
        assert libero.sim._render_context_offscreen is None  # state obs, no video: no renderer, ~0.5 GB less
        sim, address = libero.sim, libero.sim.model.get_joint_qpos_addr("white_cabinet_1_bottom_level")
        sim.data.qpos[address] = -0.05  # part-closed: the region rides on the drawer, the joint reads it
        sim.forward()
        obs = env.step(NOOP_ACTION[None]).obs
        _, regions, joints = split_object_obs(obs["object"].numpy())
        eef = obs["ee_states"][0, :3].numpy()
        region = sim.data.get_site_xpos("white_cabinet_1_bottom_region")
        np.testing.assert_allclose(regions[0, 0], np.concatenate([region, region - eef]), atol=1e-6)
        np.testing.assert_allclose(joints[0], [sim.data.qpos[address], 0.0], atol=1e-6)
        assert abs(joints[0, 0] + 0.05) < 0.01 and not regions[0, 1].any()


@pytest.mark.slow  # three scene builds and ~600 steps: 37 s on the shared 2 cores
def test_expert_succeeds_from_the_protocols_init_states():
    # Init state 0 of a two-item basket task, of "turn on the stove and put the moka pot on it" and of the drawer
    # task; no noise, as scripts/evaluate.py policy=scripted runs it.
    spec = EnvSpec(suite="libero", env_name="libero_10", low_dim_keys=EXPERTS["libero_10"](1).obs_keys, horizon=520,
                   task_ids=(0, 2, 3))
    with VecEnv(spec, 1, workers="sync", autoreset=False) as env:
        result = evaluate_actors(env, {"expert": EXPERTS["libero_10"](1)}, episodes=3, progress=False)
    episodes = result["actors"]["expert"]["per_episode"]
    assert sorted((e["task_id"], e["init_state_id"]) for e in episodes) == [(0, 0), (2, 0), (3, 0)]
    assert all(e["success"] for e in episodes), [(e["task_id"], e["length"]) for e in episodes]


@pytest.mark.slow  # a scene build in a worker and a ~100-step demo: 19 s on the shared 2 cores
def test_collected_demos_are_libero_files(tmp_path):
    # The book into the caddy: the shortest task; random placements (env seeds), the default demo noise.
    spec = dataclasses.replace(libero_10_state_spec(), task_ids=(5,))
    [path] = collect_libero_demos(spec, "libero_10", num_demos=1, folder=tmp_path, noise=0.1, num_envs=1)
    assert path.name == "STUDY_SCENE1_pick_up_the_book_and_place_it_in_the_back_compartment_of_the_caddy_demo.hdf5"
    data = read_hdf5(path, obs_keys=list(spec.low_dim_keys), action_dim=ACTION_DIM, task_id=5,
                     normalized_actions=True)
    [demo] = data.episodes
    assert data.format == "libero" and 0 < data.attrs["expert_success_rate"] <= 1
    assert demo.obs["object"].shape[1:] == (OBJECT_OBS_DIM,) and demo.terminals[-1]
    assert demo.instruction == "pick up the book and place it in the back compartment of the caddy"
