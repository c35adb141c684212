"""`scripts/evaluate.py`: build env + policy from the config, run the episodes, write eval.json.

A checkpoint acts as its run trained and reported it: with the run's own search settings and acting settings,
unless the command line sets them; which ones it acts with, and where each came from, is printed and recorded
in eval.json (`acting`).

`compare=[none,best_of_n,qwm]` (with checkpoint=PATH) evaluates several actors of the same trained agent
on paired episodes in one pass and prints a table of success rates, 95% intervals and paired gains.

LIBERO suites follow the published protocol: `episodes_per_task` episodes of every task (50 published),
episode j from the task's init state j, after the env's settling steps, within the suite's step limit
(task.horizon); eval.json's `success_rate` is the suite mean over tasks and a per-task table is printed.
Finished episodes go to run_dir/episodes.jsonl as they end (robo_rl/eval/journal.py): rerunning the same
command with the same hydra.run.dir plays only the episodes that file does not hold.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dataclasses import replace

from omegaconf import OmegaConf

from robo_rl.agents.sorl import check_execute_steps
from robo_rl.checkpoint import (
    ACTING_SETTINGS, actor_from_checkpoint, agent_from_checkpoint, build_actor, latest_checkpoint, load_checkpoint,
)
from robo_rl.demos.experts import make_expert
from robo_rl.envs import make_vec_env
from robo_rl.eval.journal import EPISODES_FILE, EpisodeJournal
from robo_rl.eval.policies import RandomPolicy
from robo_rl.eval.rollout import Policy, eval_seed, evaluate, evaluate_actors
from robo_rl.utils.logging import write_json
from robo_rl.schemas import EvaluateConfig, PlannerConfig
from robo_rl.utils.schema import ConfigError, from_dict, to_plain
from robo_rl.utils.shutdown import GracefulStop, StopRequested
from robo_rl.utils.threads import apply_thread_policy, describe

QWM_DEFAULTS = PlannerConfig(name="qwm")  # conf/planner/qwm.yaml states the same (tests/test_settings.py)


def make_eval_policy(cfg: EvaluateConfig, num_envs: int, action_dim: int, checkpoint: dict | None = None):
    """The policy `cfg.policy` names: random, scripted (the task's expert), or a loaded checkpoint."""
    if checkpoint is not None:
        return actor_from_checkpoint(checkpoint, cfg)
    if cfg.policy == "random":
        return RandomPolicy(num_envs, action_dim, seed=cfg.seed)
    if cfg.policy == "scripted":
        return make_expert(cfg.task, num_envs, noise=0.0, seed=cfg.seed)
    raise ValueError(f"policy={cfg.policy} plays without a checkpoint: use policy=random, policy=scripted or "
                     "checkpoint=PATH")


def qwm_planner_config(planner_cfg: PlannerConfig) -> PlannerConfig:
    """The QWM search settings to compare or diagnose with: `planner_cfg` itself when it is a qwm planner (the one
    the checkpoint trained with, or the command line's), else the defaults (conf/planner/qwm.yaml's)."""
    return planner_cfg if planner_cfg.name == "qwm" else QWM_DEFAULTS


def compare_actors(cfg: EvaluateConfig, checkpoint: dict, names: list[str]) -> dict[str, Policy]:
    """The checkpoint's agent (rebuilt once) wrapped as each of `names`:

    none: the policy's own sample (best_of_n=1); qwm: QWM search; best_of_n: the best of the search's N
    policy samples by the search's critic score (the qwm planner at depth 0); guard: a random one of the N
    that the drift guard (and planner.support) lets through, no score at all (what the guard adds by itself,
    so that a search gain over `guard` is the scores' own). The qwm settings are the ones the checkpoint's run
    trained with (with the command line's planner.* on top; planner=qwm: conf's), else conf/planner/qwm.yaml.
    The checkpoint's agent acts with cfg.agent's sample_steps; the searches discount by its train.gamma.
    """
    qwm = qwm_planner_config(cfg.planner)
    planners = {"none": None, "guard": replace(qwm, depth=0, selection="random"), "best_of_n": replace(qwm, depth=0),
                "qwm": qwm}
    agent = agent_from_checkpoint(checkpoint, cfg.device, {k: getattr(cfg.agent, k) for k in ACTING_SETTINGS})
    gamma = checkpoint["config"]["train"]["gamma"]
    return {n: build_actor(agent, planners[n], gamma, cfg.seed, best_of_n=1) for n in names}


def check_evaluation(cfg: EvaluateConfig, checkpoint: dict | None,
                     overrides: Sequence[str]) -> tuple[EvaluateConfig, dict | None]:
    """ConfigError for an evaluation that cannot run as asked (before its run directory exists); else the config it
    runs with and, for a checkpoint, its acting settings and their sources (`_as_trained`)."""
    acting = None
    if checkpoint is not None:
        cfg, acting = _as_trained(cfg, checkpoint["config"], overrides)
    if cfg.compare and "guard" in cfg.compare and qwm_planner_config(cfg.planner).drift_decay is None:
        raise ConfigError("compare=[...,guard] isolates the drift guard, which planner.drift_decay=null turns off: "
                          "drop guard from compare, or set planner.drift_decay (conf/planner/qwm.yaml: 0.9)")
    return cfg, acting


def run_evaluation(cfg: EvaluateConfig, run_dir: str | Path, overrides: Sequence[str] = ()) -> dict:
    """Evaluate as cfg says and write run_dir/eval.json; `overrides`: the command line's key=value overrides."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = apply_thread_policy(cfg.threads)
    print(describe(threads), flush=True)
    checkpoint = load_checkpoint(cfg.checkpoint, cfg.device) if cfg.checkpoint else None
    cfg, acting = check_evaluation(cfg, checkpoint, overrides)
    if acting is not None:
        print(describe_acting(acting), flush=True)
    actors = compare_actors(cfg, checkpoint, list(cfg.compare)) if cfg.compare else None
    journal = EpisodeJournal(run_dir / EPISODES_FILE, _journal_settings(cfg))
    env = make_vec_env(cfg, render=cfg.videos > 0, autoreset=False)
    libero = env.spec.suite == "libero"
    episodes = cfg.episodes_per_task * len(env.spec.task_ids) if libero else cfg.episodes
    try:
        settings = dict(seed=eval_seed(cfg.seed), video_dir=run_dir / "videos", num_videos=cfg.videos,
                        wrist_video=cfg.wrist_video, journal=journal)
        with GracefulStop(at_once=True):  # SIGINT / SIGTERM: the journal already holds every finished episode
            if actors is not None:
                result = evaluate_actors(env, actors, episodes, **settings)
            else:
                result = evaluate(env, make_eval_policy(cfg, env.num_envs, env.action_dim, checkpoint), episodes,
                                  **settings)
    except StopRequested as stopped:
        raise StopRequested(stopped.signum, f"{stopped}: the episodes it finished are in {journal.path}; the same "
                                            "command plays the rest") from None
    finally:
        env.close()
    result["task"], result["threads"] = cfg.task.name, threads
    if acting is not None:
        result["acting"] = acting
    if checkpoint is not None:  # where in its run the evaluated agent is (scripts/plot_evals.py orders by it)
        result.update(env_steps=checkpoint["env_steps"], offline_step=checkpoint["offline_step"])
    if libero:
        result["episodes_per_task"] = cfg.episodes_per_task
        for name, summary in (result["actors"] if actors is not None else {"policy": result}).items():
            print_task_table(summary, name if actors is not None else None)
    if actors is not None:
        result.update(checkpoint=str(cfg.checkpoint), episodes=episodes)
        print_table(result)
    else:
        result["policy"] = str(cfg.checkpoint) if cfg.checkpoint else cfg.policy
        result["planner"] = cfg.planner.name if cfg.checkpoint else None  # a scripted or random policy: no search
        lo, hi = result["success_ci"]
        print(f"[eval] {cfg.task.name}: success {result['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] over "
              f"{result['num_episodes']} episodes")
    write_json(run_dir / "eval.json", result)
    print(f"[eval] -> {run_dir / 'eval.json'}")
    return result


def _journal_settings(cfg: EvaluateConfig) -> dict:
    """What makes the episodes of two evaluations the same episodes, besides each job's identity (actor,
    task, init state, seed): what is evaluated, on which observations and step limit, acting how."""
    found = latest_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
    return {"task": cfg.task.name, "horizon": cfg.task.horizon, "modality": cfg.env.modality,
            "image_size": cfg.env.image_size, "policy": str(found.resolve()) if found else cfg.policy,
            "compare": list(cfg.compare or []), "planner": to_plain(cfg.planner),
            "acting": {k: getattr(cfg.agent, k) for k in ACTING_SETTINGS} if found else None}


def _as_trained(cfg: EvaluateConfig, trained: dict, overrides: Sequence[str]) -> tuple[EvaluateConfig, dict]:
    """cfg with what the checkpoint was trained with, and where each acting setting came from.

    The env must observe what the agent was trained on, so task and observation settings come from the
    checkpoint (task.* overrides on the command line, e.g. task.horizon=30, still apply). The agent acts as it
    was trained and reported: through the run's own search settings (`planner`, with planner.* overrides of the
    command line on top; `planner=NAME` on the command line picks conf/planner/NAME.yaml instead) and with its
    acting settings (ACTING_SETTINGS) unless the command line sets them (agent.sample_steps=4, ...).
    Returns (cfg, {"planner": the search settings, "sources": {setting: "checkpoint" | "command line" | ...}})."""
    keys = [o.split("=", 1)[0].lstrip("+") for o in overrides]
    asked = [o.split("=", 1)[1] for o, k in zip(overrides, keys) if k == "task"]
    if asked and asked[-1] != trained["task"]["name"]:
        raise ConfigError(f"task={asked[-1]}, but checkpoint={cfg.checkpoint} was trained on "
                          f"task={trained['task']['name']}: drop task= (a checkpoint is evaluated on its own "
                          f"task) or pass a checkpoint trained on {asked[-1]}")
    acting_asked = {k.removeprefix("agent.") for k in keys if k.startswith("agent.")}
    if unknown := sorted(acting_asked - set(ACTING_SETTINGS)):
        raise ConfigError(f"agent.{unknown[0]}: a checkpoint's agent is rebuilt as it was trained; evaluate.py "
                          f"may set only {', '.join('agent.' + k for k in ACTING_SETTINGS)}")
    # a checkpoint saved before a setting existed acts with the setting's default
    asked_acting = {k: getattr(cfg.agent, k) for k in ACTING_SETTINGS}
    acting = {k: asked_acting[k] if k in acting_asked else trained["agent"].get(k, asked_acting[k]) for k in ACTING_SETTINGS}
    sources = {f"agent.{k}": "command line" if k in acting_asked else "checkpoint" for k in ACTING_SETTINGS}
    try:
        check_execute_steps(acting["execute_steps"], trained["agent"]["action_horizon"])
    except ValueError as e:
        raise ConfigError(f"{e} (checkpoint={cfg.checkpoint})") from None
    planner, sources["planner"] = to_plain(cfg.planner), "command line (planner=)"
    if "planner" not in keys:
        tweaks = {k.removeprefix("planner."): getattr(cfg.planner, k.removeprefix("planner."))
                  for k in keys if k.startswith("planner.")}  # as the command line set them, typed
        own = trained.get("planner") or {"name": "none"}
        # planner.* settings for a run that trained without search: on the default search, having none of its own
        from_conf = own["name"] == "none" and bool(tweaks)
        planner = {**(to_plain(QWM_DEFAULTS) if from_conf else own), **tweaks}
        sources["planner"] = ("conf/planner/qwm.yaml (the run trained without search)" if from_conf else "checkpoint"
                              ) + (f", {', '.join(tweaks)} from the command line" if tweaks else "")
    task = OmegaConf.merge(trained["task"], OmegaConf.from_dotlist(  # task.* overrides still apply (task.horizon=30)
        [o.removeprefix("task.") for o in overrides if o.startswith("task.")]))
    plain = to_plain(cfg)
    cfg = from_dict(type(cfg), {**plain, "task": to_plain(task), "agent": {**plain["agent"], **acting},
                                "env": {**plain["env"], **{k: trained["env"][k] for k in ("modality", "image_size")}},
                                "planner": planner})
    return cfg, {"planner": planner, "sources": sources}


def describe_acting(acting: dict) -> str:
    """One line: the search and acting settings a checkpoint is evaluated with, and where each came from."""
    planner = acting["planner"]
    search = "no search (planner=none)" if planner["name"] == "none" else ", ".join(
        f"{k}={planner[k]}" for k in ("num_actions", "depth", "drift_decay", "support") if k in planner)
    settings = "; ".join(f"{k} from the {v}" for k, v in acting["sources"].items() if k != "planner")
    return f"[eval] acting as trained: {search} ({acting['sources']['planner']}); {settings}"


def print_table(result: dict) -> None:
    """actor | success | 95% CI | gain vs none [CI] | ms/decision | episodes, one row per actor."""
    rows = [("actor", "success", "95% CI", "gain vs none [CI]", "ms/decision", "episodes")]
    for name, r in result["actors"].items():
        gain = result.get("gains", {}).get(name)
        ms = r["ms_per_decision"]
        rows.append((name, f"{r['success_rate']:.3f}", "[{:.3f}, {:.3f}]".format(*r["success_ci"]),
                     f"{gain['mean']:+.3f} [{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}]" if gain else "-",
                     "-" if ms is None else f"{ms:.1f}", str(r["episodes"])))
    _print_rows(rows)


def print_task_table(summary: dict, actor: str | None = None) -> None:
    """task | instruction | success | 95% CI | episodes, one row per task and the suite mean last."""
    if actor is not None:
        print(f"[eval] {actor}:")
    rows = [("task", "instruction", "success", "95% CI", "episodes")]
    for p in summary["per_task"]:
        rows.append((str(p["task_id"]), p["instruction"], f"{p['success_rate']:.2f}",
                     "[{:.2f}, {:.2f}]".format(*p["success_ci"]), str(p["episodes"])))
    rows.append(("mean", "(suite mean over tasks)", f"{summary['success_rate']:.2f}",
                 "[{:.2f}, {:.2f}]".format(*summary["success_ci"]), str(summary["episodes"])))
    _print_rows(rows)


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
