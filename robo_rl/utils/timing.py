"""Where a loop's wall time goes: seconds per named section, and the rest of the loop as "other"."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class SectionTimer:
    """`with timer("update"): ...` adds the block's wall seconds to its section; `split()` returns every
    section's seconds since the timer started, with the time spent outside all sections as "other"."""

    def __init__(self, sections: tuple[str, ...]):
        self.seconds = dict.fromkeys(sections, 0.0)
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[section] += time.perf_counter() - start

    def split(self) -> dict[str, float]:
        total = time.perf_counter() - self.started
        return {**self.seconds, "other": total - sum(self.seconds.values())}
