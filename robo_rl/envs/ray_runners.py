"""`env.backend=ray`: the envs of a VecEnv spread over Ray actors, on one machine or a cluster.

Each runner is a Ray actor holding a batch of envs (the same `EnvRunner`s the other backends use, stepped
in turn inside the actor); the learner sees the VecEnv interface unchanged (`reset`, `reset_envs`, `step`
with auto-reset and per-env seed streams, `render`, `get`, StepResult with `lost`). Env i lives in runner
i mod R, so every runner gets envs when num_envs >= R.

A runner that dies (killed, OOM, simulator crash) or stops answering within the step timeout is restarted
by Ray (`max_restarts`, unbounded by default as the subprocess backend replaces workers without limit; Ray
re-runs the actor's constructor, which rebuilds its envs). Its envs' episodes end there, reported truncated
*and* lost as a dead subprocess worker's are, and their next episodes start from their seed streams. Each
incarnation of a runner draws a fresh id and refuses calls addressed to an older one: a call that reaches a
restarted runner never steps its fresh, un-reset envs as if they were the old episodes.

`init_ray()` joins the cluster at RAY_ADDRESS when it is set, else starts a small local one.
"""
from __future__ import annotations

import os
import pickle
import sys
import time
import uuid

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from robo_rl.envs.spec import EnvSpec
from robo_rl.envs.vector import EnvRunner, VecEnv, WorkerDied
from robo_rl.utils.threads import apply_thread_policy

# A runner being restarted answers with one of these until its constructor has run again.
_DOWN = (RayActorError, ActorUnavailableError)


def init_ray(num_cpus: float = 2) -> None:
    """Join RAY_ADDRESS's cluster when set; otherwise start a local one with `num_cpus` logical CPUs (Ray's
    scheduling units, not cores), no dashboard and a small object store (observations are small; Ray's
    default takes 30% of RAM)."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level="WARNING")
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=256 * 2**20,
                 logging_level="WARNING")


class EnvRunnerGroup:
    """Ray actor body: the EnvRunners of global env indices `env_ids` (of a VecEnv of `num_envs`)."""

    def __init__(self, spec: EnvSpec, env_ids: list[int], num_envs: int):
        apply_thread_policy(1)  # one actor per CPU it reserves; intra-op threads would oversubscribe
        self.incarnation = uuid.uuid4().hex
        self.runners = {i: EnvRunner(spec, i, num_envs) for i in env_ids}

    def ready(self) -> tuple[str, int]:
        """(this incarnation's id, process id), once every env is built."""
        return self.incarnation, os.getpid()

    def run(self, message: bytes) -> bytes:
        """message: pickled (incarnation, cmd, calls). Answers pickled ("ok", [runner i's `cmd(*args)` for
        (i, args) in calls]), or ("restarted", []) when the caller addressed an earlier incarnation: these envs
        are not the ones it was stepping. Pickled here, not by Ray: Ray serializes every argument and every
        numpy array of a return on its own, which cost the driver ~0.25 ms per step (benchmarks/scale_out.py)."""
        incarnation, cmd, calls = pickle.loads(message)
        if incarnation != self.incarnation:
            return pickle.dumps(("restarted", []), protocol=pickle.HIGHEST_PROTOCOL)
        results = [getattr(self.runners[i], cmd)(*args) for i, args in calls]
        return pickle.dumps(("ok", results), protocol=pickle.HIGHEST_PROTOCOL)

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()


class RayVecEnv(VecEnv):
    """num_envs envs over `num_runners` Ray actors of `runner_cpus` CPUs each (Ray places them)."""

    def __init__(self, spec: EnvSpec, num_envs: int, num_runners: int = 2, runner_cpus: float = 1.0,
                 autoreset: bool = True, step_timeout: float = 60.0, reset_timeout: float = 300.0,
                 max_restarts: int = -1):
        if num_runners < 1:
            raise ValueError(f"env.runners={num_runners}: must be >= 1")
        num_runners = min(num_runners, num_envs)  # a runner without envs would only hold a CPU
        # A local cluster is sized for two VecEnvs of this shape: a run's training envs stay up (idle) while
        # an evaluation's envs play, and both reserve their runners' CPUs.
        init_ray(num_cpus=max(2, 2 * num_runners * runner_cpus))
        self.env_ids = [list(range(r, num_envs, num_runners)) for r in range(num_runners)]
        self._actor_cls = ray.remote(EnvRunnerGroup).options(num_cpus=runner_cpus, max_restarts=max_restarts,
                                                               max_task_retries=0)
        self.incarnations: list[str] = [""] * num_runners
        self.runner_pids: list[int] = [0] * num_runners
        self._init_state(spec, num_envs, autoreset, step_timeout, reset_timeout)

    def _start_workers(self) -> list:
        """The runner actors (`self.workers[r]` holds envs `self.env_ids[r]`), all started before waiting."""
        self.workers = [self._actor_cls.remote(self.spec, ids, self.num_envs) for ids in self.env_ids]
        for r in range(len(self.workers)):
            self._await(r, self.reset_timeout)
        return self.workers

    @property
    def pids(self) -> list[int]:
        """Process ids of the runner actors (on their nodes)."""
        return list(self.runner_pids)

    def _await(self, r: int, timeout: float) -> None:
        """Wait until runner r answers (built or rebuilt by Ray) and record its incarnation."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.incarnations[r], self.runner_pids[r] = ray.get(
                    self.workers[r].ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except ActorUnavailableError:  # restarting: ask again
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            except GetTimeoutError:
                break
            except RayActorError as e:  # restarts exhausted, or its constructor keeps failing
                raise WorkerDied(f"Ray env runner {r} (envs {self.env_ids[r]}) is dead and Ray will not restart it: "
                                 f"{e}") from e
        raise WorkerDied(
            f"Ray env runner {r} (envs {self.env_ids[r]}) was not up within {timeout:.0f} s; the cluster has "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs for runners asking for "
            f"{len(self.workers)} x env.runner_cpus: lower env.runners / env.runner_cpus or add Ray nodes")

    def _run(self, r: int, cmd: str, calls: list[tuple[int, tuple]]) -> ray.ObjectRef:
        """Runner r's `run` on calls [(env i, args)]; its answer is read by `_answer`."""
        message = pickle.dumps((self.incarnations[r], cmd, calls), protocol=pickle.HIGHEST_PROTOCOL)
        return self.workers[r].run.remote(message)

    @staticmethod
    def _answer(ref: ray.ObjectRef, timeout: float) -> tuple[str, list]:
        return pickle.loads(ray.get(ref, timeout=timeout))

    def _begin(self, env_ids: list[int], cmd: str, args_of, inline: bool) -> dict[int, tuple[list[int], ray.ObjectRef]]:
        """`cmd` sent to every env of env_ids, one call per runner, all runners at once (no env runs in this
        process, whatever `inline` says); returns {runner: (its envs, the answer's ref)} for `_finish`."""
        groups = {r: [i for i in env_ids if i in ids] for r, ids in enumerate(self.env_ids)}
        return {r: (ids, self._run(r, cmd, [(i, args_of(i)) for i in ids])) for r, ids in groups.items() if ids}

    def _finish(self, env_ids: list[int], cmd: str, args_of, started: dict, timeout: float) -> list:
        """The answers of env_ids to the `cmd` that `_begin` sent. The envs of a runner that died answer None
        (for step) once Ray has restarted it and new episodes began in all its envs (all of them in
        `self._lost`, the next StepResult reports them)."""
        groups = {r: ids for r, (ids, _) in started.items()}
        refs = {r: ref for r, (_, ref) in started.items()}
        deadline = time.monotonic() + timeout
        try:  # one wait for all runners (one ray.get per runner cost the driver ~0.1 ms more per step)
            answers = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout)))
        except (GetTimeoutError, *_DOWN):  # find out below which runner failed; the others answer at once
            answers = {}
        out: dict[int, object] = {}
        for r, ids in groups.items():
            try:
                status, results = (pickle.loads(answers[r]) if r in answers
                                   else self._answer(refs[r], max(0.0, deadline - time.monotonic())))
                if status == "ok":
                    out.update(zip(ids, results))
                    continue
                why = "was restarted by Ray"
            except GetTimeoutError:
                why = f"did not answer within {timeout} s"
                ray.kill(self.workers[r], no_restart=False)  # Ray restarts it, as it would a crashed one
            except _DOWN as e:
                why = f"died ({type(e).__name__})"
            self._restart_runner(r, f"{cmd}: runner {r} {why}")
            if cmd == "step":
                out.update(dict.fromkeys(ids))
                continue
            status, results = self._answer(self._run(r, cmd, [(i, args_of(i)) for i in ids]), timeout)
            if status != "ok":
                raise WorkerDied(f"Ray env runner {r} died again while retrying {cmd!r}")
            out.update(zip(ids, results))
        return [out[i] for i in env_ids]

    def _restart_runner(self, r: int, why: str) -> None:
        """Wait for Ray's restart of runner r, then start new episodes in all its envs (seeded from their
        streams): each env's old episode is gone with the old actor. Counted and logged."""
        print(f"[env] Ray env runner {r} (envs {self.env_ids[r]}, pid {self.runner_pids[r]}) {why}; waiting for "
              f"its restart ({self.num_restarts + 1} restart(s) so far)", file=sys.stderr, flush=True)
        self._await(r, self.reset_timeout)
        self.num_restarts += 1
        ids = self.env_ids[r]
        for i in ids:
            self.lost_reasons[i] = why
        self._lost.update(ids)  # every env of the runner, whether this call addressed it or not
        calls = [(i, (self._next_episode_seed(i), None)) for i in ids]
        status, obs = self._answer(self._run(r, "reset", calls), self.reset_timeout)
        if status != "ok":
            raise WorkerDied(f"Ray env runner {r} was restarted again while resetting its envs")
        if self._obs:
            for i, o in zip(ids, obs):
                self._obs[i] = o

    def close(self) -> None:
        """Stop the runner actors (the Ray cluster stays up for other VecEnvs of this process)."""
        runners, self.workers = self.workers, []
        for actor in runners:
            try:
                ray.get(actor.close.remote(), timeout=10)
            except (GetTimeoutError, *_DOWN):
                pass
            ray.kill(actor, no_restart=True)
