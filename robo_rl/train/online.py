"""Online fine-tuning: act in the vectorized envs (through QWM search), store the real transitions,
update on RLPD-style mixed batches. Imagined states never reach the buffer: only `env.step` output does."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from robo_rl.agents.sorl import SORLAgent
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.planning.actor import AgentActor
from robo_rl.train.common import gradient_step
from robo_rl.utils.logging import RunLogger


def finetune(cfg: DictConfig, agent: SORLAgent, buffer: ReplayBuffer, env, actor: AgentActor, start_env_steps: int,
             logger: RunLogger, checkpoint: Callable[[int], None],
             periodic_eval: Callable[[int], dict] | None = None, log_step_offset: int = 0) -> None:
    """Collect `budget.online_steps` env steps (summed over envs) from `start_env_steps`, `utd` updates per step.

    Metrics are logged at `log_step_offset + env steps` (the run's one step axis: after the offline steps).
    An env whose worker died mid-step stores nothing and its cut episode is not scored; restarts are logged.
    """
    budget, B = cfg.budget, env.num_envs
    updates_per_iter = max(1, round(budget.utd * B))
    obs = env.reset(seed=cfg.seed + 7919 * (start_env_steps + 1))  # fresh episodes, also after a resume
    actor.reset(range(B))
    episode_return, episode_len = np.zeros(B), np.zeros(B, int)
    recent = deque(maxlen=20)  # (success, return, length) of the last finished episodes
    steps, metrics, t0 = start_env_steps, {}, time.time()
    next_log, next_ckpt = _next_multiple(steps, budget.log_every), _next_multiple(steps, budget.checkpoint_every)
    next_eval = _next_multiple(steps, budget.eval_every) if budget.eval_every else None
    bar = tqdm(total=budget.online_steps, initial=steps, desc="online", unit="step", dynamic_ncols=True)
    while steps < budget.online_steps:
        actions = actor.act(obs)
        result = env.step(actions)
        buffer.add(obs, actions, result.reward, result.terminated, result.truncated, result.next_obs, result.lost)
        obs = result.obs
        steps += B
        bar.update(B)

        episode_return += result.reward.numpy()
        episode_len += 1
        done = result.done.numpy()
        lost = np.zeros(B, bool) if result.lost is None else result.lost.numpy()
        for i in np.flatnonzero(done & ~lost):
            recent.append((bool(result.success[i]), episode_return[i], episode_len[i]))
        episode_return[done], episode_len[done] = 0.0, 0
        actor.reset(np.flatnonzero(done))  # auto-reset started new episodes there
        if actor.param_noise_std > 0 and done.any():
            actor.resample_noise(sorted({int(i) % actor.num_groups for i in np.flatnonzero(done)}))

        for _ in range(updates_per_iter):
            metrics = gradient_step(cfg, agent, buffer)

        if steps >= next_log or steps >= budget.online_steps:
            next_log = _next_multiple(steps, budget.log_every)
            stats = _episode_stats(recent)
            stats["steps_per_s"] = (steps - start_env_steps) / (time.time() - t0)
            stats["worker_restarts"] = getattr(env, "num_restarts", 0)
            logger.log({**{f"online/{k}": v for k, v in metrics.items()}, **{f"rollout/{k}": v for k, v in stats.items()},
                        "env_steps": steps}, log_step_offset + steps)
            bar.set_postfix(success=f"{stats.get('success', float('nan')):.2f}",
                            ret=f"{stats.get('return', float('nan')):.2f}", sps=f"{stats['steps_per_s']:.1f}")
        if next_eval is not None and steps >= next_eval and periodic_eval is not None:
            next_eval = _next_multiple(steps, budget.eval_every)
            logger.log({**{f"eval/{k}": v for k, v in periodic_eval(steps).items()}, "env_steps": steps},
                       log_step_offset + steps)
        if steps >= next_ckpt or steps >= budget.online_steps:
            next_ckpt = _next_multiple(steps, budget.checkpoint_every)
            checkpoint(steps)
    bar.close()


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _episode_stats(recent) -> dict:
    if not recent:
        return {}
    success, ret, length = map(np.asarray, zip(*recent))
    return {"success": float(success.mean()), "return": float(ret.mean()), "length": float(length.mean()),
            "episodes": len(recent)}
