"""Online fine-tuning: act in the vectorized envs (through QWM search), store the real transitions,
update on RLPD-style mixed batches. Imagined states never reach the buffer: only `env.step` output does.
With train.demo_resets > 0 that share of episodes starts at a random demo state instead of the env's reset
(still real simulator steps from there)."""
from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

import numpy as np

from robo_rl.agents.sorl import SORLAgent
from robo_rl.checkpoint import build_actor
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.envs import env_spec
from robo_rl.schemas import TrainConfig
from robo_rl.train.curves import LearningCurve
from robo_rl.train.sources import demo_starts
from robo_rl.train.trainer import OFFLINE_EVAL, Progress, Trainer
from robo_rl.utils import distributed
from robo_rl.utils.logging import RunLogger, progress_bar, write_json
from robo_rl.utils.shutdown import GracefulStop
from robo_rl.utils.timing import SectionTimer


class OnlineTrainer(Trainer):
    """Collects `budget.online_steps` env steps (summed over envs), `budget.utd` updates per env step.

    It acts as cfg.planner says (explore=param_noise: each env group with its own perturbed policy copy).
    Metrics are logged at the run's step (offline steps + env steps), a point of the learning curve every
    `budget.eval_every` env steps (its agent kept in checkpoints/curve/), a checkpoint with the buffer
    every `budget.checkpoint_every`. An env whose worker died mid-step stores nothing and its cut episode
    is not scored; restarts are logged.
    Data parallel, each rank acts in its own envs from its own seeds (distributed.rank_seed) and only
    rank 0 evaluates.
    """

    phase = "online"

    def __init__(self, cfg: TrainConfig, env, agent: SORLAgent, buffer: ReplayBuffer, logger: RunLogger,
                 run_dir: Path, progress: Progress, curve: LearningCurve, stop: GracefulStop | None = None,
                 continuation: dict | None = None):
        super().__init__(cfg, env, agent, buffer, logger, run_dir, progress, stop)
        self.curve = curve
        self.continuation = continuation  # the episodes a graceful stop left in progress (see _episodes_in_progress)
        noise = cfg.param_noise_std if cfg.explore == "param_noise" else 0.0
        self.actor = build_actor(agent, cfg.planner, cfg.train.gamma, distributed.rank_seed(cfg.seed),
                                 param_noise_std=noise,
                                 num_groups=min(2, env.num_envs))
        self.offline_success_rate: float | None = None  # of the policy fine-tuning starts from
        self.demo_starts = demo_starts(cfg, env_spec(cfg)) if cfg.train.demo_resets else []
        self.rng = np.random.default_rng(distributed.rank_seed(cfg.seed))
        self.from_demo = np.zeros(env.num_envs, bool)  # the env's episode began at a demo state

    def train(self) -> None:
        self._evaluate_offline_start()
        cfg, env, actor, progress = self.cfg, self.env, self.actor, self.progress
        budget, B = cfg.budget, env.num_envs
        updates_per_iter = max(1, round(budget.utd * B))
        start = progress.env_steps
        if self.continuation is not None:  # a graceful stop's episodes, continued where they were
            obs, episode_return, episode_len = self._continue_episodes(self.continuation)
        else:  # fresh episodes, also after a crash
            obs = self._start_some_from_demos(range(B), env.reset(seed=distributed.rank_seed(cfg.seed) + 7919 * (start + 1)))
            actor.reset(range(B))
            episode_return, episode_len = np.zeros(B), np.zeros(B, int)
        # (success, return, length) of the last finished episodes, from the env's reset and from demo states
        recent, recent_demo = deque(maxlen=20), deque(maxlen=20)
        metrics, t0 = {}, time.time()
        next_log, next_ckpt = _next_multiple(start, budget.log_every), _next_multiple(start, budget.checkpoint_every)
        next_eval = _next_multiple(start, budget.eval_every) if budget.eval_every else None
        bar = progress_bar(total=budget.online_steps, initial=start, desc="online", unit="step", disable=not self.main)
        timer = SectionTimer(("act", "env", "buffer", "update"))  # the loop's split, logged as rollout/seconds_*
        while progress.env_steps < budget.online_steps:
            self.stop_if_asked(continuation=self._episodes_in_progress(episode_return, episode_len))
            with timer("act"):
                actions = actor.act(obs)
            if cfg.train.overlap:  # the envs step while the learner updates on the transitions before this one
                with timer("env"):
                    env.step_async(actions)
                with timer("update"):
                    metrics = self._updates(updates_per_iter) or metrics
                with timer("env"):
                    result = env.step_wait()
            else:
                with timer("env"):
                    result = env.step(actions)
            with timer("buffer"):
                self.buffer.add(obs, actions, result.reward, result.terminated, result.truncated, result.next_obs,
                                result.lost)
            obs = result.obs
            progress.env_steps += B
            steps = progress.env_steps
            bar.update(B)

            episode_return += result.reward.numpy()
            episode_len += 1
            done = result.done.numpy()
            lost = result.lost.numpy()
            progress.lost_steps += int(lost.sum())
            for i in np.flatnonzero(done & ~lost):
                (recent_demo if self.from_demo[i] else recent).append(
                    (bool(result.success[i]), episode_return[i], episode_len[i]))
            episode_return[done], episode_len[done] = 0.0, 0
            obs = self._start_some_from_demos(np.flatnonzero(done), obs)
            actor.reset(np.flatnonzero(done))  # auto-reset started new episodes there
            if actor.param_noise_std > 0 and done.any():
                actor.resample_noise(sorted({int(i) % actor.num_groups for i in np.flatnonzero(done)}))

            if not cfg.train.overlap:
                with timer("update"):
                    metrics = self._updates(updates_per_iter) or metrics

            if steps >= next_log or steps >= budget.online_steps:
                next_log = _next_multiple(steps, budget.log_every)
                stats = _episode_stats(recent)
                stats["steps_per_s"] = (steps - start) / (time.time() - t0)
                stats["worker_restarts"] = getattr(env, "num_restarts", 0)
                stats["lost_steps"] = progress.lost_steps
                stats |= {f"seconds_{k}": v for k, v in timer.split().items()}
                stats |= {f"demo_start_{k}": v for k, v in _episode_stats(recent_demo).items()}
                self.logger.log({**{f"online/{k}": v for k, v in metrics.items()},
                                 **{f"rollout/{k}": v for k, v in stats.items()}, "env_steps": steps}, progress.step)
                bar.set_postfix(success=_shown(stats.get("success")), ret=_shown(stats.get("return")),
                                sps=f"{stats['steps_per_s']:.1f}")  # "-" until an episode has ended
            if next_eval is not None and steps >= next_eval and self.main:
                next_eval = _next_multiple(steps, budget.eval_every)
                self.logger.log({**{f"eval/{k}": v for k, v in self._curve_point().items()}, "env_steps": steps},
                                progress.step)
            if steps >= next_ckpt or steps >= budget.online_steps:
                next_ckpt = _next_multiple(steps, budget.checkpoint_every)
                self.save()
        bar.close()

    def _episodes_in_progress(self, episode_return: np.ndarray, episode_len: np.ndarray) -> dict | None:
        """What continues the envs' episodes exactly in a resumed run: each env's simulator snapshot and episode
        seed, the actor's per-env state, the episodes' running stats, this trainer's RNG. None where the envs
        cannot snapshot (a resumed run then ends these episodes and starts new ones, as after a crash)."""
        try:
            snapshots = self.env.get("snapshot")
        except (AttributeError, RuntimeError):
            return None
        return {"snapshots": snapshots, "episode_seeds": self.env.episode_seeds, "actor": self.actor.state_dict(),
                "episode_return": episode_return.copy(), "episode_len": episode_len.copy(),
                "from_demo": self.from_demo.copy(), "rng": self.rng.bit_generator.state}

    def _continue_episodes(self, state: dict) -> tuple[dict, np.ndarray, np.ndarray]:
        """Restore `_episodes_in_progress`'s state: (obs, episode returns, episode lengths)."""
        ids = list(range(self.env.num_envs))
        obs = self.env.reset_envs(ids, seed=state["episode_seeds"], options=[{"snapshot": s} for s in state["snapshots"]])
        self.actor.load_state_dict(state["actor"])
        self.from_demo[:] = state["from_demo"]
        self.rng.bit_generator.state = state["rng"]
        return obs, np.array(state["episode_return"]), np.array(state["episode_len"])

    def _updates(self, n: int) -> dict[str, float]:
        """`n` gradient steps (none while the buffer holds nothing to learn from); the last one's metrics."""
        metrics = {}
        for _ in range(n if self.can_update() else 0):
            metrics = self.update()
        return metrics

    def _start_some_from_demos(self, env_ids, obs: dict) -> dict:
        """Restart each of `env_ids` (episodes that just began at the env's reset) at a random demo state
        with probability train.demo_resets; returns the observations of all envs."""
        self.from_demo[list(env_ids)] = False
        if not self.demo_starts:
            return obs
        ids = [int(i) for i in env_ids if self.rng.random() < self.cfg.train.demo_resets]
        if not ids:
            return obs
        picks = [self.demo_starts[k] for k in self.rng.integers(len(self.demo_starts), size=len(ids))]
        self.from_demo[ids] = True
        return self.env.reset_envs(ids, options=[{"demo_state": p.state, "gripper_command": p.gripper_command}
                                                 for p in picks])

    def _evaluate_offline_start(self) -> None:
        """The policy fine-tuning starts from, evaluated once (read back from offline_eval.json when the offline
        trainer's curve already evaluated it, or by a resumed run): the line the learning curve must climb above."""
        if not self.main:
            return
        path = self.run_dir / OFFLINE_EVAL
        if self.buffer.num_offline and not path.exists():
            write_json(path, self.eval("offline", ["none"])["actors"]["none"])
            self.keep_evaluated()  # fine-tuning is judged against it: evaluate.py can pair it with later points
            self.logger.log({"eval/offline_success_rate": json.loads(path.read_text())["success_rate"]},
                            self.progress.offline_step)
        if path.exists():
            self.offline_success_rate = json.loads(path.read_text())["success_rate"]
            self.curve.set_offline(self.offline_success_rate)

    def _curve_point(self) -> dict:
        """Paired episodes with and without search: a point of both learning curves."""
        rates = {a: r["success_rate"] for a, r in self.eval(f"step{self.progress.env_steps}")["actors"].items()}
        self.curve.add(self.progress.env_steps, rates[self.acting], rates["none"] if self.search else None)
        self.keep_evaluated()
        return {"success_rate": rates[self.acting],
                **({"success_rate_no_search": rates["none"]} if self.search else {})}


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _episode_stats(recent) -> dict:
    if not recent:
        return {}
    success, ret, length = map(np.asarray, zip(*recent))
    return {"success": float(success.mean()), "return": float(ret.mean()), "length": float(length.mean()),
            "episodes": len(recent)}
