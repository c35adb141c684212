"""One thread policy for every robo_rl process: how many threads torch computes with, and how long its
idle OpenMP threads spin before they sleep.

Why: torch's CPU kernels run on OpenMP (libgomp), whose idle threads by default spin for ~300k iterations
before they sleep. On a machine with as many busy threads as cores, a spinning thread holds a core that
another process needed, and every op of every process waits on descheduled threads: two trainings on 2 cores
each ran at 0.45-0.7 updates/s instead of ~4 (`benchmarks/online_loop.py`, docs/results.md "Threads").
A spin of 1000 iterations keeps the hand-off between an op's threads fast when the machine is free (one
process: 7.8-8.3 updates/s against 6.3-7.8 with the default spin) and lets a second process run at about
half speed, as two jobs on shared cores should.

The spin must be in the environment before libgomp loads (it reads it once, when torch is imported), so
entry points call `prepare_openmp()` first thing; `apply_thread_policy` then sets the thread count and
returns what is in effect, for the run to record. Env workers compute on one thread each (envs/vector.py):
a worker is one process per env, and the cores are shared out by processes. Mesa's renderer threads
(LP_NUM_THREADS) are left at Mesa's default: two image envs stepped alike with 1 or 2 render threads.
"""
from __future__ import annotations

import os
import sys

SPIN_COUNT = 1000  # GOMP_SPINCOUNT: iterations an idle OpenMP thread spins before it sleeps (libgomp: 300000)
# "auto" threads: the cores this process may use, at most this many. The nets are 256-512 wide at batch 256:
# beyond a few threads an op's share per thread is too small to pay for the threads' hand-off.
MAX_AUTO_THREADS = 8
_USER_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def prepare_openmp() -> bool:
    """Set the short OpenMP spin for this process and the processes it starts, unless the user set a wait
    policy of their own. Call it before torch is imported; returns whether the spin policy is in effect."""
    if any(k in os.environ for k in _USER_WAIT_SETTINGS):
        return True
    if "torch" in sys.modules:  # libgomp already read its settings: setting them now would only mislead
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_threads(setting: int | str, processes: int = 1) -> int:
    """torch intra-op threads for a `threads` setting: a number, or "auto": this process's share of the usable
    cores when `processes` learners share the machine (torchrun's ranks on one node), at most MAX_AUTO_THREADS;
    1 where OpenMP's threads would spin at length (torch loaded before `prepare_openmp` could set the short
    spin), as long-spinning threads starve every other process."""
    if setting != "auto":
        return int(setting)
    if not any(k in os.environ for k in _USER_WAIT_SETTINGS):
        return 1
    return max(1, min(usable_cores() // max(processes, 1), MAX_AUTO_THREADS))


def apply_thread_policy(setting: int | str = "auto", processes: int = 1) -> dict[str, int | str | None]:
    """Set torch's intra-op threads by `setting` (see resolve_threads); returns what is in effect:
    {"torch_threads", "omp_spin" (GOMP_SPINCOUNT or None), "omp_wait_policy" (or None), "cores"}."""
    import torch

    torch.set_num_threads(resolve_threads(setting, processes))
    return threads_in_effect()


def threads_in_effect() -> dict[str, int | str | None]:
    """What this process computes with now (see apply_thread_policy)."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "omp_spin": os.environ.get("GOMP_SPINCOUNT"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cores": usable_cores()}


def describe(policy: dict) -> str:
    """One line for the run's output: what `apply_thread_policy` returned."""
    wait = (f"OMP_WAIT_POLICY={policy['omp_wait_policy']}" if policy["omp_wait_policy"]
            else f"GOMP_SPINCOUNT={policy['omp_spin']}" if policy["omp_spin"] else "OpenMP's default spin")
    return f"[threads] torch {policy['torch_threads']} intra-op thread(s) on {policy['cores']} core(s), {wait}"
