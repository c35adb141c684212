"""Run logging: wandb (offline by default) plus a local metrics.jsonl that survives crashes."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


class RunLogger:
    """`log(metrics, step)` writes one JSON line (flushed) and forwards to wandb when enabled."""

    def __init__(self, run_dir: str | Path, cfg: DictConfig, name: str):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
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

    def log(self, metrics: dict, step: int) -> None:
        record = {"step": step, "time_s": round(time.time() - self._start, 2), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
