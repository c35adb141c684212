"""`scripts/evaluate.py`: build env + policy from the config, run the episodes, write eval.json."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from robo_rl.envs import make_vec_env
from robo_rl.eval.policies import RandomPolicy
from robo_rl.eval.rollout import evaluate


def make_eval_policy(cfg: DictConfig, num_envs: int, action_dim: int, checkpoint: dict | None = None):
    """The policy `cfg.policy` names: random, scripted (the task's expert), or a loaded checkpoint."""
    if checkpoint is not None:
        from robo_rl.train.checkpoint import actor_from_checkpoint

        return actor_from_checkpoint(checkpoint, cfg)
    if cfg.policy == "random":
        return RandomPolicy(num_envs, action_dim, seed=cfg.seed)
    if cfg.policy == "scripted":
        from robo_rl.data.demos import make_expert

        return make_expert(cfg.task, num_envs, noise=0.0, seed=cfg.seed)
    if cfg.policy == "checkpoint":
        raise ValueError("policy=checkpoint needs checkpoint=PATH (a .pt file or a run directory)")
    raise ValueError(f"unknown policy {cfg.policy!r}; use policy=random, policy=scripted or checkpoint=PATH")


def run_evaluation(cfg: DictConfig, run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = None
    if cfg.get("checkpoint"):
        from robo_rl.train.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(cfg.checkpoint, cfg.device)
        # The env must observe what the agent was trained on: task and observation settings come from it.
        trained = checkpoint["config"]
        cfg = OmegaConf.merge(cfg, {"task": trained["task"], "env": {
            k: trained["env"][k] for k in ("modality", "image_size")}})
    env = make_vec_env(cfg, render=cfg.videos > 0, autoreset=False)
    try:
        policy = make_eval_policy(cfg, env.num_envs, env.action_dim, checkpoint)
        result = evaluate(
            env, policy, cfg.episodes, seed=cfg.seed, video_dir=run_dir / "videos",
            num_videos=cfg.videos, wrist_video=cfg.wrist_video,
        )
    finally:
        env.close()
    result["task"] = cfg.task.name
    result["policy"] = str(cfg.checkpoint) if cfg.get("checkpoint") else cfg.policy
    result["planner"] = cfg.planner.name
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2))
    print(f"[eval] {cfg.task.name}: success {result['success_rate']:.2f} over {result['num_episodes']} episodes "
          f"-> {run_dir / 'eval.json'}")
    return result
