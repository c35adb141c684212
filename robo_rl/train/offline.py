"""Offline pretraining: gradient steps on the demonstrations in the replay buffer."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from tqdm import tqdm

from robo_rl.agents.sorl import SORLAgent
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.train.curves import LearningCurve
from robo_rl.train.trainer import Progress, Trainer
from robo_rl.utils.logging import RunLogger


class OfflineTrainer(Trainer):
    """Updates on the buffer's demonstrations up to `budget.offline_steps`; a checkpoint every
    `budget.checkpoint_every` steps and at the end. Without demonstrations, or once online training
    has started (a resumed run), there is nothing to do.

    With `budget.offline_eval_every` > 0 the policy alone is evaluated every that many steps (a point of
    the curve's offline panel): the Q term can pull the policy off the demonstrations the longer it trains
    (README, "Where pretraining falls off"), and this is where a run shows it.
    """

    phase = "offline"

    def __init__(self, cfg: DictConfig, agent: SORLAgent, buffer: ReplayBuffer, logger: RunLogger, run_dir: Path,
                 progress: Progress, curve: LearningCurve):
        super().__init__(cfg, None, agent, buffer, logger, run_dir, progress)
        self.curve = curve

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
            if budget.offline_eval_every and (step + 1) % budget.offline_eval_every == 0 and self.main:
                rate = self.eval(f"offline{step + 1}", ["none"])["actors"]["none"]["success_rate"]
                self.curve.add_offline(step + 1, rate)
                self.logger.log({"eval/offline_curve_success_rate": rate}, step + 1)
            if (step + 1) % budget.checkpoint_every == 0 or step + 1 == budget.offline_steps:
                self.save()
        bar.close()
