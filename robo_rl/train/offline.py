"""Offline pretraining: gradient steps on the demonstrations in the replay buffer."""
from __future__ import annotations

from pathlib import Path


from robo_rl.agents.sorl import SORLAgent
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.schemas import TrainConfig
from robo_rl.train.curves import LearningCurve
from robo_rl.train.trainer import OFFLINE_EVAL, Progress, Trainer
from robo_rl.utils.logging import RunLogger, progress_bar, write_json
from robo_rl.utils.shutdown import GracefulStop


class OfflineTrainer(Trainer):
    """Updates on the buffer's demonstrations up to `budget.offline_steps`; a checkpoint every
    `budget.checkpoint_every` steps and at the end. Without demonstrations, or once online training
    has started (a resumed run), there is nothing to do.

    With `budget.offline_eval_every` > 0 the policy alone is evaluated every that many steps (a point of
    the curve's offline panel): the Q term can pull the policy off the demonstrations the longer it trains
    (docs/results.md, "Where pretraining falls off"), and this is where a run shows it.
    """

    phase = "offline"

    def __init__(self, cfg: TrainConfig, agent: SORLAgent, buffer: ReplayBuffer, logger: RunLogger, run_dir: Path,
                 progress: Progress, curve: LearningCurve, stop: GracefulStop | None = None):
        super().__init__(cfg, None, agent, buffer, logger, run_dir, progress, stop)
        self.curve = curve

    def train(self) -> None:
        budget, progress = self.cfg.budget, self.progress
        if not self.buffer.num_offline or progress.offline_step >= budget.offline_steps or progress.env_steps:
            return
        window = self.world_model_window
        if self.agent.world_model is not None and not self.buffer.can_sample_sequences(window) and self.main:
            print(f"[data] warning: no demo has the {window} steps of a world-model window (budget.seq_horizon "
                  f"x agent.action_horizon): the world model trains on online episodes only")
        start = progress.offline_step
        bar = progress_bar(range(start, budget.offline_steps), desc="offline", initial=start, total=budget.offline_steps,
                           disable=not self.main)
        for step in bar:
            self.stop_if_asked()
            metrics = self.update()
            progress.offline_step = step + 1
            if (step + 1) % budget.log_every == 0 or step + 1 == budget.offline_steps:
                self.logger.log({f"offline/{k}": v for k, v in metrics.items()}, step + 1)
                bar.set_postfix(fm=f"{metrics['fm_loss']:.3f}", critic=f"{metrics['critic_loss']:.3f}")
            if budget.offline_eval_every and (step + 1) % budget.offline_eval_every == 0 and self.main:
                self._evaluate_policy_alone()
            if (step + 1) % budget.checkpoint_every == 0 or step + 1 == budget.offline_steps:
                self.save()
        bar.close()

    def _evaluate_policy_alone(self) -> None:
        """A point of the offline curve, its agent kept as every curve point's is. The last one is also the offline
        start the online phase would otherwise evaluate again: it is written where that phase reads it
        (offline_eval.json)."""
        step = self.progress.offline_step
        result = self.eval(f"offline{step}", ["none"])["actors"]["none"]
        self.curve.add_offline(step, result["success_rate"])
        self.keep_evaluated()
        metrics = {"eval/offline_curve_success_rate": result["success_rate"]}
        if step == self.cfg.budget.offline_steps:
            write_json(self.run_dir / OFFLINE_EVAL, result)
            metrics["eval/offline_success_rate"] = result["success_rate"]
        self.logger.log(metrics, step)
