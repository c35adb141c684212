"""The replay buffer: offline demonstrations + an online ring buffer, sampled RLPD-style.

Storage is a sequence of observation *slots*. An episode of T steps takes T+1 consecutive slots:
slot j holds obs_j and, for j < T, the transition taken from it (action, reward, terminal);
its next observation is slot j+1. So each image is stored once, and episode boundaries are
explicit: `valid[j]` marks slots that start a transition, and an episode's final observation
slot is never valid, so a walk forward from any transition stops at its episode's end.

The offline part is one flat run of episodes. The online part is one ring of `capacity / num_envs`
slots per env stream, so every env's episodes stay contiguous however the envs interleave. The
newest slot of each stream (the observation awaiting its action) is never `valid`, so walking
forward from any transition stops at the write head before reaching older, overwritten data.

Index arithmetic (n-step returns, episode-bounded windows) runs in numba; gathers are numpy
`take` into (pinned, when the device is CUDA) torch memory.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import h5py
import numpy as np
import torch
from numba import njit

from robo_rl.core import TASK_KEY, is_image_key
from robo_rl.data.hdf5 import Episode

_MAX_REJECTION_ROUNDS = 100  # online sampling draws candidates in rounds; each round accepts >= ~50%
_POOLED_PER_SHAPE = 8  # output arrays kept for reuse per (shape, dtype): covers several held batches


# ---------------------------------------------------------------------------------------------
# Index arithmetic (slots of one stream lie in [base, base + stream_len); walks wrap inside it)
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _nstep_targets(starts, reward, terminal, valid, stream_len, nstep, gamma):
    """n-step return from each start slot, stopping after a terminal, at the episode's end or at the
    newest transition (at both, the next slot holds no transition).
    Returns next_slot [B], return [B], discount [B] = gamma**n * (1 - terminal)."""
    B = starts.shape[0]
    next_slot = np.empty(B, np.int64)
    returns = np.empty(B, np.float32)
    discounts = np.empty(B, np.float32)
    for b in range(B):
        s = starts[b]
        base = s - s % stream_len
        offset = s - base
        ret, disc, k = 0.0, 1.0, 0
        while True:
            i = base + (offset + k) % stream_len
            ret += disc * reward[i]
            disc *= gamma
            k += 1
            if terminal[i]:
                disc = 0.0
                break
            if k == nstep or not valid[base + (offset + k) % stream_len]:
                break
        next_slot[b] = base + (offset + k) % stream_len
        returns[b] = ret
        discounts[b] = disc
    return next_slot, returns, discounts


@njit(cache=True)
def _windows_ok(starts, horizon, valid, stream_len):
    """[B] bool: the `horizon` transitions from each start exist, hence lie in one episode."""
    ok = np.empty(starts.shape[0], np.bool_)
    for b in range(starts.shape[0]):
        s = starts[b]
        base = s - s % stream_len
        ok[b] = True
        for k in range(horizon):
            i = base + (s - base + k) % stream_len
            if not valid[i]:
                ok[b] = False
                break
    return ok


@njit(cache=True)
def _window_slots(starts, horizon, stream_len):
    """[B, horizon + 1] slots of the observations along each window."""
    out = np.empty((starts.shape[0], horizon + 1), np.int64)
    for b in range(starts.shape[0]):
        s = starts[b]
        base = s - s % stream_len
        for k in range(horizon + 1):
            out[b, k] = base + (s - base + k) % stream_len
    return out


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------
class _Slots:
    """Arrays of `n` slots: obs per key, and the transition started from each slot."""

    def __init__(self, n: int, obs_shapes: Mapping[str, tuple], obs_dtypes: Mapping[str, np.dtype], action_dim: int):
        self.obs = {k: np.zeros((n, *shape), obs_dtypes[k]) for k, shape in obs_shapes.items()}
        self.action = np.zeros((n, action_dim), np.float32)
        self.reward = np.zeros(n, np.float32)
        self.terminal = np.zeros(n, bool)
        self.valid = np.zeros(n, bool)
        self.success = np.zeros(n, bool)  # the slot's episode ended in success (a terminal step)

    def __len__(self) -> int:
        return len(self.valid)

    def arrays(self) -> dict[str, np.ndarray]:
        return {**{f"obs/{k}": v for k, v in self.obs.items()}, "action": self.action, "reward": self.reward,
                "terminal": self.terminal, "valid": self.valid,
                "success": self.success}


class _OutputPool:
    """Batch output arrays, reused once every tensor made from them is gone.

    A fresh 20 MB image batch costs more to fault in and zero than to fill; reusing the memory of
    batches the learner has dropped halves the cost of an image batch. An array counts as free when
    only the pool refers to it (torch.from_numpy tensors and their views hold a reference).
    """

    def __init__(self):
        self._arrays: dict[tuple, list[np.ndarray]] = defaultdict(list)

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        arrays = self._arrays[shape, np.dtype(dtype).str]
        for i in range(len(arrays)):
            if sys.getrefcount(arrays[i]) == 2:  # the list's reference + getrefcount's argument
                return arrays[i]
        array = np.empty(shape, dtype)
        if len(arrays) < _POOLED_PER_SHAPE:
            arrays.append(array)
        return array


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class ReplayBuffer:
    """Offline episodes + online ring buffer of ~`capacity` transitions from `num_envs` env streams.

    obs_shapes: key -> per-step shape (images (C, H, W)); keys not listed are ignored on input.
    obs_dtypes: key -> dtype (default: uint8 images, int64 `task_id`, float32 otherwise).
    offline_ratio: share of each batch drawn from offline data while both parts hold data (RLPD: 0.5).
    """

    def __init__(self, obs_shapes: Mapping[str, tuple[int, ...]], obs_dtypes: Mapping[str, np.dtype] | None,
                 action_dim: int, capacity: int, num_envs: int = 1, device: str | torch.device = "cpu",
                 offline_ratio: float = 0.5, gamma: float = 0.99, seed: int = 0):
        if not 0.0 <= offline_ratio <= 1.0:
            raise ValueError(f"offline_ratio={offline_ratio} must lie in [0, 1]")
        if capacity < 2 * num_envs:
            raise ValueError(f"capacity={capacity} must hold at least 2 slots per env ({num_envs} envs)")
        self.obs_shapes = {k: tuple(int(d) for d in s) for k, s in obs_shapes.items()}
        self.obs_dtypes = {k: np.dtype((obs_dtypes or {}).get(k, _default_dtype(k))) for k in self.obs_shapes}
        self.action_dim, self.capacity, self.num_envs = int(action_dim), int(capacity), int(num_envs)
        self.offline_ratio, self.gamma, self.seed = float(offline_ratio), float(gamma), int(seed)
        self.device = torch.device(device)
        self._rng = np.random.default_rng(seed)
        self._outputs = _OutputPool()

        self._offline = _Slots(0, self.obs_shapes, self.obs_dtypes, self.action_dim)
        self._num_offline = 0
        self._offline_starts: dict[int, np.ndarray] = {}  # horizon -> valid window starts, built lazily

        self.stream_len = -(-self.capacity // self.num_envs)
        self._online = _Slots(self.stream_len * self.num_envs, self.obs_shapes, self.obs_dtypes, self.action_dim)
        self._pos = np.zeros(self.num_envs, np.int64)  # slots ever written per stream (write head = pos % len)
        self._episode_start = np.zeros(self.num_envs, np.int64)  # pos of the current episode's first obs
        self._needs_first_obs = np.ones(self.num_envs, bool)
        self._num_online = 0
        self._finished: list[tuple[int, int, int]] = []  # (stream, start pos, steps) of completed episodes

    # -- sizes --------------------------------------------------------------------------------
    @property
    def num_offline(self) -> int:
        return self._num_offline

    @property
    def num_online(self) -> int:
        return self._num_online

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer's storage, offline and online (every online slot, used or not)."""
        return sum(a.nbytes for part in (self._offline, self._online) for a in part.arrays().values())

    # -- adding data --------------------------------------------------------------------------
    def add_offline(self, episodes: Iterable[Episode], lengths: Sequence[int] | None = None) -> None:
        """Append episodes (obs [T+1, ...], actions [T, A]) to the offline part.

        lengths: each episode's T, in order, when known before the episodes are (e.g. from the files'
        shapes): `episodes` may then be a one-pass iterator that reads them one at a time, and each is
        copied into storage allocated once, so a dataset never sits in memory beside its copy here.
        The buffer changes only once every episode is in; a bad episode leaves it as it was.
        """
        if lengths is None:
            episodes = list(episodes)
            lengths = [e.num_steps for e in episodes]
        old, n_old = self._offline, len(self._offline)
        new = _Slots(n_old + sum(T + 1 for T in lengths), self.obs_shapes, self.obs_dtypes, self.action_dim)
        for name, array in new.arrays().items():
            array[:n_old] = old.arrays()[name]
        start, added = n_old, 0
        for e in episodes:
            self._check_episode(e)
            T = e.num_steps
            if added == len(lengths) or T != lengths[added]:
                expected = "no more episodes" if added == len(lengths) else f"{lengths[added]} steps"
                raise ValueError(f"episode {added} ({e.name}) has {T} steps, but lengths announced {expected}; "
                                 "pass the T of every episode, in order")
            added += 1
            for k in self.obs_shapes:
                new.obs[k][start : start + T + 1] = self._episode_obs(e, k)
            steps = slice(start, start + T)
            new.action[steps] = e.actions
            new.reward[steps] = e.rewards
            new.terminal[steps] = e.terminals
            new.valid[steps] = True
            new.success[steps] = e.terminals.any()
            start += T + 1
        if added != len(lengths):
            raise ValueError(f"lengths announced {len(lengths)} episodes but {added} came; pass the T of every "
                             "episode, in order")
        self._offline = new
        self._num_offline += sum(lengths)
        self._offline_starts.clear()

    def add(self, obs, action, reward, terminated, truncated, next_obs, lost=None) -> None:
        """One vectorized env step. obs / next_obs: key -> [E, ...] (next_obs as reached, before any
        auto-reset); action [E, A]; reward, terminated, truncated [E]. torch or numpy.

        lost [E] bool (optional): envs whose step never happened (their worker died). Nothing of
        theirs is stored; their episode ends truncated at its last real observation.
        """
        action = _numpy(action).astype(np.float32).reshape(self.num_envs, self.action_dim)
        terminated = _numpy(terminated).astype(bool).reshape(self.num_envs)
        done = terminated | _numpy(truncated).astype(bool).reshape(self.num_envs)
        lost = np.zeros(self.num_envs, bool) if lost is None else _numpy(lost).astype(bool).reshape(self.num_envs)
        self.end_episodes(np.flatnonzero(lost))
        live = np.flatnonzero(~lost)

        starting = live[self._needs_first_obs[live]]
        if len(starting):  # a new episode: its first observation needs a slot of its own
            self._episode_start[starting] = self._pos[starting]
            self._write_obs(self._claim_slots(starting), obs, starting)
        current = live * self.stream_len + (self._pos[live] - 1) % self.stream_len
        o = self._online
        o.action[current] = action[live]
        o.reward[current] = _numpy(reward).astype(np.float32).reshape(self.num_envs)[live]
        o.terminal[current] = terminated[live]
        o.valid[current] = True
        self._num_online += len(live)
        self._write_obs(self._claim_slots(live), next_obs, live)

        for e in live[done[live]]:
            start = int(self._episode_start[e])
            steps = int(self._pos[e]) - 1 - start
            self._finished.append((int(e), start, steps))
            if terminated[e]:  # known only now, so the flag goes back over the whole episode
                o.success[self._ring_slots(e, start, steps)] = True
        self._needs_first_obs[live] = done[live]

    def end_episodes(self, envs=None) -> None:
        """End the open episodes of `envs` (default: all streams) as truncated at their last stored
        observation; the next `add` starts new ones. Resuming a run calls this: its envs start new
        episodes, which must not be joined to the ones a crash interrupted."""
        envs = np.arange(self.num_envs) if envs is None else np.asarray(envs, np.int64)
        for e in envs[~self._needs_first_obs[envs]]:
            start = int(self._episode_start[e])
            if (steps := int(self._pos[e] - 1 - start)) > 0:
                self._finished.append((int(e), start, steps))
        self._needs_first_obs[envs] = True

    def episode_spans(self) -> list[tuple[int, int, int]]:
        """(env stream, write position of its first observation, steps) of every completed online episode, in the
        positions `write_counts` counts: what tells whether an episode spans a given point of the stream."""
        return list(self._finished)

    @property
    def write_counts(self) -> list[int]:
        """Observation slots ever written per env stream: identifies the buffer's exact contents over time."""
        return self._pos.tolist()

    def _claim_slots(self, envs: np.ndarray) -> np.ndarray:
        """Advance the write heads of `envs`, clearing whatever the claimed slots held."""
        slots = envs * self.stream_len + self._pos[envs] % self.stream_len
        o = self._online
        self._num_online -= int(o.valid[slots].sum())
        o.valid[slots] = False
        o.success[slots] = False
        self._pos[envs] += 1
        return slots

    def _ring_slots(self, stream: int, start: int, n: int) -> np.ndarray:
        """The online slots [n] of `n` consecutive positions of one env stream from `start` (wrapping in its ring)."""
        return stream * self.stream_len + (start + np.arange(n)) % self.stream_len

    def _write_obs(self, slots: np.ndarray, obs: Mapping, envs: np.ndarray) -> None:
        for k in self.obs_shapes:
            if k not in obs:
                raise KeyError(f"observation key {k!r} missing from the step; got {sorted(obs)}")
            values = _numpy(obs[k])
            if values.shape[1:] != self.obs_shapes[k]:
                raise ValueError(f"obs[{k!r}] has per-env shape {values.shape[1:]}, buffer expects "
                                 f"{self.obs_shapes[k]}")
            self._online.obs[k][slots] = values[envs]

    def _check_episode(self, e: Episode) -> None:
        T = e.num_steps
        if e.actions.shape != (T, self.action_dim) or T == 0:
            raise ValueError(f"episode {e.name}: actions shape {e.actions.shape}, expected [T>0, {self.action_dim}]")
        if e.rewards.shape != (T,) or e.terminals.shape != (T,):
            raise ValueError(f"episode {e.name}: rewards {e.rewards.shape} and terminals {e.terminals.shape} "
                             f"must both be [{T}]")
        for k, shape in self.obs_shapes.items():
            if k == TASK_KEY and k not in e.obs:
                continue
            if k not in e.obs:
                raise KeyError(f"episode {e.name}: observation key {k!r} missing; it has {sorted(e.obs)}")
            if e.obs[k].shape != (T + 1, *shape):
                raise ValueError(f"episode {e.name}: obs[{k!r}] shape {e.obs[k].shape}, expected {(T + 1, *shape)}")

    @staticmethod
    def _episode_obs(e: Episode, k: str) -> np.ndarray:
        if k == TASK_KEY and k not in e.obs:
            return np.full(e.num_steps + 1, e.task_id, np.int64)
        return e.obs[k]

    # -- sampling -----------------------------------------------------------------------------
    def sample(self, batch_size: int, nstep: int = 1) -> dict:
        """Transitions with n-step returns.

        Returns obs / next_obs: key -> [B, ...]; action [B, A]; reward [B] (discounted n-step sum,
        stopping at the episode's end); discount [B] = gamma**n_taken * (1 - terminal); offline [B] bool;
        success [B] bool (the transition's episode ended in success; an online episode still running: False).
        """
        if nstep < 1:
            raise ValueError(f"nstep={nstep} must be >= 1")
        draws = []  # per part: (part, start slots, next-obs slots, returns, discounts)
        for part, n, stream_len in self._plan(batch_size):
            starts = self._starts(part, n, 1)
            draws.append((part, starts, *_nstep_targets(starts, part.reward, part.terminal, part.valid, stream_len,
                                                        nstep, np.float32(self.gamma))))
        B = batch_size
        return {
            "obs": {k: self._take([(p.obs[k], s) for p, s, *_ in draws], (B, *shape))
                    for k, shape in self.obs_shapes.items()},
            "action": self._take([(p.action, s) for p, s, *_ in draws], (B, self.action_dim)),
            "reward": self._tensor(np.concatenate([d[3] for d in draws])),
            "discount": self._tensor(np.concatenate([d[4] for d in draws])),
            "next_obs": {k: self._take([(p.obs[k], nxt) for p, _, nxt, *_ in draws], (B, *shape))
                         for k, shape in self.obs_shapes.items()},
            "offline": self._tensor(np.concatenate([np.full(len(d[1]), d[0] is self._offline) for d in draws])),
            "success": self._tensor(np.concatenate([p.success[s] for p, s, *_ in draws])),
        }

    def sample_sequences(self, batch_size: int, horizon: int) -> dict:
        """Sub-trajectories of `horizon` steps inside one episode.

        Returns obs: key -> [B, H+1, ...]; action [B, H, A]; reward [B, H]; terminal [B, H] bool;
        offline [B] bool (the window lies in a demonstration); success [B] bool (its episode ended in success).
        """
        if horizon < 1:
            raise ValueError(f"horizon={horizon} must be >= 1")
        if not self.can_sample_sequences(horizon):
            raise RuntimeError(f"no sub-trajectory of {horizon} steps to sample yet: the buffer is empty or its "
                               "online episodes are shorter (check can_sample_sequences first)")
        windows = []
        plan = self._plan(batch_size, use_offline=self._offline_has_window(horizon),
                          use_online=self._online_has_window(horizon))
        for part, n, stream_len in plan:
            windows.append((part, _window_slots(self._starts(part, n, horizon), horizon, stream_len)))
        B, H = batch_size, horizon
        steps = [(p, w[:, :H].reshape(-1)) for p, w in windows]
        return {
            "obs": {k: self._take([(p.obs[k], w.reshape(-1)) for p, w in windows], (B, H + 1, *shape))
                    for k, shape in self.obs_shapes.items()},
            "action": self._take([(p.action, i) for p, i in steps], (B, H, self.action_dim)),
            "reward": self._take([(p.reward, i) for p, i in steps], (B, H)),
            "terminal": self._take([(p.terminal, i) for p, i in steps], (B, H)),
            "offline": self._tensor(np.concatenate([np.full(len(w), p is self._offline) for p, w in windows])),
            "success": self._tensor(np.concatenate([p.success[w[:, 0]] for p, w in windows])),
        }

    def sample_chunks(self, batch_size: int, horizon: int) -> dict:
        """Transitions whose action is a chunk of `horizon` consecutive actions inside one episode.

        The format of `sample`: obs, next_obs (the observation after the chunk); action [B, h, A];
        reward [B] = sum_k gamma^k r_k; discount [B] = gamma^h (1 - terminal); offline, success [B] bool.
        """
        seq = self.sample_sequences(batch_size, horizon)
        reward = seq["reward"].float()
        powers = self.gamma ** torch.arange(horizon, dtype=reward.dtype, device=reward.device)
        return {
            "obs": {k: v[:, 0] for k, v in seq["obs"].items()},
            "next_obs": {k: v[:, -1] for k, v in seq["obs"].items()},
            "action": seq["action"],
            "reward": reward @ powers,
            "discount": self.gamma**horizon * (~seq["terminal"].any(1)).float(),
            "offline": seq["offline"],
            "success": seq["success"],
        }

    def can_sample_sequences(self, horizon: int) -> bool:
        """Whether `sample_sequences(_, horizon)` has anything to draw from."""
        return self._offline_has_window(horizon) or self._online_has_window(horizon)

    def _offline_window_starts(self, horizon: int) -> np.ndarray:
        """Start slots of every `horizon`-step window inside one demonstration (built once per horizon)."""
        if horizon not in self._offline_starts:
            slots = np.arange(len(self._offline), dtype=np.int64)
            self._offline_starts[horizon] = slots[_windows_ok(slots, horizon, self._offline.valid, len(slots))]
        return self._offline_starts[horizon]

    def _offline_has_window(self, horizon: int) -> bool:
        """Whether some demonstration has `horizon` steps. Why ask: with action chunks the world model's
        windows span seq_horizon·h env steps, which short demos may not have (online episodes then supply them)."""
        return len(self._offline_window_starts(horizon)) > 0

    def _online_has_window(self, horizon: int) -> bool:
        """Whether the ring still holds `horizon` consecutive steps of some online episode (finished or
        running). Early in online training none does, and sequences then come from the offline part."""
        oldest = self._pos - self.stream_len  # pos of the oldest slot each stream still holds
        running = self._pos - np.maximum(self._episode_start, oldest) - 1
        if (running[~self._needs_first_obs] >= horizon).any():
            return True
        return any(start + steps - max(start, oldest[e]) >= horizon for e, start, steps in self._finished)

    def _plan(self, batch_size: int, use_offline: bool = True, use_online: bool = True
              ) -> list[tuple[_Slots, int, int]]:
        """(part, samples from it, stream length) for each part that contributes to a batch."""
        n_off, n_on = self.num_offline if use_offline else 0, self.num_online if use_online else 0
        if n_off == 0 and n_on == 0:
            raise RuntimeError("the replay buffer is empty: add_offline() demos or add() env steps first")
        if n_on == 0:
            from_offline = batch_size
        elif n_off == 0:
            from_offline = 0
        else:
            from_offline = int(round(batch_size * self.offline_ratio))
        plan = [(self._offline, from_offline, len(self._offline)),
                (self._online, batch_size - from_offline, self.stream_len)]
        return [p for p in plan if p[1] > 0]

    def _starts(self, part: _Slots, n: int, horizon: int) -> np.ndarray:
        """n uniform start slots of valid `horizon`-step windows in `part`."""
        if part is self._offline:
            starts = self._offline_window_starts(horizon)
            if len(starts) == 0:
                raise ValueError(f"no offline episode has {horizon} steps; lower the horizon")
            return starts[self._rng.integers(len(starts), size=n)]
        # Online: rejection sampling over written slots, uniform over the valid windows. Cheap: only an
        # episode's final slot (and each stream's newest) starts no transition, and a window is rejected
        # only within `horizon` steps of an episode's end.
        filled = np.minimum(self._pos, self.stream_len)
        cum = np.cumsum(filled)
        accepted: list[np.ndarray] = []
        need = n
        for _ in range(_MAX_REJECTION_ROUNDS):
            u = self._rng.integers(cum[-1], size=2 * need + 16)
            stream = np.searchsorted(cum, u, side="right")
            cand = stream * self.stream_len + u - (cum[stream] - filled[stream])
            good = cand[_windows_ok(cand, horizon, part.valid, self.stream_len)][:need]
            accepted.append(good)
            need -= len(good)
            if need == 0:
                return np.concatenate(accepted)
        raise ValueError(f"could not find {n} online windows of {horizon} steps inside one episode; "
                         "online episodes are shorter than the horizon")

    def _take(self, sources: list[tuple[np.ndarray, np.ndarray]], shape: tuple) -> torch.Tensor:
        """Rows sources[i][0][sources[i][1]], concatenated in order, as a tensor of `shape` on the device."""
        array0 = sources[0][0]
        if self.device.type == "cuda":  # stage in pinned memory (torch caches it) for an async copy
            staging = torch.empty(shape, dtype=torch.from_numpy(array0[:0]).dtype, pin_memory=True)
            out = staging.numpy()
        else:
            out = self._outputs.empty(shape, array0.dtype)
            staging = torch.from_numpy(out)
        rows, row = out.reshape(-1, *array0.shape[1:]), 0
        for array, idx in sources:
            np.take(array, idx, axis=0, out=rows[row : row + len(idx)], mode="clip")  # clip: no extra buffering
            row += len(idx)
        return staging.to(self.device, non_blocking=True)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    # -- statistics ---------------------------------------------------------------------------
    def obs_stats(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Mean and std of each low-dim observation key over the offline data (std floored at 1e-3,
        so a feature constant in the demos does not blow up when normalised)."""
        self._require_offline()
        obs_rows = self._offline.valid | np.roll(self._offline.valid, 1)  # every observation of every episode
        return {k: _mean_std(v[obs_rows]) for k, v in self._offline.obs.items()
                if not is_image_key(k) and np.issubdtype(v.dtype, np.floating)}

    def action_stats(self) -> tuple[np.ndarray, np.ndarray]:
        self._require_offline()
        return _mean_std(self._offline.action[self._offline.valid])

    def _require_offline(self) -> None:
        if self.num_offline == 0:
            raise RuntimeError("normalization statistics come from offline data; call add_offline() first")

    # -- exporting ----------------------------------------------------------------------------
    def online_episodes(self) -> list[Episode]:
        """Completed online episodes still wholly in the ring (oldest first), e.g. to save with write_robomimic."""
        # forget the episodes the ring has started to overwrite
        self._finished = [(e, start, T) for e, start, T in self._finished if start >= self._pos[e] - self.stream_len]
        episodes = []
        for stream, start, steps in self._finished:
            slots = self._ring_slots(stream, start, steps + 1)
            o, acts = self._online, slots[:-1]
            obs = {k: v[slots] for k, v in o.obs.items()}
            task = int(obs[TASK_KEY][0]) if TASK_KEY in obs else 0
            episodes.append(Episode(obs=obs, actions=o.action[acts], rewards=o.reward[acts],
                                    terminals=o.terminal[acts], task_id=task, name=f"demo_{len(episodes)}"))
        return episodes

    # -- persistence --------------------------------------------------------------------------
    def _config(self) -> dict:
        return dict(obs_shapes=self.obs_shapes, obs_dtypes={k: d.str for k, d in self.obs_dtypes.items()},
                    action_dim=self.action_dim, capacity=self.capacity, num_envs=self.num_envs,
                    offline_ratio=self.offline_ratio, gamma=self.gamma, seed=self.seed)

    def save(self, path: str | os.PathLike) -> None:
        """Write the whole buffer (data, write heads, RNG) to one HDF5 file, atomically."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        written = int(np.minimum(self._pos, self.stream_len).max())  # online slots in use per stream
        try:
            with h5py.File(tmp, "w") as f:
                f.attrs["config"] = json.dumps(self._config())
                f.attrs["rng"] = json.dumps(self._rng.bit_generator.state)
                f.attrs["num_online"] = self._num_online
                for name in ("_pos", "_episode_start", "_needs_first_obs"):
                    f.create_dataset(f"heads/{name}", data=getattr(self, name))
                f.create_dataset("heads/finished", data=np.array(self._finished, np.int64).reshape(-1, 3))
                for name, array in self._offline.arrays().items():
                    f.create_dataset(f"offline/{name}", data=array)
                for name, array in self._online.arrays().items():
                    streams = array.reshape(self.num_envs, self.stream_len, *array.shape[1:])
                    f.create_dataset(f"online/{name}", data=streams[:, :written])
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> ReplayBuffer:
        with h5py.File(path, "r") as f:
            config = json.loads(f.attrs["config"])
            buffer = cls(**{**config, "obs_dtypes": {k: np.dtype(d) for k, d in config["obs_dtypes"].items()}},
                         device=device)
            buffer._rng.bit_generator.state = json.loads(f.attrs["rng"])
            buffer._num_online = int(f.attrs["num_online"])
            for name in ("_pos", "_episode_start", "_needs_first_obs"):
                setattr(buffer, name, f[f"heads/{name}"][()])
            buffer._finished = [tuple(int(x) for x in row) for row in f["heads/finished"][()]]
            n_offline = len(f["offline/valid"])
            buffer._offline = _Slots(n_offline, buffer.obs_shapes, buffer.obs_dtypes, buffer.action_dim)
            # read_direct: straight into the buffer's arrays, never a second copy of the data in memory
            # A buffer saved before the `success` flags existed loads with none set (bc_data=successes then
            # clones only the episodes that end after the resume)
            unsaved = {key for key in ("offline/success", "online/success") if key not in f}
            for name, array in buffer._offline.arrays().items():
                if n_offline and f"offline/{name}" not in unsaved:
                    f[f"offline/{name}"].read_direct(array)
            buffer._num_offline = int(buffer._offline.valid.sum())
            for name, array in buffer._online.arrays().items():
                if f"online/{name}" in unsaved:
                    continue
                stored = f[f"online/{name}"]
                streams = array.reshape(buffer.num_envs, buffer.stream_len, *array.shape[1:])
                if stored.shape[1]:
                    stored.read_direct(streams, dest_sel=np.s_[:, : stored.shape[1]])
        return buffer

    def reseed(self, seed: int) -> None:
        """Restart the sampling RNG from `seed`. Data-parallel ranks that resume from one saved buffer load
        one RNG state: reseeded by rank (distributed.rank_seed), they draw their own batches again."""
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)


def _default_dtype(key: str) -> np.dtype:
    if is_image_key(key):
        return np.dtype(np.uint8)
    return np.dtype(np.int64) if key == TASK_KEY else np.dtype(np.float32)


def _mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    return x.mean(0).astype(np.float32), np.maximum(x.std(0), 1e-3).astype(np.float32)
