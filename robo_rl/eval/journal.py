"""An evaluation's finished episodes, one JSON line each, appended as they finish (`episodes.jsonl` beside
eval.json): an evaluation killed at any moment loses only the episodes that were running, and a rerun in
the same directory plays only the episodes the file does not hold.

An episode is identified by `episode_key`: actor, task, init state and seed, the job the episode scheduler
(robo_rl/eval/rollout.py) hands out. The first line holds the evaluation's settings (task, policy or
checkpoint, planner, ...): episodes recorded under other settings are other episodes, so a rerun with
different settings is refused rather than mixed in.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from robo_rl.utils.logging import write_text_atomic
from robo_rl.utils.schema import ConfigError

EPISODES_FILE = "episodes.jsonl"


def episode_key(actor: str, task_id: int, init_state_id: int | None, seed: int) -> tuple:
    """One evaluation episode's identity."""
    return actor, task_id, init_state_id, seed


class EpisodeJournal:
    """Append-only record of finished episodes at `path` for an evaluation with `settings` (JSON-able)."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.records: dict[tuple, dict] = {}
        settings = json.loads(json.dumps(settings))  # as it reads back from JSON (tuples become lists)
        if not self.path.exists():
            write_text_atomic(self.path, json.dumps({"settings": settings}) + "\n")
            return
        lines = self.path.read_text().splitlines()
        saved = json.loads(lines[0])["settings"]
        if saved != settings:
            changed = sorted(k for k in {**saved, **settings} if saved.get(k) != settings.get(k))
            raise ConfigError(f"{self.path} holds episodes of an evaluation with other {', '.join(changed)}: pass a "
                              "new hydra.run.dir, or the same settings to resume that evaluation")
        for i, line in enumerate(lines[1:], 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if i < len(lines) - 1:
                    raise
                # The last line of a killed evaluation, half written: dropped, its episode is played again.
                write_text_atomic(self.path, "\n".join(lines[:-1]) + "\n")
                break
            self.records[self.key(record)] = record

    @staticmethod
    def key(record: dict) -> tuple:
        return episode_key(record["actor"], record["task_id"], record["init_state_id"], record["seed"])

    def append(self, record: dict) -> None:
        """Record one finished episode, on disk before this returns."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[self.key(record)] = record
