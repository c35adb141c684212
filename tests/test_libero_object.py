"""LIBERO-Object without a download: the scripted expert on the protocol's init states, and env=state's
observation (object poses + proprio) on a real LIBERO env."""
import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from robo_rl.demos.experts import LiberoObjectExpert
from robo_rl.envs import env_spec
from robo_rl.envs.libero import OBJECT_OBS_DIM, split_object_obs
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.rollout import evaluate_actors
from test_bad_inputs import ROOT


def libero_object_state_spec() -> EnvSpec:
    """env=state of task=libero_object, as the config composes it."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=["task=libero_object", "env=state"])
    return env_spec(cfg)


@pytest.mark.slow  # a LIBERO scene build: 42 s on the shared 2 cores
def test_state_variant_observes_object_poses_and_proprio():
    spec = libero_object_state_spec()
    assert spec.low_dim_keys == ("object", "joint_states", "gripper_states", "ee_states") and spec.rgb_keys == ()
    with VecEnv(spec, 1, workers="sync", autoreset=False) as env:
        obs = env.reset(options=[{"task_id": 6, "init_state_id": 0}])  # "pick up the butter ..."
        libero = env.workers[0].runner.env._robosuite_env
        shapes = {k: tuple(v.shape[1:]) for k, v in obs.items()}
        assert shapes == {"object": (OBJECT_OBS_DIM,), "joint_states": (7,), "gripper_states": (2,), "ee_states": (6,),
                          "task_id": ()}
        objects, regions, joints = split_object_obs(obs["object"].numpy())
        slots = objects[0]
        eef = obs["ee_states"][0, :3].numpy()
        for slot, name in zip(slots, ["butter_1", "basket_1"]):  # the BDDL's objects of interest, in order
            body = libero.obj_body_id[name]
            np.testing.assert_allclose(slot[:3], libero.sim.data.body_xpos[body], atol=1e-6)
            np.testing.assert_allclose(slot[3:7], libero.sim.data.body_xquat[body][[1, 2, 3, 0]], atol=1e-6)
            np.testing.assert_allclose(slot[7:], slot[:3] - eef, atol=1e-6)
        assert not slots[2:].any()  # unused slots stay zero
        # The goal's region (In butter_1 basket_1_contain_region); no articulated part.
        basket = libero.sim.data.get_site_xpos("basket_1_contain_region")
        np.testing.assert_allclose(regions[0, 0], np.concatenate([basket, basket - eef]), atol=1e-6)
        assert not regions[0, 1:].any() and not joints.any()


@pytest.mark.slow  # 100 s on the shared 2 cores (load 11), most of it waiting for a core
def test_libero_object_expert_succeeds_from_the_protocols_init_states():
    # Two of the ten items, a short box and a tall bottle, each from init states 0 and 1; no noise.
    spec = EnvSpec(suite="libero", env_name="libero_object", low_dim_keys=LiberoObjectExpert.obs_keys,
                   horizon=280, task_ids=(6, 4))
    with VecEnv(spec, 1, workers="sync", autoreset=False) as env:
        result = evaluate_actors(env, {"expert": LiberoObjectExpert(1)}, episodes=4, progress=False)
    episodes = result["actors"]["expert"]["per_episode"]
    assert sorted((e["task_id"], e["init_state_id"]) for e in episodes) == [(4, 0), (4, 1), (6, 0), (6, 1)]
    assert all(e["success"] for e in episodes), [(e["task_id"], e["init_state_id"], e["length"]) for e in episodes]
