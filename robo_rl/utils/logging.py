"""Run logging: wandb (offline by default) plus a local metrics.jsonl that survives crashes; what a person reads.

One step axis for the whole run: offline gradient steps, then `offline_steps + env_steps` online
(records carry `env_steps` too). Steps never go back: a resumed run first drops the records that
were logged after the checkpoint it resumes from, as it will log those steps again.

For the person watching: `progress_bar` is tqdm on a terminal and one line per 10% when piped or logged (a bar
rewritten in place is one unreadable line in a file); `tee_output` copies everything a script prints into the run
directory's log, progress bars as their finished lines.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from robo_rl.utils.schema import to_plain


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` at `path`, atomically (a temp file, then rename): a crash leaves the old file whole."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: str | Path, data: dict) -> None:
    """`data` as indented JSON at `path`, atomically."""
    write_text_atomic(path, json.dumps(data, indent=2))


class RunLogger:
    """`log(metrics, step)` writes one JSON line (flushed) and forwards to wandb when enabled.

    resume_step: records after this step are dropped first: the step of the checkpoint a resumed run
    continues from, -1 for a run that starts (over) from nothing; None keeps the file as it is.
    """

    def __init__(self, run_dir: str | Path, cfg: Any, name: str, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.last_step = -1
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self._file = self.path.open("a")
        self._start = time.time()
        self._wandb = None
        if cfg.logger.mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=cfg.logger.project, entity=cfg.logger.entity, mode=cfg.logger.mode, name=name,
                dir=str(run_dir), config=to_plain(cfg), resume="allow",
                # one wandb run per run directory, so `resume=true` continues the same curves
                id=hashlib.md5(str(Path(run_dir).resolve()).encode()).hexdigest()[:12],
            )
            # Our step is an x-axis metric, not wandb's internal step (which a resumed run can only
            # append to): steps re-logged after a resume stay on the plot instead of being dropped.
            self._wandb.define_metric("step")
            self._wandb.define_metric("*", step_metric="step")

    def _truncate_after(self, step: int) -> None:
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # the line a crash cut short
                continue
        kept = [r for r in records if r["step"] <= step]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.last_step = kept[-1]["step"] if kept else -1

    def log(self, metrics: dict, step: int) -> None:
        if step < self.last_step:
            raise ValueError(f"log step {step} is below the last logged step {self.last_step}: steps must not go back")
        self.last_step = step
        record = {"step": step, "time_s": round(time.time() - self._start, 2), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({**metrics, "step": step})

    def log_videos(self, paths: list[str], step: int, key: str = "eval/video") -> None:
        """The evaluation's mp4 files to wandb (when on), one panel each; they stay in the run directory anyway."""
        if self._wandb is None or not paths:
            return
        import wandb

        self._wandb.log({**{f"{key}_{i}": wandb.Video(str(p), format="mp4") for i, p in enumerate(paths)},
                         "step": step})

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def progress_bar(iterable: Iterable | None = None, *, total: int, **kwargs: Any) -> tqdm:
    """tqdm on a terminal; else (piped, redirected to a file) one line per 10% of `total`, each ending in a
    newline, so that results printed between them start lines of their own."""
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, dynamic_ncols=True, **kwargs)
    return _LineBar(iterable, total=total, file=_Lines(sys.stderr), mininterval=0, miniters=max(1, total // 10),
                    ncols=100, **kwargs)


class _LineBar(tqdm):
    """tqdm drawn only every `miniters` steps: a new postfix waits for the next line, and closing does not repeat
    the last one."""

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        if getattr(self, "_shown", None) == self.n:
            return True
        self._shown = self.n
        return super().display(msg, pos)


class _Lines:
    """A stream for tqdm that turns each redraw ('\\r' + status) into a line of its own, and drops blank ones."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> None:
        status = text.replace("\r", "").strip()
        if status:
            self.stream.write(status + "\n")

    def flush(self) -> None:
        self.stream.flush()


class _Tee:
    """A text stream that writes to `stream` and, line by line, to `log`: of a line redrawn with '\\r' (a progress
    bar on a terminal) only what stands when it ends."""

    def __init__(self, stream: IO[str], log: IO[str]):
        self.stream, self.log, self._line = stream, log, ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        *done, self._line = (self._line + text).split("\n")
        for line in done:
            if line := line.rsplit("\r", 1)[-1].rstrip():
                self.log.write(line + "\n")
        self.log.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ...: the terminal's
        return getattr(self.stream, name)


@contextlib.contextmanager
def tee_output(log_path: str | Path) -> Iterator[None]:
    """Within: stdout and stderr also go to `log_path` (appended: Hydra's own log lines land there too)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out, err = sys.stdout, sys.stderr
    with log_path.open("a") as log:
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            for tee in (sys.stdout, sys.stderr):
                if tee._line.strip():  # a last line without its newline
                    tee.write("\n")
            sys.stdout, sys.stderr = out, err
