"""ReplayBuffer against a brute-force model of what it holds.

Every observation is labelled (episode id, step) so a sample names the transition it came from.
The model of the online part follows the documented storage rule: each env stream is a ring of
capacity / num_envs observation slots, and an episode of T steps writes T+1 of them.
"""
from collections import deque

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robo_rl.data.buffer import ReplayBuffer
from robo_rl.data.hdf5 import Episode, read_hdf5, write_robomimic

GAMMA = 0.9
SHAPES = {"state": (2,), "cam_image": (1, 2, 2)}


def label_obs(ep: int, t: np.ndarray) -> dict[str, np.ndarray]:
    t = np.asarray(t)
    state = np.stack([np.full(t.shape, ep), t], -1).astype(np.float32)
    image = np.broadcast_to((t % 251).astype(np.uint8)[..., None, None, None], (*t.shape, 1, 2, 2)).copy()
    return {"state": state, "cam_image": image}


class World:
    """Feeds a buffer labelled offline episodes and env steps, and keeps the ground truth."""

    def __init__(self, buffer: ReplayBuffer, rng: np.random.Generator, task_id: int | None = None):
        self.buffer, self.rng, self.task_id = buffer, rng, task_id  # task_id: add a `task_id` obs key, as VecEnv does
        self.truth: dict[tuple[int, int], tuple[float, bool, bool]] = {}  # (ep, t) -> reward, terminal, end
        self.offline_ids: set[int] = set()
        self.next_id = 0
        E = buffer.num_envs
        self.rings = [deque(maxlen=buffer.stream_len) for _ in range(E)]  # obs labels held per stream
        self.current = [None] * E  # (ep, t, planned length, terminates)
        self.finished: list[tuple[int, int]] = []  # (ep, T) of completed online episodes

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def add_offline(self, lengths) -> list[Episode]:
        episodes = []
        for T in lengths:
            ep = self.new_id()
            self.offline_ids.add(ep)
            rewards = self.rng.normal(size=T).astype(np.float32)
            terminals = self.rng.random(T) < 0.2
            terminals[-1] = True
            for t in range(T):
                self.truth[ep, t] = (float(rewards[t]), bool(terminals[t]), t == T - 1)
            actions = label_obs(ep, np.arange(T))["state"]
            episodes.append(Episode(obs=label_obs(ep, np.arange(T + 1)), actions=actions, rewards=rewards,
                                    terminals=terminals, task_id=3, name=f"demo_{ep}"))
        self.buffer.add_offline(episodes)
        return episodes

    def step(self, max_len: int) -> None:
        E = self.buffer.num_envs
        for e in range(E):
            if self.current[e] is None:
                self.current[e] = (self.new_id(), 0, int(self.rng.integers(1, max_len + 1)), self.rng.random() < 0.5)
        ep, t = np.array([c[0] for c in self.current]), np.array([c[1] for c in self.current])
        obs = {k: torch.from_numpy(np.stack([label_obs(ep[e], t[e])[k] for e in range(E)])) for k in SHAPES}
        nxt = {k: np.stack([label_obs(ep[e], t[e] + 1)[k] for e in range(E)]) for k in SHAPES}  # numpy works too
        if self.task_id is not None:
            obs["task_id"] = nxt["task_id"] = torch.full((E,), self.task_id)
        reward = self.rng.normal(size=E).astype(np.float32)
        ends = np.array([c[1] + 1 == c[2] for c in self.current])
        terminated = ends & np.array([c[3] for c in self.current])
        self.buffer.add(obs, obs["state"], torch.from_numpy(reward), torch.from_numpy(terminated),
                        ends & ~terminated, nxt)
        for e in range(E):
            epi, ti, length, _ = self.current[e]
            if ti == 0:
                self.rings[e].append((epi, 0))
            self.rings[e].append((epi, ti + 1))
            self.truth[epi, ti] = (float(reward[e]), bool(terminated[e]), bool(ends[e]))
            if ends[e]:
                self.finished.append((epi, ti + 1))
            self.current[e] = None if ends[e] else (epi, ti + 1, length, self.current[e][3])

    def held(self) -> set[tuple[int, int]]:
        """Transitions the buffer should hold: offline ones, and online ones whose obs is still in its ring."""
        online = {lab for ring in self.rings for lab in ring}
        return {k for k in self.truth if k[0] in self.offline_ids or k in online}

    def succeeded(self) -> set[int]:
        """Episodes that ended in success (a terminal step): the rows bc_data="successes" clones beyond the demos."""
        return {ep for (ep, _), (_, terminal, _) in self.truth.items() if terminal}

    def nstep(self, ep: int, t: int, n: int, held: set) -> tuple[float, float, tuple[int, int]]:
        ret, disc, k = 0.0, 1.0, 0
        while True:
            r, terminal, end = self.truth[ep, t + k]
            ret += disc * r
            disc *= GAMMA
            k += 1
            if terminal:
                disc = 0.0
                break
            if end or k == n or (ep, t + k) not in held:
                break
        return ret, disc, (ep, t + k)

    def windows(self, horizon: int, held: set, offline: bool) -> set[tuple[int, int]]:
        starts = set()
        for ep, t in held:
            if (ep in self.offline_ids) != offline:
                continue
            steps = [(ep, t + k) for k in range(horizon)]
            if all(s in held for s in steps) and not any(self.truth[s][2] for s in steps[:-1]):
                starts.add((ep, t))
        return starts


def labels(x: torch.Tensor) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in row) for row in x.reshape(-1, 2).tolist()]


def make_buffer(num_envs=2, capacity=40, offline_ratio=0.5, seed=0) -> ReplayBuffer:
    return ReplayBuffer(SHAPES, None, action_dim=2, capacity=capacity, num_envs=num_envs,
                        offline_ratio=offline_ratio, gamma=GAMMA, seed=seed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_envs=st.integers(1, 3), capacity=st.integers(6, 40), env_steps=st.integers(0, 60),
       max_len=st.integers(1, 9), offline=st.lists(st.integers(1, 6), max_size=3),
       horizon=st.integers(1, 4), nstep=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_samples_match_brute_force_and_never_cross_episodes(num_envs, capacity, env_steps, max_len, offline,
                                                            horizon, nstep, seed):
    buffer = make_buffer(num_envs, max(capacity, 2 * num_envs), seed=seed)
    world = World(buffer, np.random.default_rng(seed))
    world.add_offline(offline)
    for _ in range(env_steps):
        world.step(max_len)
    held = world.held()
    assert buffer.num_offline == sum(offline)
    assert buffer.num_online == len(held) - sum(offline)
    if not held:
        with pytest.raises(RuntimeError, match="empty"):
            buffer.sample(4)
        return

    batch = buffer.sample(16, nstep=nstep)
    succeeded = world.succeeded()
    for start, nxt, ret, disc, off, success in zip(
            labels(batch["obs"]["state"]), labels(batch["next_obs"]["state"]), batch["reward"].tolist(),
            batch["discount"].tolist(), batch["offline"].tolist(), batch["success"].tolist()):
        assert start in held and off == (start[0] in world.offline_ids)
        assert success == (start[0] in succeeded)  # running online episodes: not (yet) a success
        want_ret, want_disc, want_next = world.nstep(*start, nstep, held)
        assert nxt == want_next
        assert ret == pytest.approx(want_ret, rel=1e-5, abs=1e-5) and disc == pytest.approx(want_disc, rel=1e-5)
    np.testing.assert_array_equal(batch["next_obs"]["cam_image"][:, 0, 0, 0].numpy(),
                                  batch["next_obs"]["state"][:, 1].numpy().astype(np.int64) % 251)

    offline_windows = world.windows(horizon, held, offline=True)
    online_windows = world.windows(horizon, held, offline=False)
    # Online episodes too short for a window (early online training) leave sequences to the offline part,
    # and demos too short for one (a world-model window spans seq_horizon chunks) leave them to the online part.
    draws_offline, draws_online = bool(offline_windows), bool(online_windows)
    assert buffer.can_sample_sequences(horizon) == (draws_offline or draws_online)
    if not (draws_offline or draws_online):
        with pytest.raises(RuntimeError, match="no sub-trajectory"):
            buffer.sample_sequences(8, horizon)
        return
    seq = buffer.sample_sequences(8, horizon)
    assert seq["obs"]["state"].shape == (8, horizon + 1, 2) and seq["action"].shape == (8, horizon, 2)
    for b in range(8):
        steps = labels(seq["obs"]["state"][b])
        ep, t = steps[0]
        assert (ep, t) in offline_windows | online_windows
        assert steps == [(ep, t + k) for k in range(horizon + 1)]  # one episode, consecutive steps
        assert labels(seq["action"][b]) == steps[:-1]
        for k in range(horizon):
            reward, terminal, _ = world.truth[ep, t + k]
            assert seq["reward"][b, k].item() == pytest.approx(reward)
            assert seq["terminal"][b, k].item() == terminal

    # Action chunks: h consecutive actions of one episode, the h-step return, the observation after them.
    chunks = buffer.sample_chunks(8, horizon)
    assert chunks["action"].shape == (8, horizon, 2)
    for b in range(8):
        ep, t = labels(chunks["obs"]["state"][b])[0]
        assert (ep, t) in offline_windows | online_windows
        assert chunks["offline"][b].item() == ((ep, t) in offline_windows)  # the rows bc_data="offline" clones
        assert chunks["success"][b].item() == (ep in succeeded)
        assert labels(chunks["action"][b]) == [(ep, t + k) for k in range(horizon)]
        assert labels(chunks["next_obs"]["state"][b]) == [(ep, t + horizon)]
        truth = [world.truth[ep, t + k] for k in range(horizon)]
        assert chunks["reward"][b].item() == pytest.approx(sum(GAMMA**k * r for k, (r, _, _) in enumerate(truth)),
                                                           rel=1e-5, abs=1e-5)
        ended = any(terminal for _, terminal, _ in truth)
        assert chunks["discount"][b].item() == pytest.approx(0.0 if ended else GAMMA**horizon)


def test_offline_online_ratio():
    for ratio in (0.5, 0.25):
        buffer = make_buffer(offline_ratio=ratio)
        world = World(buffer, np.random.default_rng(0))
        world.add_offline([5, 7])
        assert buffer.sample(64)["offline"].all()  # no online data yet: everything from offline
        for _ in range(30):
            world.step(max_len=8)
        flags = torch.cat([buffer.sample(256)["offline"] for _ in range(20)])
        assert abs(flags.float().mean().item() - ratio) < 0.01
    online_only = make_buffer()
    World(online_only, np.random.default_rng(1)).step(max_len=3)
    assert not online_only.sample(32)["offline"].any()


def test_online_samples_cover_the_ring_uniformly():
    buffer = make_buffer(num_envs=3, capacity=300)
    world = World(buffer, np.random.default_rng(2))
    for _ in range(150):  # wraps the ring
        world.step(max_len=12)
    held = world.held()
    counts: dict = {}
    for _ in range(40):
        for lab in labels(buffer.sample(256)["obs"]["state"]):
            counts[lab] = counts.get(lab, 0) + 1
    assert set(counts) <= held and len(counts) == len(held)  # every held transition gets drawn
    expected = 40 * 256 / len(held)
    assert max(counts.values()) < 2.5 * expected and min(counts.values()) > 0.2 * expected


def test_save_load_gives_identical_samples(tmp_path):
    buffer = make_buffer(num_envs=2, capacity=30, seed=5)
    world = World(buffer, np.random.default_rng(3))
    world.add_offline([4, 6])
    for _ in range(25):
        world.step(max_len=5)
    buffer.sample(8, nstep=3)  # advance the RNG: the saved state must be the current one
    buffer.save(tmp_path / "buffer.h5")
    loaded = ReplayBuffer.load(tmp_path / "buffer.h5")
    saved_sizes = (loaded.num_offline, loaded.num_online)
    assert [p.name for p in tmp_path.iterdir()] == ["buffer.h5"]
    assert (loaded.num_offline, loaded.num_online) == (buffer.num_offline, buffer.num_online)
    for _ in range(3):
        a, b = buffer.sample(32, nstep=3), loaded.sample(32, nstep=3)
        for k in ("action", "reward", "discount", "offline", "success"):
            assert torch.equal(a[k], b[k]), k
        for k in SHAPES:
            assert torch.equal(a["obs"][k], b["obs"][k]) and torch.equal(a["next_obs"][k], b["next_obs"][k])
        sa, sb = buffer.sample_sequences(16, 2), loaded.sample_sequences(16, 2)
        assert all(torch.equal(sa["obs"][k], sb["obs"][k]) for k in SHAPES)
    # both keep going the same way: the write heads were restored too
    world.buffer = loaded
    rng_state = world.rng.bit_generator.state
    world.step(max_len=5)
    world.buffer, world.rng.bit_generator.state = buffer, rng_state
    world.step(max_len=5)
    assert torch.equal(buffer.sample(64)["obs"]["state"], loaded.sample(64)["obs"]["state"])

    # A buffer saved before the success flags existed still loads, with none set
    with h5py.File(tmp_path / "buffer.h5", "a") as f:
        del f["offline/success"], f["online/success"]
    old = ReplayBuffer.load(tmp_path / "buffer.h5")
    assert (old.num_offline, old.num_online) == saved_sizes
    assert loaded.sample(64)["success"].any() and not old.sample(64)["success"].any()


def test_reseeded_copies_of_one_saved_buffer_draw_their_own_batches(tmp_path):
    # data-parallel ranks resume from rank 0's saved buffer: reseeded by rank, their batches differ
    buffer = make_buffer(num_envs=2, capacity=30, seed=5)
    world = World(buffer, np.random.default_rng(3))
    world.add_offline([4, 6])
    for _ in range(25):
        world.step(max_len=5)
    buffer.save(tmp_path / "buffer.h5")
    ranks = [ReplayBuffer.load(tmp_path / "buffer.h5") for _ in range(3)]
    for rank, seed in zip(ranks, (11, 12, 11)):
        rank.reseed(seed)
    batches = [labels(r.sample(32, nstep=2)["obs"]["state"]) for r in ranks]
    assert batches[0] != batches[1]  # two ranks' seeds: two batches
    assert batches[0] == batches[2]  # one seed: one batch
    assert labels(buffer.sample(32, nstep=2)["obs"]["state"]) != batches[0]  # not the saved RNG's draw either


def test_add_offline_appends_to_a_buffer_already_sampled():
    buffer = make_buffer()
    world = World(buffer, np.random.default_rng(7))
    first = world.add_offline([4, 4])
    buffer.sample_sequences(8, 3)
    second = world.add_offline([5])
    assert buffer.num_offline == 13
    drawn = {ep for ep, _ in labels(buffer.sample_sequences(256, 3)["obs"]["state"][:, 0])}
    assert drawn == {int(e.obs["state"][0, 0]) for e in first + second}


def test_statistics_come_from_offline_data():
    buffer = make_buffer()
    world = World(buffer, np.random.default_rng(4))
    with pytest.raises(RuntimeError, match="add_offline"):
        buffer.obs_stats()
    episodes = world.add_offline([3, 8, 5])
    for _ in range(10):
        world.step(max_len=4)  # online data must not move the statistics
    stats = buffer.obs_stats()
    assert set(stats) == {"state"}  # images are not normalised this way
    states = np.concatenate([e.obs["state"] for e in episodes])
    np.testing.assert_allclose(stats["state"][0], states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["state"][1], states.std(0), rtol=1e-6)
    mean, std = buffer.action_stats()
    actions = np.concatenate([e.actions for e in episodes])
    np.testing.assert_allclose(mean, actions.mean(0), rtol=1e-6)
    np.testing.assert_allclose(std, actions.std(0), rtol=1e-6)


def test_online_episodes_round_trip_through_robomimic_files(tmp_path):
    buffer = ReplayBuffer({**SHAPES, "task_id": ()}, None, action_dim=2, capacity=24, num_envs=2, gamma=GAMMA)
    world = World(buffer, np.random.default_rng(6), task_id=7)
    for _ in range(30):  # wraps the ring: the oldest episodes are partly overwritten
        world.step(max_len=6)
    episodes = buffer.online_episodes()
    held = world.held()
    intact = [(ep, T) for ep, T in world.finished if all((ep, t) in held for t in range(T))]
    assert 0 < len(intact) < len(world.finished)
    assert [int(e.obs["state"][0, 0]) for e in episodes] == [ep for ep, _ in intact]
    for e, (ep, T) in zip(episodes, intact):
        assert e.num_steps == T and labels(torch.from_numpy(e.obs["state"])) == [(ep, t) for t in range(T + 1)]
        np.testing.assert_allclose(e.rewards, [world.truth[ep, t][0] for t in range(T)])
        assert e.terminals.tolist() == [world.truth[ep, t][1] for t in range(T)]
        assert (e.obs["task_id"] == 7).all() and e.task_id == 7
    write_robomimic(tmp_path / "online.hdf5", episodes, {"env_name": "Lift", "type": 1, "env_kwargs": {}})
    back = read_hdf5(tmp_path / "online.hdf5").episodes
    assert [b.num_steps for b in back] == [e.num_steps for e in episodes]
    np.testing.assert_array_equal(back[0].obs["cam_image"], episodes[0].obs["cam_image"])
    assert back[0].task_id == 7


def test_bad_input_is_rejected_with_a_clear_message():
    buffer = make_buffer()
    bad = Episode(obs=label_obs(1, np.arange(4)), actions=np.zeros((3, 5), np.float32),
                  rewards=np.zeros(3, np.float32), terminals=np.zeros(3, bool), name="demo_9")
    with pytest.raises(ValueError, match="demo_9.*actions"):
        buffer.add_offline([bad])
    with pytest.raises(KeyError, match="cam_image"):
        buffer.add({"state": np.zeros((2, 2))}, np.zeros((2, 2)), np.zeros(2), np.zeros(2), np.zeros(2),
                   {"state": np.zeros((2, 2))})


def _step_labels(buffer: ReplayBuffer, eps: list[int], ts: list[int], lost=None, done=None) -> None:
    """One env step of labelled episodes: env e goes from (eps[e], ts[e]) to (eps[e], ts[e] + 1)."""
    E = buffer.num_envs
    obs = {k: np.stack([label_obs(eps[e], ts[e])[k] for e in range(E)]) for k in SHAPES}
    nxt = {k: np.stack([label_obs(eps[e], ts[e] + 1)[k] for e in range(E)]) for k in SHAPES}
    if lost is not None:  # a dead worker's row: a stale copy of obs, as VecEnv reports it
        for k in SHAPES:
            nxt[k][lost] = obs[k][lost]
    done = np.zeros(E, bool) if done is None else np.asarray(done)
    buffer.add(obs, obs["state"], np.zeros(E, np.float32), np.zeros(E, bool), done, nxt,
               None if lost is None else np.asarray(lost))


def _assert_transitions_are_real(buffer: ReplayBuffer) -> set[tuple[int, int]]:
    """Every sampled transition, n-step target and sequence stays inside one labelled episode."""
    batch = buffer.sample(512, nstep=3)
    for (ep, t), (ep2, t2) in zip(labels(batch["obs"]["state"]), labels(batch["next_obs"]["state"])):
        assert ep2 == ep and 1 <= t2 - t <= 3, f"({ep}, {t}) -> ({ep2}, {t2}) crosses episodes"
    seq = labels(buffer.sample_sequences(256, 3)["obs"]["state"])  # [256, 3 + 1 observations, 2]
    for i in range(0, len(seq), 4):
        assert [s[0] for s in seq[i:i + 4]] == [seq[i][0]] * 4 and [s[1] - seq[i][1] for s in seq[i:i + 4]] == [0, 1, 2, 3]
    return set(labels(batch["obs"]["state"]))


def test_a_lost_step_stores_nothing_and_ends_its_episode():
    buffer = make_buffer(num_envs=2, capacity=200, offline_ratio=0.0)
    for t in range(4):
        _step_labels(buffer, [1, 2], [t, t])
    _step_labels(buffer, [1, 2], [4, 4], lost=[False, True])  # env 1's worker died during this step
    for t in range(5):
        _step_labels(buffer, [1, 3], [5 + t, t])  # env 1 restarted: a new episode 3
    assert buffer.num_online == 2 * 10 - 1  # every env step but the lost one
    drawn = _assert_transitions_are_real(buffer)
    assert (2, 4) not in drawn and (2, 3) in drawn  # nothing from the lost step; the real ones stay
    ended = {int(e.obs["state"][0, 0]): e.num_steps for e in buffer.online_episodes()}
    assert ended == {2: 4}  # the cut episode ended, truncated, at its last real observation
    assert not buffer.online_episodes()[0].terminals.any()


def test_end_episodes_keeps_a_resumed_stream_from_joining_old_and_new_episodes(tmp_path):
    buffer = make_buffer(num_envs=2, capacity=200, offline_ratio=0.0)
    for t in range(6):
        _step_labels(buffer, [1, 2], [t, t])
    buffer.save(tmp_path / "b.h5")
    resumed = ReplayBuffer.load(tmp_path / "b.h5")
    assert resumed.write_counts == buffer.write_counts
    resumed.end_episodes()  # what a resumed run does before its envs start new episodes
    for t in range(6):
        _step_labels(resumed, [3, 4], [t, t])
    _assert_transitions_are_real(resumed)
    assert sorted((int(e.obs["state"][0, 0]), e.num_steps) for e in resumed.online_episodes()) == [(1, 6), (2, 6)]


def test_failed_scripted_rollouts_are_kept_unsuccessful_through_file_and_buffer(tmp_path, lift_spec):
    """collect_demos(keep_failures=True) on real Lift: 2 expert rollouts cut at 20 steps (too short to lift
    the cube) and 2 with the time to succeed. The failed ones keep every step and no terminal, survive the
    robomimic file, and the buffer flags all their rows unsuccessful, so bc_data=successes does not clone them."""
    import dataclasses

    from robo_rl.demos.collect import collect_demos

    runs = {}
    for horizon in (20, 120):
        spec = dataclasses.replace(lift_spec, horizon=horizon)
        episodes, rate, env_args = collect_demos(spec, "lift", 2, noise=0.0, seed=3, num_envs=2, workers="sync",
                                                 progress=False, keep_failures=True)
        write_robomimic(tmp_path / f"h{horizon}.hdf5", episodes, env_args)
        runs[horizon] = read_hdf5(tmp_path / f"h{horizon}.hdf5", obs_keys=list(spec.low_dim_keys)).episodes, rate
    (short, short_rate), (full, full_rate) = runs[20], runs[120]
    assert short_rate == 0.0 and [e.num_steps for e in short] == [20, 20]
    assert not any(e.terminals.any() for e in short)
    assert full_rate == 1.0 and all(e.terminals[-1] and e.num_steps < 120 for e in full)
    shapes = {k: v.shape[1:] for k, v in short[0].obs.items()}
    buffer = ReplayBuffer(shapes, None, action_dim=7, capacity=16, offline_ratio=1.0)
    buffer.add_offline(short + full)
    flags = buffer.sample(512)
    assert flags["offline"].all()
    failed_rows = flags["success"].logical_not().sum().item()
    assert 0 < failed_rows < 512  # both kinds are drawn, and only the rows of the two failed rollouts are unflagged
    assert failed_rows / 512 == pytest.approx(40 / (40 + sum(e.num_steps for e in full)), abs=0.08)
