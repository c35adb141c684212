"""Stopping on SIGINT / SIGTERM without losing work: a cluster preempts a job with SIGTERM, a person presses Ctrl-C.

Training asks for a stop at the next step boundary: the first signal sets a flag, the trainer finishes its
current step, writes a complete checkpoint and raises StopRequested; the script prints how to resume and exits
with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process a signal ended.
A second signal stops at once, with the signal's default action: the newest complete checkpoint stays valid,
since every checkpoint file is written to a temp file and renamed. Evaluation stops at the first signal: the
episodes it finished are already in its journal.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(Exception):
    """A signal asked the process to stop; `exit_code` is 128 + its number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class GracefulStop:
    """`with GracefulStop() as stop:` catches SIGINT and SIGTERM; `stop.signum` is the first one received (None:
    none). at_once=True raises StopRequested from the first signal (evaluation); else the work polls `stop.signum`
    at its step boundaries. Outside the main thread (signal handlers cannot be set there) it catches nothing."""

    def __init__(self, at_once: bool = False):
        self.at_once = at_once
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def stop_at_once(self) -> None:
        """From now on the first signal raises StopRequested at once; a signal caught before raises it now."""
        self.at_once = True
        if self.signum is not None:
            raise StopRequested(self.signum, f"stopped by {signal.Signals(self.signum).name}")

    @contextmanager
    def at_once_within(self) -> Iterator[None]:
        """Within the block, as after stop_at_once(); after it, the first signal stops as it did before the block
        (work that is no step, such as an evaluation inside training, is not waited for)."""
        before = self.at_once
        try:
            self.stop_at_once()
            yield
        finally:
            self.at_once = before

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second signal: its default action, now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        if self.at_once:
            raise StopRequested(signum, f"stopped by {name}")
        print(f"[run] {name}: stopping after the current step with a checkpoint (a second signal stops at once)",
              file=sys.stderr, flush=True)
