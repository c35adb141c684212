"""Offline pretraining: gradient steps on the demonstrations in the replay buffer."""
from __future__ import annotations

from tqdm import tqdm

from robo_rl.train.trainer import Trainer


class OfflineTrainer(Trainer):
    """Updates on the buffer's demonstrations up to `budget.offline_steps`; a checkpoint every
    `budget.checkpoint_every` steps and at the end. Without demonstrations, or once online training
    has started (a resumed run), there is nothing to do."""

    phase = "offline"

    def train(self) -> None:
        budget, progress = self.cfg.budget, self.progress
        if not self.buffer.num_offline or progress.offline_step >= budget.offline_steps or progress.env_steps:
            return
        start = progress.offline_step
        bar = tqdm(range(start, budget.offline_steps), desc="offline", initial=start, total=budget.offline_steps,
                   dynamic_ncols=True, disable=not self.main)
        for step in bar:
            metrics = self.update()
            progress.offline_step = step + 1
            if (step + 1) % budget.log_every == 0 or step + 1 == budget.offline_steps:
                self.logger.log({f"offline/{k}": v for k, v in metrics.items()}, step + 1)
                bar.set_postfix(fm=f"{metrics['fm_loss']:.3f}", critic=f"{metrics['critic_loss']:.3f}")
            if (step + 1) % budget.checkpoint_every == 0 or step + 1 == budget.offline_steps:
                self.save()
        bar.close()
