"""WarpVecEnv (MuJoCo Warp on Warp's CPU device; one test on CUDA where a GPU is present) against robosuite's own CPU env.

Kernel compilation is cached on disk (~/.cache/robo_rl/warp); a cold cache costs ~1.5-2.5 min once
(2 busy cores). All tests but the slow PickPlaceCan one use the Lift scene, so one model is compiled.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.envs.warp import WarpVecEnv  # first: configures MuJoCo's OpenGL backend before mujoco loads
from robo_rl.demos.experts import LiftExpert
from robo_rl.envs.robosuite import RobosuiteEnv
from robo_rl.envs.spec import EnvSpec

LOW_DIM = {"object": 10, "robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2}
LIFT = EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=tuple(LOW_DIM), horizon=50)
NUM_ENVS = 4
SEED = 100


def rollout_expert_on_robosuite(env: RobosuiteEnv, seeds: list[int]) -> list[tuple[bool, int]]:
    """(success, episode length) of the noiseless scripted expert, one episode per seed."""
    results = []
    for seed in seeds:
        obs, expert = env.reset(seed=seed), LiftExpert(1)
        expert.reset()
        for t in range(1, env.spec.horizon + 1):
            obs, _, terminated, truncated, success = env.step(expert.act({k: v[None] for k, v in obs.items()})[0])
            if terminated or truncated:
                break
        results.append((success, t))
    return results


@pytest.fixture(scope="module")
def env():
    env = WarpVecEnv(LIFT, NUM_ENVS, device="cpu")
    yield env
    env.close()


@pytest.fixture(scope="module")
def rs():
    env = RobosuiteEnv(LIFT)
    yield env
    env.close()


@pytest.fixture(scope="module")
def expert_rollout(env):
    return run_expert(env)


def run_expert(env: WarpVecEnv):
    """Envs 0..B-2 run the scripted expert, env B-1 holds still (so it is truncated at the horizon);
    the StepResults of `horizon` steps from a seeded reset (auto-reset on)."""
    obs = env.reset(seed=SEED)
    expert = LiftExpert(NUM_ENVS)
    expert.reset()
    first_obs, steps = obs, []
    for _ in range(LIFT.horizon):
        actions = torch.from_numpy(expert.act(obs))
        actions[-1] = 0.0
        result = env.step(actions)
        steps.append(result)
        obs = result.obs
    return first_obs, steps


def test_outputs_have_the_vecenv_shapes_dtypes_and_device(env, expert_rollout):
    first_obs, steps = expert_rollout
    for obs in (first_obs, steps[0].obs, steps[0].next_obs):
        assert set(obs) == set(LOW_DIM) | {"task_id"}
        for key, dim in LOW_DIM.items():
            assert obs[key].shape == (NUM_ENVS, dim) and obs[key].dtype == torch.float32
            assert obs[key].device == env.device == torch.device("cpu")
        assert obs["task_id"].dtype == torch.int64 and not obs["task_id"].any()
    result = steps[0]
    assert result.reward.shape == (NUM_ENVS,) and result.reward.dtype == torch.float32
    for flag in (result.terminated, result.truncated, result.success):
        assert flag.shape == (NUM_ENVS,) and flag.dtype == torch.bool
    assert env.action_dim == 7 and env.instructions == ["Lift"] * NUM_ENVS


def test_seeded_reset_reproduces_robosuites_initial_state(env, rs):
    """Same seed -> same arm noise and cube placement as RobosuiteEnv.reset(seed) (float32 rounding)."""
    np.testing.assert_allclose(env.mjm.geom_size, rs.env.sim.model.geom_size)  # same scene, same cube
    obs = env.reset(seed=SEED)
    for i in range(NUM_ENVS):
        expected = rs.reset(seed=SEED + i)
        np.testing.assert_allclose(env.get("sim_state")[i], rs.sim_state(), atol=1e-6)
        for key in LOW_DIM:
            np.testing.assert_allclose(obs[key][i].numpy(), expected[key], atol=1e-6)


def test_trajectory_follows_robosuite_for_50_steps():
    """Replay the actions of a noisy expert episode recorded on robosuite, open loop, from the same seed.

    Tolerances: before contact both integrate the same model with the same controller, MuJoCo Warp in
    float32 and MuJoCo in float64; measured divergence ~2 um, bound 0.1 mm. Once the fingers close on
    the cube the two collision pipelines disagree on the contact set (MuJoCo: up to 9 contacts from its
    box-box and mesh colliders; MuJoCo Warp: 3-7), so the held cube settles differently by millimetres
    (measured 3-7 mm over 50 steps); bound 1.5 cm (a third of the cube), and the success labels must
    agree except at most one step where the cube crosses the 4 cm line.
    """
    spec = EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=tuple(LOW_DIM), horizon=1000,
                   terminate_on_success=False)
    rs, env = RobosuiteEnv(spec), WarpVecEnv(spec, 1, autoreset=False)
    seed, steps, free_steps = 7, 50, 20
    obs_rs, expert = rs.reset(seed=seed), LiftExpert(1, noise=0.1, seed=seed)
    expert.reset()
    env.reset(seed=seed)
    eef_err, cube_err, success_rs, success_warp, travel = [], [], [], [], 0.0
    start = obs_rs["robot0_eef_pos"]
    for _ in range(steps):
        action = expert.act({k: v[None] for k, v in obs_rs.items()})
        obs_rs, _, _, _, success = rs.step(action[0])
        result = env.step(torch.from_numpy(action))
        eef_err.append(np.abs(result.obs["robot0_eef_pos"][0].numpy() - obs_rs["robot0_eef_pos"]).max())
        cube_err.append(np.abs(result.obs["object"][0, :3].numpy() - obs_rs["object"][:3]).max())
        success_rs.append(success)
        success_warp.append(bool(result.success[0]))
        travel = max(travel, np.linalg.norm(obs_rs["robot0_eef_pos"] - start))
    rs.close()
    env.close()
    eef_err, cube_err = np.array(eef_err), np.array(cube_err)
    report = (f"max |eef| error: first {free_steps} steps {eef_err[:free_steps].max():.2e} m, all {steps} "
              f"{eef_err.max():.2e} m; max |cube| error {cube_err.max():.2e} m; robosuite success at "
              f"{sum(success_rs)} steps, warp at {sum(success_warp)}")
    print(report)
    assert travel > 0.1 and sum(success_rs) > 10, "the episode must move the arm and lift the cube"
    assert eef_err[:free_steps].max() < 1e-4 and cube_err[:free_steps].max() < 1e-4, report
    assert eef_err.max() < 0.015 and cube_err.max() < 0.015, report
    assert np.sum(np.array(success_rs) != np.array(success_warp)) <= 1, report


def test_scripted_expert_succeeds_as_on_robosuite(expert_rollout, rs):
    _, steps = expert_rollout
    success = torch.stack([r.success for r in steps])  # [T, B]
    first_success = [int(success[:, i].nonzero()[0]) + 1 if success[:, i].any() else None for i in range(NUM_ENVS)]
    reference = rollout_expert_on_robosuite(rs, [SEED + i for i in range(NUM_ENVS - 1)])
    assert all(ok for ok, _ in reference)
    for i, (_, length) in enumerate(reference):
        assert first_success[i] is not None, f"env {i}: the expert never lifted the cube (robosuite: {length} steps)"
        assert abs(first_success[i] - length) <= 3, f"env {i}: {first_success[i]} steps vs robosuite {length}"
    assert first_success[-1] is None  # the idle env never lifts the cube


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device=cuda: needs a CUDA GPU")
def test_on_cuda_the_expert_succeeds_in_the_steps_it_takes_on_the_cpu(expert_rollout):
    env = WarpVecEnv(LIFT, NUM_ENVS, device="cuda")
    try:
        first_obs, steps = run_expert(env)
    finally:
        env.close()
    assert first_obs["object"].device.type == steps[-1].reward.device.type == "cuda"
    torch.testing.assert_close(first_obs["object"].cpu(), expert_rollout[0]["object"], rtol=0, atol=1e-5)

    def first_success(rollout) -> list[int | None]:
        success = torch.stack([r.success.cpu() for r in rollout])  # [T, B]
        return [int(success[:, i].nonzero()[0]) if success[:, i].any() else None for i in range(NUM_ENVS)]

    on_cpu, on_cuda = first_success(expert_rollout[1]), first_success(steps)
    assert on_cuda[-1] is None  # the idle env
    for i in range(NUM_ENVS - 1):  # float arithmetic differs between devices: a step or two either way
        assert on_cuda[i] is not None and abs(on_cuda[i] - on_cpu[i]) <= 3, (on_cpu, on_cuda)


def test_episodes_end_and_autoreset_like_the_subprocess_vecenv(env, expert_rollout, rs):
    first_obs, steps = expert_rollout
    for i in range(NUM_ENVS - 1):
        t = next(t for t, r in enumerate(steps) if r.success[i])
        r = steps[t]
        assert r.terminated[i] and not r.truncated[i] and r.reward[i] == 1.0
        assert all(s.reward[i] == 0.0 and not s.done[i] for s in steps[:t])
        # next_obs holds the lifted cube; obs the first observation of the next episode, whose seed
        # follows the per-env stream (seed + i + num_envs) of the subprocess VecEnv.
        assert r.next_obs["object"][i, 2] > env.task.lift_height > r.obs["object"][i, 2]
        expected = rs.reset(seed=SEED + i + NUM_ENVS)
        np.testing.assert_allclose(r.obs["object"][i].numpy(), expected["object"], atol=1e-6)
    idle = NUM_ENVS - 1
    assert [bool(r.truncated[idle]) for r in steps] == [False] * (LIFT.horizon - 1) + [True]
    assert not any(r.terminated[idle] or r.reward[idle] for r in steps)
    expected = rs.reset(seed=SEED + idle + NUM_ENVS)
    np.testing.assert_allclose(steps[-1].obs["object"][idle].numpy(), expected["object"], atol=1e-6)


def test_inactive_envs_are_not_stepped(env):
    obs = env.reset(seed=SEED)
    before = env.get("sim_state")
    active = np.array([True, False] * (NUM_ENVS // 2))
    result = env.step(torch.ones(NUM_ENVS, 7), active=active)
    after = env.get("sim_state")
    for i in range(NUM_ENVS):
        if active[i]:
            assert not np.array_equal(before[i], after[i])
            assert not torch.equal(result.obs["robot0_eef_pos"][i], obs["robot0_eef_pos"][i])
        else:
            assert np.array_equal(before[i], after[i])
            assert all(torch.equal(result.obs[k][i], obs[k][i]) for k in LOW_DIM)
            assert result.reward[i] == 0.0 and not result.done[i]


def test_reset_to_a_stored_state(env, rs):
    rs.reset(seed=3)
    for _ in range(5):
        rs.step(np.array([0.5, -0.3, 0.2, 0.0, 0.0, 0.1, 1.0]))
    state = rs.sim_state()
    obs = env.reset_envs([2], options=[{"state": state}])
    np.testing.assert_allclose(env.get("sim_state")[2], state, atol=1e-6)
    expected = rs.set_sim_state(state)  # robosuite's raw observation after set_state + forward
    for key in LOW_DIM:
        np.testing.assert_allclose(obs[key][2].numpy(), expected[key.replace("object", "object-state")], atol=1e-5)


def test_bad_inputs_raise_clear_errors(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="actions must have shape"):
        env.step(torch.zeros(NUM_ENVS + 1, 7))
    with pytest.raises(ValueError, match="env.backend=warp supports"):
        WarpVecEnv(EnvSpec(suite="robosuite", env_name="ToolHang", low_dim_keys=("object",)), 1)
    with pytest.raises(ValueError, match="cannot observe"):
        WarpVecEnv(EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=("robot0_gripper_force",)), 1)


def test_batched_camera_images_match_mujocos_renderer():
    """Ray-traced observations vs MuJoCo's OpenGL renderer on the same state.

    The two shade differently (the ray tracer: Lambert + hemispheric ambient light, no specular or
    headlight; OpenGL: headlight, specular, mipmapped textures), so pixels differ by ~12-16/255 on
    average; bound 25. A wrong camera, flip or pose shows up far above that: against the vertically
    flipped frame the error is ~65. The cube's pixel centroid must agree to 1.5 px (measured < 1 px;
    another world's cube sits 5-10 px away).
    """
    spec = EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=("object",),
                   rgb_keys=("agentview_image", "robot0_eye_in_hand_image"), image_size=84)
    env = WarpVecEnv(spec, 2)
    obs = env.reset(seed=0)
    for key in spec.rgb_keys:
        assert obs[key].shape == (2, 3, 84, 84) and obs[key].dtype == torch.uint8
        frames = env.render(camera=key.removesuffix("_image"), size=84)  # [2, H, W, 3] OpenGL
        assert frames.shape == (2, 84, 84, 3) and frames.dtype == np.uint8
        traced = obs[key].permute(0, 2, 3, 1).numpy().astype(int)
        error = np.abs(traced[0] - frames[0]).mean()
        assert error < 25 and error < 0.5 * np.abs(traced[0] - frames[0][::-1]).mean(), f"{key}: {error:.1f}"
        own = np.linalg.norm(_red_centroid(traced[0]) - _red_centroid(frames[0]))
        other = np.linalg.norm(_red_centroid(traced[0]) - _red_centroid(frames[1]))
        assert own < 1.5 < other, f"{key}: cube centroid off by {own:.2f} px (other world: {other:.2f} px)"
    result = env.step(torch.zeros(2, 7))
    assert result.obs["agentview_image"].shape == (2, 3, 84, 84)
    env.close()


def _red_centroid(image: np.ndarray) -> np.ndarray:
    """Pixel centroid [2] of the red cube in an [H, W, 3] image."""
    image = image.astype(int)
    mask = (image[..., 0] > 100) & (image[..., 1] < 80) & (image[..., 2] < 80)
    assert mask.sum() > 10, "the cube is not in view"
    return np.argwhere(mask).mean(0)


@pytest.mark.slow  # a second scene: MuJoCo Warp specialises kernels per model (+30 s warm, +60 s cold)
def test_pick_place_can_follows_robosuite():
    """Can: same seeded reset (four objects placed with rejection, three cleared away), a 30-step
    random-action trajectory within float32 rounding (no grasp, so no contact-set differences: bound
    0.1 mm, measured ~1 um for the arm, ~5 um for the can resting in its bin), the 14-d object
    observation (can pose in the gripper frame) and the bin success test on a can dropped into the bin."""
    keys = ("object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")
    spec = EnvSpec(suite="robosuite", env_name="PickPlaceCan", low_dim_keys=keys, horizon=400)
    rs, env = RobosuiteEnv(spec), WarpVecEnv(spec, 1, autoreset=False)
    expected, obs = rs.reset(seed=5), env.reset(seed=5)
    np.testing.assert_allclose(env.get("sim_state")[0], rs.sim_state(), atol=1e-6)
    for key in keys:
        np.testing.assert_allclose(obs[key][0].numpy(), expected[key], atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = rng.uniform(-1, 1, (1, 7)).astype(np.float32)
        expected, *_ = rs.step(action[0])
        obs = env.step(torch.from_numpy(action)).obs
        np.testing.assert_allclose(obs["robot0_eef_pos"][0].numpy(), expected["robot0_eef_pos"], atol=1e-4)
        np.testing.assert_allclose(obs["object"][0].numpy(), expected["object"], atol=2e-3)  # quats: 0.1 deg
        np.testing.assert_allclose(obs["object"][0, :3].numpy(), expected["object"][:3], atol=1e-4)

    task = env.task
    can = 1 + task.object_qpos[task.obj_name]
    centre = (task.bin_low + task.bin_high) / 2
    for height, in_bin in ((0.05, True), (0.3, False)):
        state = rs.sim_state().copy()
        state[can : can + 3] = [centre[0], centre[1], task.bin_z + height]
        rs.set_sim_state(state)
        env.reset(options=[{"state": state}])
        _, _, _, _, success = rs.step(np.zeros(7))
        assert success == in_bin == bool(env.step(torch.zeros(1, 7)).success[0])
    rs.close()
    env.close()
