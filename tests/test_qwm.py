"""QWM search: lookahead finds what a myopic critic misses; the batched search equals the tree walk."""
import pytest
import torch
from einops import rearrange, repeat
from torch import nn

from robo_rl.agents.world_model import LatentWorldModel
from robo_rl.planning.qwm import QWMConfig, QWMPlanner, plan_reference
from robo_rl.utils.precision import auto_bf16

# -- a cliff world with exact dynamics and a critic that cannot see the cliff coming -------------
CLIFF_EDGE, FALLEN_VALUE = 0.5, -10.0


def cliff_next(z, a, num_samples):
    """z = (x, fallen). x moves by a; from beyond the edge every action falls. Exact: K equal samples."""
    x, fallen = z.unbind(-1)
    z_next = torch.stack([x + a[:, 0], torch.maximum(fallen, (x > CLIFF_EDGE).float())], dim=-1)
    return repeat(z_next, "m z -> m k z", k=num_samples)


def myopic_q(z, a):
    """Moving right always looks good to this critic, until it has fallen."""
    x, fallen = z.unbind(-1)
    return torch.where(fallen > 0, FALLEN_VALUE, x + a[:, 0])


def uniform_policy(seed):
    generator = torch.Generator().manual_seed(seed)
    return lambda z: torch.rand(z.shape[0], 1, generator=generator) * 2 - 1


def test_two_step_lookahead_avoids_the_cliff_the_critic_walks_into():
    z = torch.zeros(4, 2)  # 4 envs at x = 0, not fallen
    chosen = {}
    for depth in (0, 1, 2):
        planner = QWMPlanner(QWMConfig(num_actions=16, depth=depth, uncertainty=0.0))
        action, info = planner.plan(z, uniform_policy(seed=0), myopic_q, cliff_next)
        chosen[depth] = action[:, 0]
    candidates = info["candidates"][..., 0]  # the same 16 root actions per env at every depth (same seed)
    assert (candidates > CLIFF_EDGE).any(1).all() and ((candidates > 0) & (candidates <= CLIFF_EDGE)).any(1).all()

    # Greedy on Q takes the biggest step; one step of lookahead still sees only good states past the edge.
    assert torch.equal(chosen[0], candidates.max(1).values)
    assert (chosen[1] > CLIFF_EDGE).all()
    # Two steps see the fall that follows every step past the edge and choose a safe step forward.
    assert ((chosen[2] > 0) & (chosen[2] <= CLIFF_EDGE)).all()
    # Scoring by the tree value alone (root_weight 0) steps forward safely too.
    action, _ = QWMPlanner(QWMConfig(num_actions=16, depth=2, root_weight=0.0)).plan(z, uniform_policy(seed=0), myopic_q, cliff_next)
    assert ((action[:, 0] > 0) & (action[:, 0] <= CLIFF_EDGE)).all()


def fog_next(z, a, num_samples):
    """x moves by a; past the edge the world model has seen no data and its K samples disagree."""
    x_next = z[:, 0] + a[:, 0]  # [M]
    spread = (x_next > CLIFF_EDGE).float()[:, None] * torch.linspace(-1, 1, num_samples)  # [M, K]
    return torch.stack([x_next[:, None] + spread, torch.zeros_like(spread)], -1)  # [M, K, 2]


def test_uncertainty_cost_keeps_the_pick_where_the_world_model_agrees():
    z = torch.zeros(4, 2)
    picks = {}
    for beta in (0.0, 1.0):
        planner = QWMPlanner(QWMConfig(num_actions=16, depth=1, uncertainty=beta, precision="fp32"))
        action, info = planner.plan(z, uniform_policy(seed=0), myopic_q, fog_next)
        picks[beta] = action[:, 0]
    candidates = info["candidates"][..., 0]
    assert ((candidates > CLIFF_EDGE).any(1) & (candidates <= CLIFF_EDGE).any(1)).all()
    disagreement = info["disagreement"]
    assert torch.equal(disagreement > 0, candidates > CLIFF_EDGE)  # the heads disagree past the edge only
    assert (picks[0.0] > CLIFF_EDGE).all()  # the critic alone steps into the fog
    assert (picks[1.0] <= CLIFF_EDGE).all()  # the cost keeps every env where the model knows the outcome


# -- the batched search against the literal tree walk --------------------------------------------
LATENT, ACTION = 6, 2


class InputSeededPolicy:
    """A stochastic-looking policy whose noise is a fixed function of its input row: the latent and
    how many earlier rows of the same call hold the same latent. Both search versions therefore get
    the same N different root actions and the same probes, however they batch their calls."""

    def __init__(self):
        self.net = nn.Sequential(nn.Linear(LATENT, 32), nn.Tanh(), nn.Linear(32, ACTION))
        self.frequency = torch.randn(LATENT, ACTION) * 3
        self.phase = torch.randn(ACTION)

    def __call__(self, z):
        occurrence = (z[:, None] == z[None]).all(-1).tril(-1).sum(1)  # earlier identical rows
        noise = torch.sin(z @ self.frequency + 1.7 * occurrence[:, None] + self.phase)
        return torch.tanh(self.net(z) + noise)


SMALL_TREE = dict(num_actions=4, num_samples=3, leaf_actions=3, lam=0.5)


@pytest.mark.parametrize(
    "settings, with_heads",
    [(SMALL_TREE | dict(depth=0), True), (SMALL_TREE | dict(depth=1), True), (SMALL_TREE | dict(depth=2), True),
     (SMALL_TREE | dict(depth=3, beam=2), True), (SMALL_TREE | dict(depth=2, beam=3), True),
     (SMALL_TREE | dict(depth=2, beam=2), False),
     (SMALL_TREE | dict(depth=2, support=0.5, drift_decay=None), True),  # the trust region alone
     ({}, False),  # conf/planner/qwm.yaml's defaults: the drift guard on, against a drift ℓ already built up
     (dict(num_samples=1, drift_decay=None), False)],  # planner=qwm_paper: one path per root action
    ids=["d0", "d1", "d2", "d3-j2", "d2-j3", "no-heads", "support", "defaults", "paper"],
)
def test_batched_search_equals_reference_tree_walk(settings, with_heads):
    torch.manual_seed(len(str(settings)))
    # fp32: the reference walk runs without autocast (precision="auto" is bf16 on AMX and AVX512-BF16 CPUs)
    cfg = QWMConfig(**settings, precision="fp32")
    pi = InputSeededPolicy()
    critic = nn.Sequential(nn.Linear(LATENT + ACTION, 32), nn.Tanh(), nn.Linear(32, 1))
    model = LatentWorldModel(LATENT, ACTION, num_heads=cfg.num_samples, hidden_dim=32, reward=True, termination=True)

    def q(z, a):
        return critic(torch.cat([z, a], -1)).squeeze(-1)

    def every_head(z, a, num_samples):  # deterministic K samples: head k gives sample k
        assert num_samples == model.num_heads
        return rearrange(model.dynamics(z, a), "e m z -> m e z")

    heads = dict(reward=model.reward, terminal=model.terminal) if with_heads else {}
    z = torch.randn(6, LATENT)
    drift = torch.randn(6, ACTION) * 3 if cfg.drift_decay is not None else None
    with torch.no_grad():
        action, info = QWMPlanner(cfg).plan(z, pi, q, every_head, drift=drift, **heads)
        ref_action, ref_info = plan_reference(cfg, z, pi, q, every_head, drift=drift, **heads)

    torch.testing.assert_close(info["scores"], ref_info["scores"], atol=1e-5, rtol=1e-5)
    assert torch.equal(info["index"], ref_info["index"])
    torch.testing.assert_close(action, ref_action)
    if cfg.drift_decay is not None:
        torch.testing.assert_close(info["drift"], ref_info["drift"])
    # Guard against a vacuous pass: the candidates differ, and so do their scores; where the guard or the trust
    # region is on, it overrules the scores' argmax somewhere.
    assert info["candidates"].std(1).min() > 1e-3 and info["scores"].std(1).min() > 1e-4
    if cfg.drift_decay is not None or cfg.support < 1:
        assert (info["index"] != info["scores"].argmax(1)).any()


def test_softmax_selection_draws_in_proportion_to_exp_score():
    num_envs, N = 4000, 4
    grid = torch.linspace(-1, 1, N)

    def fixed_candidates(z):  # every env gets the same N candidates; with depth 0 the scores are Q = a
        return repeat(grid, "n -> (m n) 1", m=z.shape[0] // N)

    cfg = QWMConfig(num_actions=N, depth=0, selection="softmax", temperature=0.5)
    z = torch.zeros(num_envs, 2)

    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        return QWMPlanner(cfg).plan(z, fixed_candidates, myopic_q, cliff_next, generator=generator)[1]["index"]

    index = draw(seed=1)
    frequency = torch.bincount(index, minlength=N).float() / num_envs
    torch.testing.assert_close(frequency, torch.softmax(grid / 0.5, 0), atol=0.03, rtol=0)
    assert torch.equal(index, draw(seed=1)) and not torch.equal(index, draw(seed=2))


def test_drift_guard_stops_a_critic_from_leaning_the_same_way_at_every_state():
    # myopic_q prefers the largest step right at every state: an argmax over fresh policy samples leans right
    # each time, and the leans add up. The guard lets a pick lean right again only once the sum has decayed.
    z, steps = torch.zeros(8, 2), 60
    leans = {}
    for decay in (None, 0.9):
        planner = QWMPlanner(QWMConfig(num_actions=16, depth=0, drift_decay=decay, precision="fp32"))
        pi, drift, picked = uniform_policy(seed=0), None, []
        for _ in range(steps):
            _, info = planner.plan(z, pi, myopic_q, cliff_next, drift=drift)
            candidates = info["candidates"][..., 0]  # [B, N]
            deviation = (candidates - candidates.mean(1, keepdim=True)) / candidates.std(1, keepdim=True, correction=0)
            pick = deviation.gather(1, info["index"][:, None]).squeeze(1)
            if decay is not None:
                # the best-scored candidate that does not lean the way the sum so far does (all at the start)
                eligible = deviation * (0.0 if drift is None else drift) <= 0
                best = candidates.masked_fill(~eligible, -torch.inf).argmax(1)
                assert torch.equal(info["index"], best)
                torch.testing.assert_close(info["drift"][:, 0], pick + decay * (0.0 if drift is None else drift[:, 0]))
                drift = info["drift"]
            picked.append(pick)
        leans[decay] = torch.stack(picked).mean(0)  # [B]: each env's mean lean per decision, in std units
    assert (leans[None] > 1.0).all()  # the best of 16 sits ~1.7 std right of the candidates' mean, every time
    assert (leans[0.9].abs() < 0.3).all()  # guarded: the leans cancel over the episode
    with pytest.raises(ValueError, match="drift_decay"):
        QWMConfig(drift_decay=1.0)


def test_random_selection_is_the_guard_alone_a_uniform_draw_among_eligible_candidates():
    # selection="random" ignores the scores (myopic_q would always take the largest step) and draws uniformly
    # among the candidates the guard lets through: with a lean to the right, exactly those left of the mean.
    num_envs, N = 4000, 4
    grid = torch.linspace(-1, 1, N)  # deviations from the mean: two left, two right

    def fixed_candidates(z):
        return repeat(grid, "n -> (m n) 1", m=z.shape[0] // N)

    planner = QWMPlanner(QWMConfig(num_actions=N, depth=0, selection="random", drift_decay=0.9))
    lean = torch.ones(num_envs, 1)  # every env's picks so far leaned right
    generator = torch.Generator().manual_seed(0)
    _, info = planner.plan(torch.zeros(num_envs, 2), fixed_candidates, myopic_q, cliff_next, generator=generator,
                           drift=lean)
    frequency = torch.bincount(info["index"], minlength=N).float() / num_envs
    torch.testing.assert_close(frequency, torch.tensor([0.5, 0.5, 0.0, 0.0]), atol=0.03, rtol=0)
    _, info = planner.plan(torch.zeros(num_envs, 2), fixed_candidates, myopic_q, cliff_next, generator=generator)
    frequency = torch.bincount(info["index"], minlength=N).float() / num_envs  # no lean yet: all eligible
    torch.testing.assert_close(frequency, torch.full((N,), 0.25), atol=0.03, rtol=0)


def test_support_keeps_the_pick_among_the_candidates_nearest_their_mean():
    # myopic_q prefers the largest step; with support=0.5 only the 4 of 8 candidates nearest their mean may be
    # picked, so the pick is the largest of those, not the outlier on the right.
    num_envs, N = 3, 8
    grid = torch.tensor([-1.0, -0.6, -0.3, -0.1, 0.0, 0.2, 0.4, 2.0])  # mean 0.075: nearest 0.0, 0.2, -0.1, 0.4

    def fixed_candidates(z):
        return repeat(grid, "n -> (m n) 1", m=z.shape[0] // N)

    z = torch.zeros(num_envs, 2)
    picks = {s: QWMPlanner(QWMConfig(num_actions=N, depth=0, support=s)).plan(z, fixed_candidates, myopic_q,
                                                                               cliff_next)[0]
             for s in (1.0, 0.5)}
    assert (picks[1.0][:, 0] == 2.0).all() and (picks[0.5][:, 0] == 0.4).all()
    # with the drift guard as well, both must hold: leaning right, only the central ones left of the mean remain
    _, info = QWMPlanner(QWMConfig(num_actions=N, depth=0, support=0.5, drift_decay=0.9)).plan(
        z, fixed_candidates, myopic_q, cliff_next, drift=torch.ones(num_envs, 1))
    assert (info["candidates"][torch.arange(num_envs), info["index"], 0] == 0.0).all()
    with pytest.raises(ValueError, match="support"):
        QWMConfig(support=0.0)


def test_planner_runs_on_the_world_model_and_names_bad_inputs():
    model = LatentWorldModel(LATENT, ACTION, num_heads=4, hidden_dim=16, reward=True)
    pi = InputSeededPolicy()

    def q(z, a):
        return (z.sum(-1) + a.sum(-1)).tanh()

    action, info = QWMPlanner(QWMConfig(num_actions=3, num_samples=5, depth=2)).plan(
        torch.randn(2, LATENT), pi, q, model.next, reward=model.reward
    )
    assert action.shape == (2, ACTION) and info["scores"].shape == (2, 3) and info["tree_value"].shape == (2, 3)

    with pytest.raises(ValueError, match="q\\(z, a\\) must return one value per row"):
        QWMPlanner().plan(torch.randn(2, LATENT), pi, lambda z, a: q(z, a)[:, None], model.next)
    with pytest.raises(ValueError, match="beam"):
        QWMConfig(beam=9, num_samples=8)
    with pytest.raises(ValueError, match="selection"):
        QWMConfig(selection="max")


def test_bf16_search_scores_track_fp32():
    torch.manual_seed(0)
    cfg = QWMConfig(num_actions=4, num_samples=3, depth=2, leaf_actions=3, precision="fp32")
    pi = InputSeededPolicy()
    critic = nn.Sequential(nn.Linear(LATENT + ACTION, 32), nn.Tanh(), nn.Linear(32, 1))
    model = LatentWorldModel(LATENT, ACTION, num_heads=cfg.num_samples, hidden_dim=32)

    def q(z, a):
        return critic(torch.cat([z, a], -1)).squeeze(-1)

    def every_head(z, a, num_samples):
        return rearrange(model.dynamics(z, a), "e m z -> m e z")

    z = torch.randn(5, LATENT)
    with torch.no_grad():
        _, full = QWMPlanner(cfg).plan(z, pi, q, every_head)
        action, half = QWMPlanner(QWMConfig(**{**cfg.__dict__, "precision": "bf16"})).plan(z, pi, q, every_head)
    assert action.dtype == torch.float32
    assert not torch.equal(half["scores"], full["scores"])  # the matmuls really ran in bfloat16 ...
    torch.testing.assert_close(half["scores"], full["scores"], atol=0.05, rtol=0.05)  # ... and stay close
    # "auto" runs bf16 exactly on CPUs where it is native (AMX, AVX512-BF16), fp32 elsewhere (and on CUDA).
    _, auto = QWMPlanner(QWMConfig(**{**cfg.__dict__, "precision": "auto"})).plan(z, pi, q, every_head)
    assert torch.equal(auto["scores"], (half if auto_bf16(z.device) else full)["scores"])
