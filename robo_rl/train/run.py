"""A whole run: demos -> offline pretraining -> (online fine-tuning with QWM search) -> evaluation.

`scripts/train_qwm.py` runs both phases, `scripts/pretrain_offline.py` only the first. `run` builds
everything once (env, agent, buffer, logger, learning curve), hands them to the OfflineTrainer and then
the OnlineTrainer, and ends with one evaluation of paired episodes. Everything a run produces lives in
its run directory: metrics.jsonl, checkpoints/ (+ the replay buffer once online), offline_eval.json, demos/
(demos.generate: robo_rl/train/generated.py),
curves.json/png, eval.json, videos/, and for language-conditioned LIBERO runs instruction_embeddings.json
(the text model runs once per instruction; the checkpoints hold the table too). `resume=true` picks up
from the newest checkpoint there: its model, optimizer, RNG and exactly the buffer saved with it; the
episodes a crash interrupted end there, truncated, and the envs start new ones.

Under torchrun (`torchrun --nproc_per_node=N scripts/train_qwm.py ...`) every rank runs this with its own
envs, buffer and seeds (robo_rl/utils/distributed.py), in rank 0's run directory: rank 0's weights reach all
ranks before training, each gradient step averages the ranks' gradients, and rank 0 alone writes
checkpoints, evaluations and the run's metrics.jsonl (rank r logs its own under rank<r>/).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from robo_rl.checkpoint import (
    build_agent, check_resume, check_room_for_checkpoints, checkpoint_size, latest_checkpoint, load_buffer, load_checkpoint,
    restore_training_state,
)
from robo_rl.core import ACTION_DIM, TASK_KEY, obs_shapes
from robo_rl.data.buffer import ReplayBuffer
from robo_rl.data.language import instruction_embeddings
from robo_rl.envs import EnvSpec, env_spec, make_vec_env
from robo_rl.envs.libero import task_instructions
from robo_rl.schemas import TrainConfig
from robo_rl.train.curves import LearningCurve
from robo_rl.train.generated import generated_demos
from robo_rl.train.offline import OfflineTrainer
from robo_rl.train.online import OnlineTrainer
from robo_rl.train.sources import Demos, offline_episodes, shaped_rewards
from robo_rl.train.trainer import Progress, Trainer
from robo_rl.utils import distributed
from robo_rl.utils.logging import RunLogger, write_json
from robo_rl.utils.runlock import hold_run_dir, release_run_dir
from robo_rl.utils.seeding import seed_everything
from robo_rl.utils.shutdown import GracefulStop, StopRequested
from robo_rl.utils.threads import apply_thread_policy, describe

INSTRUCTION_CACHE = "instruction_embeddings.json"


def run(cfg: TrainConfig, run_dir: str | Path, online: bool = True) -> dict:
    """Train as configured; returns (and writes to run_dir/eval.json) the final evaluation ({} on ranks
    other than 0)."""
    started = time.time()
    rank, world = distributed.init_from_env(cfg.device)
    # torchrun's ranks on one machine share its cores
    threads = apply_thread_policy(cfg.threads, processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if rank == 0:
        print(describe(threads), flush=True)
    run_dir = Path(distributed.broadcast_object(str(run_dir)))  # Hydra's timestamped dir may differ by rank
    if rank == 0:
        hold_run_dir(run_dir)  # one writer per run directory; a live run's directory is refused here
    try:
        demo_env_steps = 0
        if cfg.demos.generate:  # before GracefulStop, so a signal stops it at once: it writes nothing half done
            with distributed.main_first():  # rank 0 generates, the others read its record
                generated = generated_demos(cfg, run_dir)
            cfg, demo_env_steps = replace(cfg, dataset=str(generated.dataset)), generated.env_steps
        with GracefulStop() as stop:  # SIGINT / SIGTERM: a checkpoint at the next step boundary, then StopRequested
            return _run(cfg, run_dir, online, rank, world, threads, started, stop, demo_env_steps)
    except StopRequested as stopped:
        raise StopRequested(stopped.signum, f"{stopped}; continue the run with the same command plus resume=true "
                                            f"hydra.run.dir={run_dir}") from None
    finally:
        if rank == 0:
            release_run_dir(run_dir)


def _run(cfg: TrainConfig, run_dir: Path, online: bool, rank: int, world: int, threads: dict, started: float,
         stop: GracefulStop, demo_env_steps: int) -> dict:
    """`run` in a run directory this process holds (rank 0), with the thread policy applied; a signal that `stop`
    caught ends training at its next step boundary, or the final evaluation at once. demo_env_steps: env steps
    spent making the demos (demos.generate), reported beside the online ones."""
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(distributed.rank_seed(cfg.seed))
    spec = env_spec(cfg, render=True)
    state = _checkpoint_to_resume(cfg, run_dir)
    with distributed.main_first():  # rank 0 writes the scripted-demo cache, the others read it
        demos = offline_episodes(cfg, spec)
    if spec.shaping_gamma and demos:
        demos = shaped_rewards(demos, spec)
    if not online and not demos:
        raise ValueError(f"offline pretraining on {cfg.task.name} needs demonstrations: pass dataset=PATH")
    env = make_vec_env(cfg) if online else None
    try:
        first = demos.obs_shapes if demos else obs_shapes(env.reset(seed=cfg.seed))
        shapes = {k: s for k, s in first.items() if k in spec.low_dim_keys + spec.rgb_keys}
        shapes[TASK_KEY] = ()
        agent = build_agent(cfg.agent, shapes, spec.num_tasks, cfg.device, cfg.compile,
                            instruction_embeddings=_instruction_table(cfg, spec, run_dir))
        buffer = build_buffer(cfg, shapes, demos)
        if buffer.num_offline:
            agent.set_normalization(buffer.obs_stats())
        if rank == 0:  # refuse to start where the run's checkpoints would not fit
            check_room_for_checkpoints(run_dir, checkpoint_size(agent, buffer if online else None))
        progress, continuation = Progress(), None
        if state is not None:
            restore_training_state(agent, state)
            progress = Progress(state["offline_step"], state["env_steps"], state.get("lost_steps", 0))
            if state["phase"] == "online":
                device = buffer.device
                del buffer  # the saved buffer holds the demos too: drop this copy before reading it
                buffer = load_buffer(run_dir, state, device=device)
                # a graceful stop saved its episodes in progress (rank 0's envs: one rank continues them)
                continuation = state.get("continuation") if world == 1 else None
                if continuation is None:
                    buffer.end_episodes()  # the envs restart below: nothing may join the interrupted episodes
        if world > 1:  # every rank starts from rank 0's weights and normalisation
            distributed.broadcast_module_(agent)
            if state is not None and rank:  # the checkpoint restored rank 0's RNGs on every rank
                seed_everything(distributed.rank_seed(cfg.seed) + progress.step)
                buffer.reseed(distributed.rank_seed(cfg.seed) + progress.step)  # else: rank 0's replay batches
        logger = RunLogger(run_dir if rank == 0 else run_dir / f"rank{rank}",
                           cfg if rank == 0 else replace(cfg, logger=replace(cfg.logger, mode="disabled")),
                           name=f"{cfg.task.name}-{run_dir.name}", resume_step=-1 if state is None else progress.step)
        logger.log({f"threads/{k}": v for k, v in threads.items()}, progress.step)  # what this process computes with
        best_of_n = cfg.agent.best_of_n
        curve = LearningCurve(run_dir, resume_env_steps=None if state is None else progress.env_steps,
                              resume_offline_step=progress.offline_step,
                              no_search_actor=f"critic best-of-{best_of_n}" if best_of_n > 1 else "policy",
                              title=f"{cfg.task.name}, budget={cfg.budget.name}, seed {cfg.seed} ({run_dir.name})"
                                    + (f"\n+ {demo_env_steps} env steps making the demos" if demo_env_steps else ""))
        if demo_env_steps:
            logger.log({"data/demo_env_steps": demo_env_steps}, progress.step)

        trainer: Trainer = OfflineTrainer(cfg, agent, buffer, logger, run_dir, progress, curve, stop)
        trainer.train()
        if online:
            trainer = OnlineTrainer(cfg, env, agent, buffer, logger, run_dir, progress, curve, stop, continuation)
            trainer.train()
        # training is checkpointed to its end: a signal from here on stops at once (a resume evaluates again)
        stop.stop_at_once()
    except StopRequested:
        logger.close()
        raise
    finally:
        if env is not None:
            env.close()
    distributed.shutdown()
    if rank:
        logger.close()
        return {}
    result, videos = _final_evaluation(trainer, online, started, threads, demo_env_steps)
    logger.log_videos(videos, progress.step)
    if online:
        curve.add(progress.env_steps, result["success_rate"], result.get("success_rate_no_search"))
        trainer.keep_evaluated()
    logger.log({"eval/success_rate": result["success_rate"], "env_steps": progress.env_steps,
                **({"eval/success_rate_no_search": result["success_rate_no_search"]} if trainer.search else {})},
               progress.step)
    logger.close()
    print(f"[run] {cfg.task.name}: success {result['success_rate']:.2f}"
          + (f" (no search {result['success_rate_no_search']:.2f})" if trainer.search else "")
          + f" -> {run_dir}/eval.json")
    return result


def _checkpoint_to_resume(cfg: TrainConfig, run_dir: Path) -> dict | None:
    """The newest checkpoint of run_dir to resume from (None: start fresh), as `cfg.resume` asks (`check_resume`)."""
    check_resume(cfg.resume, run_dir)
    found = latest_checkpoint(run_dir) if cfg.resume else None
    if found:
        print(f"[run] resuming from {found}")
    elif cfg.resume == "auto":
        print(f"[run] resume=auto: no checkpoint in {run_dir} yet, starting fresh")
    return load_checkpoint(found, cfg.device) if found else None


def _instruction_table(cfg: TrainConfig, spec: EnvSpec, run_dir: Path) -> torch.Tensor | None:
    """[num_tasks, D] embeddings of the suite's instructions (row t: task t) when the encoder is conditioned
    on language, read from run_dir/instruction_embeddings.json or computed once and written there."""
    if cfg.agent.encoder.task != "language" or spec.num_tasks < 2:  # one task: nothing to condition on
        return None
    instructions = task_instructions(spec.env_name)[: spec.num_tasks]
    return instruction_embeddings(instructions, run_dir / INSTRUCTION_CACHE)


def build_buffer(cfg: TrainConfig, shapes: dict, demos: Demos) -> ReplayBuffer:
    """Room for every online step (and two per env), the demonstrations added (read from their files as
    they go in, when they come from files); pinned host memory on CUDA."""
    pin = "cuda" in str(cfg.device)
    buffer = ReplayBuffer(shapes, None, ACTION_DIM, capacity=max(cfg.budget.online_steps, 2 * cfg.env.num_envs) + 1000,
                          num_envs=cfg.env.num_envs, device=cfg.device if pin else "cpu",
                          offline_ratio=cfg.train.offline_ratio, gamma=cfg.train.gamma,
                          seed=distributed.rank_seed(cfg.seed))
    if demos:
        buffer.add_offline(demos.episodes, demos.lengths)
    return buffer


def _final_evaluation(trainer: Trainer, online: bool, started: float, threads: dict,
                      demo_env_steps: int) -> tuple[dict, list[str]]:
    """One pass of paired episodes with search (when on) and without, written as eval.json: the acting
    actor's summary at the top level, both under `actors`, the paired search gain, the run's budgets (env steps
    online, making demos, and both together) and the threads it computed with. Returns it and the paths of the
    videos recorded."""
    cfg = trainer.cfg
    online_env_steps = cfg.budget.online_steps if online else 0
    final = trainer.eval("final", videos=2)
    result: dict = {}
    if online and trainer.offline_success_rate is not None:
        result["offline_success_rate"] = trainer.offline_success_rate
    if trainer.search:
        none = final["actors"]["none"]
        result.update(success_rate_no_search=none["success_rate"], success_ci_no_search=none["success_ci"],
                      search_gain=final.get("search_gain"))  # None below 2 episodes: no t interval
    result = {**final["actors"][trainer.acting], **result, "actors": final["actors"], "task": cfg.task.name,
              "worker_restarts": final["worker_restarts"],
              "planner": cfg.planner.name,
              "offline_steps": cfg.budget.offline_steps, "online_env_steps": online_env_steps,
              "demo_env_steps": demo_env_steps, "env_steps_total": online_env_steps + demo_env_steps,
              "num_online_transitions": trainer.buffer.num_online, "train_wall_s": time.time() - started,
              "threads": threads}
    write_json(trainer.run_dir / "eval.json", result)
    return result, [v for actor in final["actors"].values() for v in actor["videos"]]
