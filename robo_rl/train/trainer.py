"""What the offline and online trainers share: one agent learning from one replay buffer.

A trainer is built once from (cfg, env, agent, buffer, logger) plus the run directory and the run's
counters, as TD-MPC2's trainers are; `train()` runs its phase, `eval()` plays evaluation episodes.
`robo_rl/train/run.py` builds both for a run: OfflineTrainer (gradient steps on the demonstrations),
then OnlineTrainer (acting in the envs, learning from the transitions it collects).
"""
from __future__ import annotations

import signal
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path


from robo_rl.agents.sorl import SORLAgent
from robo_rl.checkpoint import agent_snapshot, build_actor, save_checkpoint, save_curve_checkpoint, training_state
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.envs import make_vec_env
from robo_rl.envs.memory import envs_that_fit
from robo_rl.eval.rollout import eval_seed, evaluate_actors
from robo_rl.schemas import TrainConfig
from robo_rl.utils import distributed
from robo_rl.utils.logging import RunLogger
from robo_rl.utils.shutdown import GracefulStop, StopRequested


OFFLINE_EVAL = "offline_eval.json"  # the policy alone where pretraining ended: the line the online curve must climb above


@dataclass
class Progress:
    """The run's counters, saved in every checkpoint."""

    offline_step: int = 0  # gradient steps on the demonstrations
    env_steps: int = 0  # online env steps, summed over envs
    lost_steps: int = 0  # of those, the steps a dying env worker never took (stored nowhere)

    @property
    def step(self) -> int:
        """The run's one axis for logs and checkpoint names: offline steps, then offline steps + env steps."""
        return self.offline_step + self.env_steps


class Trainer:
    """The agent, its buffer, the run's counters and where the run writes; `update()` is one gradient step.

    env: the training envs (None offline). Evaluation builds its own envs (no auto-reset, with a video
    renderer when asked) and acts as `actors` names them: "none" is the policy alone, cfg.planner.name
    (e.g. "qwm") acts through the search; `self.actors` are the run's: the acting one first, and the
    policy alone beside it when there is a search, on paired episodes.

    Data parallel (torchrun), every rank trains the same agent on its own envs and buffer; only rank 0
    (`self.main`) saves checkpoints and evaluates.
    """

    phase: str  # "offline" | "online": what a checkpoint this trainer saves resumes into

    def __init__(self, cfg: TrainConfig, env, agent: SORLAgent, buffer: ReplayBuffer, logger: RunLogger,
                 run_dir: Path, progress: Progress, stop: GracefulStop | None = None):
        self.cfg, self.env, self.agent, self.buffer, self.logger = cfg, env, agent, buffer, logger
        self.run_dir, self.progress, self.stop = Path(run_dir), progress, stop
        self.search = cfg.planner.name != "none"
        self.acting = cfg.planner.name if self.search else "none"
        self.actors = [self.acting, "none"] if self.search else [self.acting]
        self.main = distributed.is_main()

    def train(self) -> None:
        """Run this trainer's phase from the current counters, checkpointing as the budget says."""
        raise NotImplementedError

    def update(self) -> dict[str, float]:
        """One gradient step on an RLPD-mixed batch of real transitions (+ real sub-trajectories for the
        world model), `budget.batch_size` of each.

        Single actions: n-step returns (train.nstep). Chunks of h actions: a transition spans the h env
        steps of a chunk and its return is their h-step return (the config allows only train.nstep=1
        there); a world-model step is one chunk, so its sub-trajectories are seq_horizon·h env steps.
        """
        budget, h = self.cfg.budget, self.agent.config.action_horizon
        if h == 1:
            batch = self.buffer.sample(budget.batch_size, nstep=self.cfg.train.nstep)
        else:
            batch = self.buffer.sample_chunks(budget.batch_size, h)
        seq = None
        if self.agent.world_model is not None and self.buffer.can_sample_sequences(self.world_model_window):
            seq = self.buffer.sample_sequences(budget.batch_size, self.world_model_window)
        return self.agent.update(batch, seq)

    @property
    def world_model_window(self) -> int:
        """Env steps of one world-model sub-trajectory: budget.seq_horizon chunks of h actions."""
        return self.cfg.budget.seq_horizon * self.agent.config.action_horizon

    def can_update(self) -> bool:
        """Whether the buffer holds a transition to learn from. With chunks of h actions that takes h steps
        of one episode: a run from scratch (no demos) waits its first h env steps."""
        h = self.agent.config.action_horizon
        return h == 1 or self.buffer.can_sample_sequences(h)

    def save(self, **extra) -> Path | None:
        """Checkpoint at the current counters (online: with the replay buffer), plus `extra` entries; None on
        ranks other than 0."""
        if not self.main:
            return None
        p = self.progress
        state = training_state(self.cfg, self.agent, self.phase, p.offline_step, p.env_steps) | {
            "lost_steps": p.lost_steps, **extra}
        return save_checkpoint(self.run_dir, p.step, state, buffer=self.buffer if self.phase == "online" else None)

    def stop_if_asked(self, **extra) -> None:
        """At a step boundary: when a signal asked the run to stop (robo_rl/utils/shutdown.py), write a checkpoint
        (with `extra`) and raise StopRequested."""
        if self.stop is None or self.stop.signum is None:
            return
        path = self.save(**extra)
        raise StopRequested(self.stop.signum, f"stopped by {signal.Signals(self.stop.signum).name} at step "
                                              f"{self.progress.step} with a complete checkpoint, {path}")

    def keep_evaluated(self) -> Path:
        """Keep the agent a learning-curve point just evaluated (checkpoints/curve/, never pruned), so that
        point can be evaluated again on more episodes or with other actors (rank 0 only)."""
        p = self.progress
        return save_curve_checkpoint(self.run_dir, p.step, agent_snapshot(self.cfg, self.agent, self.phase,
                                                                          p.offline_step, p.env_steps))

    def eval(self, tag: str, actors: list[str] | None = None, videos: int = 0) -> dict:
        """`budget.eval_episodes` paired episodes of the current agent as each of `actors` (default
        `self.actors`) in one pass; the first `videos` of them as mp4 under run_dir/videos/tag.
        Returns evaluate_actors' dict. A signal during it stops it at once with a checkpoint (StopRequested); a
        resumed online run then ends the episodes the training envs were in, as after a crash."""
        cfg = self.cfg
        planners = {"none": None, cfg.planner.name: cfg.planner}
        # beside the training envs: as many envs as memory holds (LIBERO's take ~2 GB each)
        num_envs = envs_that_fit(cfg.env.num_envs, getattr(self.env, "pids", []))
        if num_envs < cfg.env.num_envs:
            print(f"[eval] {tag}: {num_envs} of env.num_envs={cfg.env.num_envs} envs fit in memory beside the "
                  "training envs", flush=True)
        env = make_vec_env(cfg, num_envs, render=videos > 0, autoreset=False)
        try:
            policies = {a: build_actor(self.agent, planners[a], cfg.train.gamma, cfg.seed) for a in actors or self.actors}
            # an evaluation is no step (LIBERO's take many minutes): a signal ends it now
            with self.stop.at_once_within() if self.stop is not None else nullcontext():
                result = evaluate_actors(env, policies, cfg.budget.eval_episodes, seed=eval_seed(cfg.seed),
                                         video_dir=self.run_dir / "videos" / tag, num_videos=videos, wrist_video=True)
        except StopRequested as stopped:  # the agent and buffer are as the last step left them: a complete checkpoint
            raise StopRequested(stopped.signum, f"{stopped} during the evaluation {tag!r} (not scored) with a "
                                                f"complete checkpoint, {self.save()}") from None
        finally:
            env.close()
        for name, r in result["actors"].items():
            lo, hi = r["success_ci"]
            print(f"[eval] {tag} {name}: success {r['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] "
                  f"over {r['episodes']} episodes")
        return result
