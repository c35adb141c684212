"""Batched envs: B single envs behind one interface, in-process (`sync`) or in worker processes.

Every backend (these and `envs.warp`) returns torch tensors:
  obs        dict key -> [B, ...]   low-dim float32, images uint8 [B, C, H, W], `task_id` int64 [B]
  reward     [B] float32, terminated / truncated / success [B] bool
  next_obs   the observation the step reached, before any auto-reset (for storing transitions)
  lost       [B] bool: the env's worker died during this step (or during a call since the last step), so
             the step never happened
With `autoreset=True` an env whose episode ended is reset at once and `obs` holds its new first
observation. A worker process that dies or stops answering is replaced and its env reset; its
episode ends there, reported truncated *and* lost: its `next_obs` row is a copy of the last real
observation, not a transition, and must not be stored or scored (`num_restarts` counts these;
`lost_reasons[i]` says why env i's worker was last replaced). A worker may hold several envs
(envs.ray_runners): all of them lose their episodes, so all are reported, stepped in that call or not.
An episode lost in another call (render, get, another env's reset) is reported by the next step, which
does not step that env: its new episode starts from the `obs` that step returns (its `next_obs` row is
that same new observation, again not a transition).
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import torch

from robo_rl.core import ACTION_DIM, Obs
from robo_rl.envs.spec import EnvSpec
from robo_rl.utils.threads import apply_thread_policy


@dataclass
class StepResult:
    obs: Obs
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    success: torch.Tensor
    next_obs: Obs
    lost: torch.Tensor  # [B] bool: the env's worker died, the step never happened (always False without workers)

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


def per_env_seeds(env_ids: list[int], seed) -> list[int | None]:
    """seed: an int (env i gets `seed + i`), one seed (or None) per entry of env_ids, or None."""
    if seed is None or isinstance(seed, (int, np.integer)):
        return [None if seed is None else int(seed) + i for i in env_ids]
    if len(seed) != len(env_ids):
        raise ValueError(f"got {len(seed)} seeds for {len(env_ids)} envs")
    return list(seed)


def check_finite_actions(actions: np.ndarray, env_ids: list[int]) -> None:
    """Stop NaN/Inf actions before they reach the simulator (MuJoCo would integrate them into a NaN state)."""
    bad = ~np.isfinite(actions).all(axis=1)
    if bad.any():
        raise FloatingPointError(f"non-finite actions for envs {[env_ids[i] for i in np.flatnonzero(bad)]}: "
                                 f"{actions[bad][0].tolist()}; the policy or its input has gone non-finite")


def make_single_env(spec: EnvSpec, index: int = 0):
    if spec.suite == "robosuite":
        from robo_rl.envs.robosuite import RobosuiteEnv

        return RobosuiteEnv(spec, index)
    if spec.suite == "libero":
        from robo_rl.envs.libero import LiberoEnv

        return LiberoEnv(spec, index)
    raise ValueError(f"unknown suite {spec.suite!r}; expected 'robosuite' or 'libero'")


class EnvRunner:
    """Owns one env; executes the commands a VecEnv sends (in-process or in a worker)."""

    def __init__(self, spec: EnvSpec, index: int, num_envs: int):
        self.env = make_single_env(spec, index)
        self.index, self.num_envs = index, num_envs
        self.episode_seed: int | None = None

    def reset(self, seed: int | None, options: dict | None):
        self.episode_seed = seed
        return self.env.reset(seed, options)

    def step(self, action: np.ndarray, autoreset: bool):
        obs, reward, terminated, truncated, success = self.env.step(action)
        final = None
        if autoreset and (terminated or truncated):
            final = obs
            # Per-env seed streams: env i's k-th episode gets seed0 + i + k * num_envs.
            seed = None if self.episode_seed is None else self.episode_seed + self.num_envs
            obs = self.reset(seed, None)
        return obs, reward, terminated, truncated, success, final

    def render(self, camera: str, size: int | None):
        return self.env.render(camera, size)

    def get(self, name: str):
        value = getattr(self.env, name)
        return value() if callable(value) else value

    def close(self):
        self.env.close()


def _worker_main(conn: Connection, spec: EnvSpec, index: int, num_envs: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    apply_thread_policy(1)  # one process per env: the cores are shared out by processes, not threads
    try:
        runner = EnvRunner(spec, index, num_envs)
        conn.send(("ok", None))
        while True:
            cmd, args = conn.recv()
            if cmd == "close":
                runner.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", getattr(runner, cmd)(*args)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return
    except Exception:  # report to the parent instead of dying silently
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass


class WorkerDied(RuntimeError):
    pass


START_ATTEMPTS = 5  # fresh workers for one env that may die in a row before their env is built, before giving up


class _InlineWorker:
    def __init__(self, spec: EnvSpec, index: int, num_envs: int):
        self.runner = EnvRunner(spec, index, num_envs)
        self._result = None

    def send(self, cmd: str, *args) -> None:
        self._result = getattr(self.runner, cmd)(*args)

    def recv(self, timeout: float | None = None):
        return self._result

    def kill(self) -> None:
        raise RuntimeError("an in-process env cannot be restarted")

    def close(self) -> None:
        self.runner.close()


class _ProcessWorker:
    """Env in a spawned process. Construction returns at once; `recv` waits for the env to be built."""

    def __init__(self, spec: EnvSpec, index: int, num_envs: int):
        ctx = mp.get_context("spawn")  # fork would inherit torch threads and GL contexts
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, spec, index, num_envs), daemon=True)
        self.process.start()
        child.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, cmd: str, *args) -> None:
        try:
            self.conn.send((cmd, args))
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(f"worker pid {self.pid}: {e}") from e

    def recv(self, timeout: float | None = None):
        try:
            if not self.conn.poll(timeout):
                raise WorkerDied(f"worker pid {self.pid} did not answer within {timeout} s")
            status, payload = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError) as e:
            raise WorkerDied(f"worker pid {self.pid} died ({e!r})") from e
        if status == "error":
            raise RuntimeError(f"env worker pid {self.pid} failed:\n{payload}")
        return payload

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def close(self) -> None:
        try:
            self.send("close")
            self.recv(10.0)
        except (WorkerDied, RuntimeError):
            pass
        self.kill()


def stack_obs(obs_list: list[dict]) -> Obs:
    """Per-env observation dicts of numpy arrays -> one dict of batched tensors [B, ...]."""
    return {k: torch.from_numpy(np.stack([o[k] for o in obs_list])) for k in obs_list[0]}


class VecEnv:
    """B envs stepped together. `workers="subprocess"` runs each in its own process.

    inline_envs (subprocess workers): the first k envs step in this process, after the workers were sent
    their actions and while they step. Waiting on B workers leaves this process's core idle for the whole
    step; with B = cores it is the core a worker needs, and the main process's share of every step (sending,
    receiving, stacking) lies on the step's critical path. Measured (benchmarks/env_throughput.py, Lift,
    2 envs on 2 cores): 2 workers 1.45x one env, 1 worker + 1 inline env 1.72x, 2 independent processes 2.01x.
    The price: an inline env that crashes takes the run down with it, since only worker processes are replaced.
    Runs use k = 1 (env.inline_envs); the class default keeps every env in a worker.
    """

    def __init__(
        self,
        spec: EnvSpec,
        num_envs: int,
        workers: str = "subprocess",
        autoreset: bool = True,
        step_timeout: float = 60.0,
        reset_timeout: float = 300.0,
        inline_envs: int = 0,
    ):
        if workers not in ("subprocess", "sync"):
            raise ValueError(f"env.workers must be 'subprocess' or 'sync', got {workers!r}")
        if not 0 <= inline_envs <= num_envs:
            raise ValueError(f"inline_envs={inline_envs}: must be in [0, num_envs={num_envs}]")
        self._worker_cls = _ProcessWorker if workers == "subprocess" else _InlineWorker
        self.inline_envs = inline_envs
        self._init_state(spec, num_envs, autoreset, step_timeout, reset_timeout)

    def _init_state(self, spec: EnvSpec, num_envs: int, autoreset: bool, step_timeout: float,
                    reset_timeout: float) -> None:
        """Everything but the worker kind; a subclass with other workers (envs.ray_runners) sets what its
        `_start_workers` needs and starts here."""
        self.spec, self.num_envs, self.autoreset = spec, num_envs, autoreset
        self.step_timeout, self.reset_timeout = step_timeout, reset_timeout
        self.num_restarts = 0
        self.lost_reasons: dict[int, str] = {}  # env i -> why its worker was last replaced
        # Envs whose episode a worker restart ended, until `step` reports them (or `reset_envs` restarts them)
        self._lost: set[int] = set()
        self.workers = self._start_workers()
        self._pending = None  # step_async's envs, their actions and the workers found dead, until step_wait
        self._obs: list[dict] = []
        self._seeds: list[int | None] = [None] * num_envs

    def _start_workers(self) -> list:
        # Start every worker before waiting on any: scene building (seconds) overlaps across workers.
        workers = [(_InlineWorker if i < self.inline_envs else self._worker_cls)(self.spec, i, self.num_envs)
                   for i in range(self.num_envs)]
        for i, w in enumerate(workers):
            try:
                w.recv(self.reset_timeout)
            except WorkerDied:  # killed while building its scene: replaced, as a running worker is
                self._replace_worker(workers, i, "died while starting")
        return workers

    def _replace_worker(self, workers: list, i: int, why: str) -> None:
        """Kill env i's worker in `workers` and wait for a fresh one to build its env; counted and logged. A fresh
        one that dies before its env is built is replaced too, up to START_ATTEMPTS times in a row."""
        for _ in range(START_ATTEMPTS):
            print(f"[env] worker of env {i} (pid {getattr(workers[i], 'pid', None)}) {why}; restarting it "
                  f"({self.num_restarts + 1} restart(s) so far)", file=sys.stderr, flush=True)
            workers[i].kill()
            workers[i] = _ProcessWorker(self.spec, i, self.num_envs)
            self.num_restarts += 1
            try:
                workers[i].recv(self.reset_timeout)
                return
            except WorkerDied as e:
                why = f"died while starting ({e})"
        raise WorkerDied(f"env {i}'s worker died {START_ATTEMPTS} times in a row before its env was built; the last: "
                         f"{why}")

    # -- metadata ------------------------------------------------------------------------------
    @property
    def action_dim(self) -> int:
        return ACTION_DIM

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if isinstance(w, _ProcessWorker)]

    def get(self, name: str) -> list:
        """Attribute `name` of every env (e.g. `instruction`, `task_id`, `sim_state`)."""
        return self._gather(range(self.num_envs), "get", lambda i: (name,), self.reset_timeout)

    @property
    def instructions(self) -> list[str]:
        return self.get("instruction")

    @property
    def episode_seeds(self) -> list[int | None]:
        """The seed each env's current episode started from (its auto-resets continue the stream from there):
        with `get("snapshot")`, what `reset_envs(ids, seed=seeds, options=[{"snapshot": s}, ...])` needs to
        continue the episodes exactly in new envs."""
        return list(self._seeds)

    # -- control -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: list[dict] | None = None) -> Obs:
        """Reset all envs; env i gets seed `seed + i` and `options[i]`."""
        return self.reset_envs(list(range(self.num_envs)), seed, options)

    def reset_envs(self, env_ids: list[int], seed=None, options: list[dict] | None = None) -> Obs:
        """Reset only `env_ids`; returns the obs of all envs.

        seed: int (env i gets `seed + i`), a list with one seed (or None) per entry of env_ids, or None.
        """
        opts = options or [None] * len(env_ids)
        args = dict(zip(env_ids, zip(per_env_seeds(env_ids, seed), opts)))
        results = self._gather(env_ids, "reset", lambda i: args[i], self.reset_timeout)
        if not self._obs:
            self._obs = [None] * self.num_envs
        for i, obs in zip(env_ids, results):
            self._obs[i], self._seeds[i] = obs, args[i][0]
        self._lost.difference_update(env_ids)  # their episodes start here, as the caller asked: nothing lost
        return stack_obs(self._obs)

    def step(self, actions: torch.Tensor | np.ndarray, active: np.ndarray | None = None) -> StepResult:
        """actions [B, A] in [-1, 1]. Envs with `active[i] == False` are not stepped (reward 0, no flags
        unless their episode was lost)."""
        self.step_async(actions, active)
        return self.step_wait()

    def step_async(self, actions: torch.Tensor | np.ndarray, active: np.ndarray | None = None) -> None:
        """Start `step(actions, active)`: the worker processes step while the caller works on; `step_wait`
        steps the in-process envs and returns the StepResult. Nothing else may be called in between."""
        if self._pending is not None:
            raise RuntimeError("step_async called twice without step_wait")
        actions = np.asarray(actions.detach().cpu() if torch.is_tensor(actions) else actions, dtype=np.float64)
        if actions.shape != (self.num_envs, self.action_dim):
            raise ValueError(f"actions must have shape {(self.num_envs, self.action_dim)}, got {actions.shape}")
        # An env whose episode was lost since the last step is not stepped: the action was meant for the old one
        ids = [i for i in range(self.num_envs) if (active is None or active[i]) and i not in self._lost]
        check_finite_actions(actions[ids], ids)
        args_of = lambda i: (actions[i], self.autoreset)  # noqa: E731
        self._pending = (ids, args_of, self._begin(ids, "step", args_of, inline=False))

    def step_wait(self) -> StepResult:
        """The StepResult of the `step_async` call before."""
        if self._pending is None:
            raise RuntimeError("step_wait called without step_async")
        ids, args_of, started = self._pending
        self._pending = None
        reward = np.zeros(self.num_envs, np.float32)
        terminated, truncated, success, lost = (np.zeros(self.num_envs, bool) for _ in range(4))
        next_obs = list(self._obs)
        for i, out in zip(ids, self._finish(ids, "step", args_of, started, self.step_timeout)):
            if out is None:  # its worker died and was replaced: in self._lost, reported below
                continue
            obs, reward[i], terminated[i], truncated[i], success[i], final = out
            next_obs[i] = obs if final is None else final
            self._obs[i] = obs
            if final is not None and self._seeds[i] is not None:  # its worker began the stream's next episode
                self._seeds[i] += self.num_envs
        # Lost episodes end here, truncated, not a transition (next_obs: a copy of an observation, see module doc)
        lost_ids = sorted(self._lost)
        truncated[lost_ids] = lost[lost_ids] = True
        self._lost.clear()
        return StepResult(
            obs=stack_obs(self._obs),
            reward=torch.from_numpy(reward),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            success=torch.from_numpy(success),
            next_obs=stack_obs(next_obs),
            lost=torch.from_numpy(lost),
        )

    def render(self, env_ids: list[int] | None = None, camera: str = "agentview", size: int | None = None) -> np.ndarray:
        """Upright frames [n, H, W, 3] uint8 of `env_ids` (default all)."""
        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        return np.stack(self._gather(ids, "render", lambda i: (camera, size), self.step_timeout))

    # -- workers -------------------------------------------------------------------------------
    def _gather(self, env_ids, cmd: str, args_of, timeout: float) -> list:
        """Send `cmd` to each env in env_ids, then collect answers. A dead worker answers None
        (for step) after it has been replaced and its env reset."""
        env_ids = list(env_ids)
        return self._finish(env_ids, cmd, args_of, self._begin(env_ids, cmd, args_of, inline=False), timeout)

    def _begin(self, env_ids: list[int], cmd: str, args_of, inline: bool) -> dict[int, str]:
        """Send `cmd` to the worker processes of env_ids (and to the in-process envs too when `inline`, which
        execute it at once); returns {env: why} for the workers found dead."""
        failed: dict[int, str] = {}
        for i in env_ids:
            if inline or not isinstance(self.workers[i], _InlineWorker):
                try:
                    self.workers[i].send(cmd, *args_of(i))
                except WorkerDied as e:
                    failed[i] = str(e)
        return failed

    def _finish(self, env_ids: list[int], cmd: str, args_of, failed: dict[int, str], timeout: float) -> list:
        """The answers of env_ids to a `cmd` that `_begin` sent to the worker processes: the in-process envs
        execute it now (after the workers were sent theirs, so the workers run meanwhile)."""
        inline = [i for i in env_ids if isinstance(self.workers[i], _InlineWorker)]
        failed = failed | self._begin(inline, cmd, args_of, inline=True)
        results = []
        for i in env_ids:
            if i not in failed:
                try:
                    results.append(self.workers[i].recv(timeout))
                    continue
                except WorkerDied as e:
                    failed[i] = str(e)
            self.lost_reasons[i] = f"{cmd}: {failed[i]}"
            self._restart(i)
            if cmd == "step":
                results.append(None)
            else:  # retry once on the fresh worker
                self.workers[i].send(cmd, *args_of(i))
                results.append(self.workers[i].recv(timeout))
        return results

    def _restart(self, i: int) -> None:
        """Replace env i's worker and start a new episode there (seeded from its stream)."""
        self._replace_worker(self.workers, i, "died")
        self.workers[i].send("reset", self._next_episode_seed(i), None)
        obs = self.workers[i].recv(self.reset_timeout)
        if self._obs:
            self._obs[i] = obs
        self._lost.add(i)

    def _next_episode_seed(self, i: int) -> int | None:
        """The seed of env i's next episode in its stream (see EnvRunner.step), recorded as its current one."""
        seed = None if self._seeds[i] is None else self._seeds[i] + self.num_envs
        self._seeds[i] = seed
        return seed

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "workers", None):
            self.close()
