"""A whole run: demos -> offline pretraining -> (online fine-tuning with QWM search) -> evaluation.

`scripts/train_qwm.py` runs both phases, `scripts/pretrain_offline.py` only the first. Everything a
run produces lives in its run directory: metrics.jsonl, checkpoints/ (+ the replay buffer once
online), eval.json, videos/. `resume=true` picks up from the newest checkpoint there: its model,
optimizer, RNG and exactly the buffer saved with it; the episodes a crash interrupted end there,
truncated, and the envs start new ones.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from omegaconf import DictConfig

from robo_rl.config import ConfigError
from robo_rl.envs import env_spec, make_vec_env
from robo_rl.train.checkpoint import latest_checkpoint, load_buffer, load_checkpoint, save_checkpoint
from robo_rl.train.common import (
    build_agent, build_buffer, evaluate_agent, make_actor, offline_episodes,
    restore_training_state, step_shapes, training_state, write_json,
)
from robo_rl.train.curves import LearningCurve
from robo_rl.train.offline import pretrain
from robo_rl.train.online import finetune
from robo_rl.utils.logging import RunLogger
from robo_rl.utils.seeding import seed_everything


def run(cfg: DictConfig, run_dir: str | Path, online: bool = True) -> dict:
    """Train as configured; returns (and writes to run_dir/eval.json) the final evaluation."""
    t_start = time.time()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    spec = env_spec(cfg, render=True)
    found = latest_checkpoint(run_dir)
    if found and not cfg.resume:  # a fresh run would mix its checkpoints and metrics with the old run's
        raise ConfigError(f"hydra.run.dir={run_dir} already holds a run ({found.name}): pass resume=true to "
                          "continue it, or a new hydra.run.dir")
    state = load_checkpoint(found, cfg.device) if found else None
    if cfg.resume:
        print(f"[run] resuming from {found}" if found else f"[run] resume=true but no checkpoint in {run_dir}: "
              "starting fresh")

    episodes = offline_episodes(cfg, spec)
    if not online and not episodes:
        raise ValueError(f"offline pretraining on {cfg.task.name} needs demonstrations: pass dataset=PATH")
    env = make_vec_env(cfg) if online else None
    try:
        first = episodes[0].obs if episodes else env.reset(seed=cfg.seed)
        shapes = {k: s for k, s in step_shapes(first).items() if k in spec.low_dim_keys + spec.rgb_keys}
        shapes["task_id"] = ()
        num_tasks = max(spec.task_ids) + 1
        agent = build_agent(cfg, shapes, num_tasks)
        buffer = build_buffer(cfg, shapes, episodes)
        if buffer.num_offline:
            agent.set_normalization(buffer.obs_stats())
        offline_step, env_steps = 0, 0
        if state is not None:
            restore_training_state(agent, state)
            offline_step, env_steps = state["offline_step"], state["env_steps"]
            if state["phase"] == "online":
                buffer = load_buffer(run_dir, state, device=buffer.device)
                buffer.end_episodes()  # the envs restart below: nothing may join the interrupted episodes

        logger = RunLogger(run_dir, cfg, name=f"{cfg.task.name}-{run_dir.name}",
                           resume_step=-1 if state is None else offline_step + env_steps)
        curve = LearningCurve(run_dir, resume_env_steps=None if state is None else env_steps)

        def checkpoint(phase: str):
            def save(step: int) -> None:
                nonlocal offline_step, env_steps
                if phase == "offline":
                    offline_step = step
                else:
                    env_steps = step
                save_checkpoint(run_dir, offline_step + env_steps, training_state(
                    cfg, agent, shapes, num_tasks, phase=phase, offline_step=offline_step, env_steps=env_steps),
                    buffer=buffer if phase == "online" else None)
            return save

        if buffer.num_offline and offline_step < cfg.budget.offline_steps and env_steps == 0:
            pretrain(cfg, agent, buffer, offline_step, logger, checkpoint("offline"))

        result: dict = {}
        search = cfg.planner.name != "none"
        policy = cfg.planner.name if search else "none"  # the actor that trains (and is evaluated first)
        actors = [policy, "none"] if search else [policy]  # evaluated on paired episodes

        def evaluate(tag: str, names: list[str], videos: int = 0) -> dict:
            return evaluate_agent(cfg, agent, run_dir, tag, names, cfg.budget.eval_episodes, videos)

        if online:
            # The offline start, evaluated once (a resumed run reads it back): what fine-tuning must beat.
            offline_eval_path = run_dir / "offline_eval.json"
            if buffer.num_offline and not offline_eval_path.exists():
                write_json(offline_eval_path, evaluate("offline", ["none"])["actors"]["none"])
                logger.log({"eval/offline_success_rate": json.loads(offline_eval_path.read_text())["success_rate"]},
                           offline_step)
            if offline_eval_path.exists():
                result["offline_success_rate"] = json.loads(offline_eval_path.read_text())["success_rate"]
                curve.set_offline(result["offline_success_rate"])
            noise = cfg.param_noise_std if cfg.explore == "param_noise" else 0.0
            actor = make_actor(cfg, agent, cfg.planner, param_noise_std=noise, num_groups=min(2, env.num_envs))

            def periodic_eval(step: int) -> dict:
                """Paired episodes with and without search: a point of both learning curves."""
                rates = {a: r["success_rate"] for a, r in evaluate(f"step{step}", actors)["actors"].items()}
                curve.add(step, rates[policy], rates["none"] if search else None)
                return {"success_rate": rates[policy], **({"success_rate_no_search": rates["none"]} if search else {})}

            finetune(cfg, agent, buffer, env, actor, env_steps, logger, checkpoint("online"), periodic_eval,
                     log_step_offset=offline_step)
    finally:
        if env is not None:
            env.close()

    # One pass of paired episodes: with search (when on) and without; eval.json's top level is the first.
    final = evaluate("final", actors, videos=2)
    if search:
        none = final["actors"]["none"]
        result.update(success_rate_no_search=none["success_rate"], success_ci_no_search=none["success_ci"],
                      search_gain=final.get("search_gain"))  # None below 2 episodes: no t interval
    result = {**final["actors"][policy], **result, "actors": final["actors"], "task": cfg.task.name,
              "worker_restarts": final["worker_restarts"],
              "planner": cfg.planner.name,
              "offline_steps": cfg.budget.offline_steps, "online_env_steps": cfg.budget.online_steps if online else 0,
              "num_online_transitions": buffer.num_online, "train_wall_s": time.time() - t_start}
    write_json(run_dir / "eval.json", result)
    if online:
        curve.add(env_steps, result["success_rate"], result.get("success_rate_no_search"))
    logger.log({"eval/success_rate": result["success_rate"], "env_steps": env_steps,
                **({"eval/success_rate_no_search": result["success_rate_no_search"]} if search else {})},
               offline_step + env_steps)
    logger.close()
    print(f"[run] {cfg.task.name}: success {result['success_rate']:.2f}"
          + (f" (no search {result['success_rate_no_search']:.2f})" if search else "") + f" -> {run_dir}/eval.json")
    return result
