"""One writer per run directory: a run holds `run.lock` there for as long as its process lives.

The lock is an advisory `flock` on the file, which the kernel releases when the holder's process ends however it
ends (SIGKILL included), so a lock is never left held by a dead run; the file keeps the holder's pid and host
for the message a second process gets, and for noticing a lock file whose holder is gone (a stale lock: taken
over, with a note).
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from robo_rl.utils.schema import ConfigError

LOCK_FILE = "run.lock"
_held: dict[Path, int] = {}  # run directories this process holds -> the lock file's descriptor


def hold_run_dir(run_dir: str | Path) -> None:
    """Take run_dir's lock for the rest of this process (a no-op where this process holds it already); a run
    directory another live process holds is refused with a ConfigError naming that process."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 256).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"hydra.run.dir={run_dir} is held by a live run ({holder}): one process writes a run "
                          "directory; wait for it to end, stop it (SIGTERM: it checkpoints first), or pass another "
                          "hydra.run.dir") from None
    previous = os.read(fd, 256).decode(errors="replace").strip()
    if previous:
        print(f"[run] {path}: took over the lock of a run that is gone ({previous})", flush=True)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _held[run_dir] = fd


def release_run_dir(run_dir: str | Path) -> None:
    """Give run_dir's lock back before this process ends (tests; a process that ends releases it anyway)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)
