"""Offline pretraining: gradient steps on demonstrations from the replay buffer."""
from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig
from tqdm import tqdm

from robo_rl.agents.sorl import SORLAgent
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.train.common import gradient_step
from robo_rl.utils.logging import RunLogger


def pretrain(cfg: DictConfig, agent: SORLAgent, buffer: ReplayBuffer, start_step: int, logger: RunLogger,
             checkpoint: Callable[[int], None]) -> None:
    """Run offline updates `start_step .. budget.offline_steps`; `checkpoint(step)` every checkpoint_every."""
    budget = cfg.budget
    bar = tqdm(range(start_step, budget.offline_steps), desc="offline", initial=start_step,
               total=budget.offline_steps, dynamic_ncols=True)
    for step in bar:
        metrics = gradient_step(cfg, agent, buffer)
        if (step + 1) % budget.log_every == 0 or step + 1 == budget.offline_steps:
            logger.log({f"offline/{k}": v for k, v in metrics.items()}, step + 1)
            bar.set_postfix(fm=f"{metrics['fm_loss']:.3f}", critic=f"{metrics['critic_loss']:.3f}")
        if (step + 1) % budget.checkpoint_every == 0 or step + 1 == budget.offline_steps:
            checkpoint(step + 1)
    bar.close()
