"""`scripts/evaluate.py`: build env + policy from the config, run the episodes, write eval.json.

`compare=[none,best_of_n,qwm]` (with checkpoint=PATH) evaluates several actors of the same trained agent
on paired episodes in one pass and prints a table of success rates, 95% intervals and paired gains.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from robo_rl.config import ConfigError
from robo_rl.envs import make_vec_env
from robo_rl.eval.policies import RandomPolicy
from robo_rl.eval.rollout import Policy, evaluate, evaluate_actors

PLANNER_CONF = Path(__file__).resolve().parents[2] / "conf" / "planner"


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


def qwm_planner_config(planner_cfg: DictConfig) -> DictConfig:
    """The QWM search settings to compare or diagnose with: `planner_cfg` itself when it is the qwm planner
    (with the user's planner.* overrides), else conf/planner/qwm.yaml."""
    return planner_cfg if planner_cfg.name == "qwm" else OmegaConf.load(PLANNER_CONF / "qwm.yaml")


def compare_actors(cfg: DictConfig, checkpoint: dict, names: list[str]) -> dict[str, Policy]:
    """The checkpoint's agent (rebuilt once) wrapped as each of `names`:

    none: the policy's own sample (best_of_n=1); qwm: QWM search; best_of_n: the best of the search's N
    policy samples by the search's critic score (the qwm planner at depth 0). The qwm settings are the
    run's `planner` when planner=qwm (with any planner.* overrides), else conf/planner/qwm.yaml.
    """
    from robo_rl.train.checkpoint import agent_from_checkpoint
    from robo_rl.train.common import make_actor

    qwm = qwm_planner_config(cfg.planner)
    planners = {"none": None, "best_of_n": OmegaConf.merge(qwm, {"depth": 0}), "qwm": qwm}
    unknown = [n for n in names if n not in planners]
    if unknown:
        raise ValueError(f"unknown actors {unknown} in compare=; valid actors: {list(planners)}")
    agent = agent_from_checkpoint(checkpoint, cfg.device)
    return {n: make_actor(cfg, agent, planners[n], best_of_n=1) for n in names}


def run_evaluation(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = ()) -> dict:
    """Evaluate as cfg says and write run_dir/eval.json; `overrides`: the command line's key=value overrides."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    checkpoint = None
    if cfg.get("checkpoint"):
        from robo_rl.train.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(cfg.checkpoint, cfg.device)
        # The env must observe what the agent was trained on: task and observation settings come from it
        # (task.* overrides on the command line, e.g. task.horizon=30, still apply).
        trained = checkpoint["config"]
        asked = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "task"]
        if asked and asked[-1] != trained["task"]["name"]:
            raise ConfigError(f"task={asked[-1]}, but checkpoint={cfg.checkpoint} was trained on "
                              f"task={trained['task']['name']}: drop task= (a checkpoint is evaluated on its own "
                              f"task) or pass a checkpoint trained on {asked[-1]}")
        cfg = OmegaConf.merge(cfg, {"task": trained["task"], "env": {
            k: trained["env"][k] for k in ("modality", "image_size")}},
            OmegaConf.from_dotlist([o for o in overrides if o.startswith("task.")]))
    if cfg.compare and checkpoint is None:
        raise ValueError("compare=[...] compares actors of a trained agent: pass checkpoint=PATH")
    actors = compare_actors(cfg, checkpoint, list(cfg.compare)) if cfg.compare else None
    env = make_vec_env(cfg, render=cfg.videos > 0, autoreset=False)
    try:
        settings = dict(seed=cfg.seed, video_dir=run_dir / "videos", num_videos=cfg.videos,
                        wrist_video=cfg.wrist_video)
        if actors is not None:
            result = evaluate_actors(env, actors, cfg.episodes, **settings)
        else:
            result = evaluate(env, make_eval_policy(cfg, env.num_envs, env.action_dim, checkpoint), cfg.episodes,
                              **settings)
    finally:
        env.close()
    result["task"] = cfg.task.name
    if actors is not None:
        result.update(checkpoint=str(cfg.checkpoint), episodes=cfg.episodes)
        print_table(result)
    else:
        result["policy"] = str(cfg.checkpoint) if cfg.get("checkpoint") else cfg.policy
        result["planner"] = cfg.planner.name
        lo, hi = result["success_ci"]
        print(f"[eval] {cfg.task.name}: success {result['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] over "
              f"{result['num_episodes']} episodes")
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2))
    print(f"[eval] -> {run_dir / 'eval.json'}")
    return result


def print_table(result: dict) -> None:
    """actor | success | 95% CI | gain vs none [CI] | ms/decision | episodes, one row per actor."""
    rows = [("actor", "success", "95% CI", "gain vs none [CI]", "ms/decision", "episodes")]
    for name, r in result["actors"].items():
        gain = result.get("gains", {}).get(name)
        rows.append((name, f"{r['success_rate']:.3f}", "[{:.3f}, {:.3f}]".format(*r["success_ci"]),
                     f"{gain['mean']:+.3f} [{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}]" if gain else "-",
                     f"{r['ms_per_decision']:.1f}", str(r["episodes"])))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
