"""The simulator oracle on a real Lift env: restored states replay exactly, and true values order
a known-good action above a known-bad one; an episode started at a mid-demo state keeps its grasp."""
import numpy as np
import pytest

from robo_rl.demos.experts import LiftExpert
from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import VecEnv
from robo_rl.eval.oracle import VisitedState, action_values, candidate_spread, cross_validated_best, visit_states
from tests.conftest import LIFT_STATE_KEYS

SPEC = EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=LIFT_STATE_KEYS, horizon=100)


def expert_episode(env: VecEnv, seed: int):
    """One scripted Lift episode: snapshots before each step, actions [T, A], eef positions after each
    step, and the step at which the expert starts lifting the grasped cube."""
    expert = LiftExpert(1, noise=0.0, seed=0)
    expert.reset()
    obs = env.reset(seed=seed)
    states, actions, eef, lift_start = [], [], [], None
    while True:
        states.append(env.get("snapshot")[0])
        actions.append(expert.act(obs)[0])
        if lift_start is None and expert.phase[0] == LiftExpert.LIFT:
            lift_start = len(actions) - 1
        result = env.step(actions[-1][None])
        obs = result.obs
        eef.append(obs["robot0_eef_pos"][0].numpy())
        if bool(result.done[0]):
            return states, np.stack(actions), np.stack(eef), bool(result.success[0]), lift_start


@pytest.fixture(scope="module")
def env():
    with VecEnv(SPEC, 1, workers="sync", autoreset=False) as env:
        yield env


@pytest.fixture(scope="module")
def episode(env):
    states, actions, eef, success, lift_start = expert_episode(env, seed=3)
    assert success and lift_start is not None, "the scripted expert should grasp and lift the cube"
    return states, actions, eef, lift_start


def test_restored_state_replays_the_same_trajectory(env, episode):
    states, actions, eef, _ = episode
    t = len(actions) // 2
    env.reset_envs([0], options=[{"snapshot": states[t]}])
    for k in range(t, len(actions)):
        result = env.step(actions[k][None])
        # Without the state robosuite keeps outside MuJoCo the first step is already ~1 cm off; what is
        # left is contact-solver round-off (~0.1 mm over a grasp).
        np.testing.assert_allclose(result.obs["robot0_eef_pos"][0].numpy(), eef[k], atol=1e-3)
    assert bool(result.success[0]) and bool(result.done[0])


def test_an_episode_started_mid_demo_keeps_the_grasp(env, episode):
    """At the grasp, an episode started from the MuJoCo state alone inherits the previous episode's integrated
    gripper command (here: open), so the fingers let go while the arm lifts; started mid-demo with the
    demo's gripper command it lifts the cube."""
    states, _, _, t = episode
    lift = np.array([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    let_go = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]], dtype=np.float32)
    outcomes = []
    for options in ({"state": states[t]["sim"]}, {"demo_state": states[t]["sim"], "gripper_command": 1.0}):
        env.reset_envs([0], seed=5)
        for _ in range(20):
            env.step(let_go)
        env.reset_envs([0], options=[options])
        for _ in range(40):
            result = env.step(lift)
            if bool(result.done[0]):
                break
        outcomes.append(bool(result.success[0]))
    assert outcomes == [False, True]


def test_true_value_orders_lifting_above_dropping(env, episode):
    """At the grasp, lifting with the gripper closed succeeds; letting go first (the fingers take ~8 steps
    to open) leaves the cube on the table for a policy that then lifts with the gripper closing."""
    states, _, _, t = episode
    lift = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    let_go = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]
    candidates = np.array([[lift * 10, let_go * 10]], dtype=np.float32)  # [S=1, N=2, 10 steps x A]: chunks
    visited = [VisitedState(states[t], {}, t, 0.0, True, [], np.zeros((0, 7)))]
    keep_lifting = ConstantPolicy(np.array(lift, dtype=np.float32))
    runs = action_values(env, visited, candidates, keep_lifting, rollouts=2, gamma=0.99)
    success, returns = (x.mean(-1) for x in runs)  # [S, N, R] -> [S, N]
    assert success[0, 0] == 1.0 and returns[0, 0] > 0.9
    assert success[0, 1] == 0.0 and returns[0, 1] == 0.0


class ConstantPolicy:
    def __init__(self, action: np.ndarray):
        self.action = action

    def act(self, obs) -> np.ndarray:
        return np.tile(self.action, (len(obs["task_id"]), 1))


def test_visit_states_spreads_over_episodes(env):
    expert = LiftExpert(1, noise=0.0, seed=0)
    visited = visit_states(env, expert, num_states=6, seed=0, gamma=0.99, depth=2, per_episode=3)
    assert len(visited) == 6
    assert [v.t for v in visited[:3]][0] == 0 and visited[2].t > visited[1].t > 0
    for v in visited:
        assert 0.0 <= v.mc_return <= 1.0 and len(v.future_obs) == len(v.future_actions) <= 2
        assert v.success == (v.mc_return > 0)


def test_candidate_spread_separates_candidates_from_rollout_noise():
    # two candidates, 4 rollouts each: always vs never, their true values 1 and 0 (sd 0.707 with ddof 1)
    apart = candidate_spread(np.array([[[1, 1, 1, 1], [0, 0, 0, 0]]], dtype=float))
    assert apart == pytest.approx({"between_sd": np.sqrt(0.5), "within_sd": 0.0, "states_all_equal": 0})
    # the same coin flips for both: MS_between 0, MS_within 1/3, so the between part (−1/12) clips to 0
    alike = candidate_spread(np.array([[[1, 0, 1, 0], [1, 0, 1, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]]], dtype=float))
    assert alike == pytest.approx({"between_sd": 0.0, "within_sd": np.sqrt(1 / 6), "states_all_equal": 1})


def test_cross_validated_best_values_the_pick_on_rollouts_that_did_not_choose_it():
    outcomes = np.array([[[1, 1, 0, 0], [0, 0, 1, 1]],  # first halves pick candidate 0, whose second half is 0
                         [[0, 1, 1, 1], [1, 1, 0, 1]]], dtype=float)  # they pick candidate 1: second half 0.5
    assert cross_validated_best(outcomes) == pytest.approx(0.25)
    assert outcomes.mean(2).max(1).mean() == pytest.approx(0.625)  # the naive best, optimistic
