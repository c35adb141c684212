"""Run logging: wandb (offline by default) plus a local metrics.jsonl that survives crashes.

One step axis for the whole run: offline gradient steps, then `offline_steps + env_steps` online
(records carry `env_steps` too). Steps never go back: a resumed run first drops the records that
were logged after the checkpoint it resumes from, as it will log those steps again.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


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

    def __init__(self, run_dir: str | Path, cfg: DictConfig, name: str, resume_step: int | None = None):
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
                dir=str(run_dir), config=OmegaConf.to_container(cfg, resolve=True), resume="allow",
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

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
