"""How many more env workers fit in memory. A LIBERO env worker holds 1.5-2.5 GB (its MuJoCo model, textures,
renderer), so an evaluation's own envs beside 8 training envs can exhaust a 24 GB machine, and the kernel then
kills the run. Measured from the live workers, not guessed per suite."""
from __future__ import annotations

import os

USABLE_FRACTION = 0.8  # of the memory available now; the rest is left to the trainer's own growth (buffer, eval)


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def envs_that_fit(wanted: int, beside_pids: list[int]) -> int:
    """`wanted`, or fewer (at least 1) where that many more workers, each as large as the largest of the live
    workers `beside_pids`, would not fit in USABLE_FRACTION of the memory available now."""
    per_env = max((rss_bytes(pid) for pid in beside_pids), default=0)
    available = available_bytes()
    if not per_env or available is None:
        return wanted
    return max(1, min(wanted, int(USABLE_FRACTION * available // per_env)))
