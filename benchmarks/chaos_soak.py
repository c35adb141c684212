"""A chaos soak: a default Lift training run disturbed by every fault robo_rl guards against, then checked for
lost or made-up data and compared with an undisturbed run of the same seed and length.

    sudo python benchmarks/chaos_soak.py --task lift --minutes 20 --json OUT [--online-steps 6000] [--seed 0] [key=value ...]

While the run trains, a driver applies faults on a fixed random schedule (`--schedule-seed`) spread over
`--minutes` of wall time: SIGKILL of an env worker (`--worker-kills`, 10), SIGKILL of the trainer's whole
process group and a resume (`--trainer-kills`, 3), one SIGTERM and a resume, and one disk-full: the run directory
lies on a size-limited tmpfs (mounted here, hence root), which the driver fills to within `--headroom-kb` of full
so that the next checkpoint write fails with a real ENOSPC; once the run has stopped on it, the filler goes and
the run resumes. The undisturbed run has the same command, seed and budget, without faults.

Checks, written as JSON with the faults applied (`faults`, counts by kind) and every restart (`restarts`):
  online_transitions == env_steps_taken    transitions in the final replay buffer vs the env steps the run counts,
                                           less the steps a killed worker never took (`lost_steps`)
  episodes_crossing_a_restart == 0         stored episodes that span the point where a crashed run resumed
                                           (a graceful stop's episodes continue exactly and are not counted)
  duplicate_or_missing_metric_steps == 0   online log records of metrics.jsonl, one per budget.log_every env steps
  checkpoints_loadable                     every checkpoint file left (and the buffer each names) loads
  final_success, success_delta             both final checkpoints on the same --episodes evaluation episodes
                                           (scripts/evaluate.py, QWM search), the paired difference and its interval
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("worker_kill", "trainer_kill", "sigterm", "disk_full")


@dataclass
class Fault:
    at_s: float  # seconds after the soak's start
    kind: str  # one of KINDS
    applied_s: float | None = None  # when it was applied (a worker kill waits for a worker to exist)


def fault_schedule(minutes: float, seed: int, worker_kills: int, trainer_kills: int) -> list[Fault]:
    """The faults at fixed random times in the middle 80% of the soak, in time order."""
    rng = random.Random(seed)
    kinds = ["worker_kill"] * worker_kills + ["trainer_kill"] * trainer_kills + ["sigterm", "disk_full"]
    times = sorted(rng.uniform(0.1, 0.9) * minutes * 60 for _ in kinds)
    rng.shuffle(kinds)
    return [Fault(t, k) for t, k in zip(times, kinds)]


# -- the checks: each takes what a finished run left ---------------------------------------------
def transitions_vs_steps(buffer, state: dict) -> dict:
    """The buffer's online transitions against the env steps the run took (its counter, less the lost ones)."""
    taken = state["env_steps"] - state.get("lost_steps", 0)
    return {"online_transitions": buffer.num_online, "env_steps_taken": taken, "ok": buffer.num_online == taken}


def episodes_crossing(buffer, resume_points: list[list[int]]) -> int:
    """Stored episodes whose observations span a crash resume: one of `resume_points` (per-stream write counts
    of the checkpoint a crashed run resumed from) lies strictly inside the episode's observations."""
    return sum(any(start < points[stream] <= start + steps for points in resume_points)
               for stream, start, steps in buffer.episode_spans())


def repeated_transitions(buffer) -> int:
    """Stored transitions whose next observation repeats its observation exactly: no simulator step does that
    with the arm under OSC control, so each is a made-up or duplicated transition."""
    count = 0
    for episode in buffer.online_episodes():
        state = np.concatenate([v.reshape(len(v), -1) for k, v in episode.obs.items() if k != "task_id"], axis=1)
        count += int((np.abs(np.diff(state, axis=0)).max(axis=1) == 0).sum())
    return count


def metric_steps(records: list[dict], log_every: int, online_steps: int) -> dict:
    """Duplicated and missing env steps among the online log records (one per log_every env steps)."""
    steps = [r["env_steps"] for r in records if "rollout/steps_per_s" in r]
    expected = set(range(steps[0], online_steps + 1, log_every)) if steps else set()
    expected |= {online_steps} if steps else set()  # the last record, at the budget's end
    return {"duplicates": len(steps) - len(set(steps)), "missing": sorted(expected - set(steps))}


def loadable_checkpoints(run_dir: Path) -> dict:
    """Every checkpoint file under run_dir/checkpoints (and the buffer an online one names), loaded."""
    from robo_rl.checkpoint import load_buffer

    results = {}
    for path in sorted((run_dir / "checkpoints").rglob("step_*.pt")):
        try:
            state = torch.load(path, weights_only=False)
            if "buffer" in state:
                load_buffer(run_dir, state)
            results[str(path.relative_to(run_dir))] = True
        except Exception as e:  # noqa: BLE001 - any failure to load is what this check reports
            results[str(path.relative_to(run_dir))] = f"{type(e).__name__}: {e}"
    return results


# -- running and disturbing ----------------------------------------------------------------------
class Training:
    """scripts/train_qwm.py in its own process group, its output appended to run_dir's log."""

    def __init__(self, run_dir: Path, overrides: list[str], log: Path):
        self.run_dir, self.overrides, self.log, self.proc = run_dir, overrides, log, None

    def start(self, resume: bool) -> None:
        command = [sys.executable, str(ROOT / "scripts/train_qwm.py"), f"hydra.run.dir={self.run_dir}",
                   *self.overrides, *(["resume=true"] if resume else [])]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ, "WANDB_MODE": "disabled"})

    def workers(self) -> list[psutil.Process]:
        """Its live env worker processes (multiprocessing's spawned children, not the resource tracker)."""
        workers = []
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                command = " ".join(child.cmdline())
                if "spawn_main" in command and "resource_tracker" not in command:
                    workers.append(child)
        except psutil.Error:  # the trainer or a child ended (or is a zombie) meanwhile: none to pick this time
            return []
        return workers

    def kill_group(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def newest_checkpoint(run_dir: Path) -> dict | None:
    from robo_rl.checkpoint import load_checkpoint, latest_checkpoint

    return load_checkpoint(run_dir) if latest_checkpoint(run_dir) else None


def disturbed_run(run_dir: Path, overrides: list[str], faults: list[Fault], mount: Path, headroom: int,
                  timeout_s: float, log: Path) -> dict:
    """Train to the budget's end while applying `faults`; returns the restarts and crash resume points."""
    training = Training(run_dir, overrides, log)
    training.start(resume=False)
    start, pending = time.time(), list(faults)
    restarts, resume_points = [], []

    def restart(why: str) -> None:
        state = newest_checkpoint(run_dir)
        graceful = state is not None and "continuation" in state
        if state is not None and "buffer" in state and not graceful:  # a crashed online run resumes here
            resume_points.append(state["buffer"]["write_counts"])
        restarts.append({"why": why, "at_s": round(time.time() - start, 1),
                         "from_step": None if state is None else state["offline_step"] + state["env_steps"],
                         "continues_episodes": graceful})
        training.start(resume=True)

    while True:
        if time.time() - start > timeout_s:
            training.kill_group()
            raise RuntimeError(f"the soak ran past {timeout_s:.0f} s; see {training.log}")
        code = training.proc.poll()
        if code is not None:
            if code == 0:
                break
            raise RuntimeError(f"the run exited with {code} without a fault asking it to; see {training.log}")
        workers = training.workers()
        # the earliest fault that is due and can be applied: a worker kill waits for a worker (the offline phase
        # has none) while the faults behind it go ahead
        due = [f for f in pending if time.time() - start >= f.at_s and (f.kind != "worker_kill" or workers)]
        if due:
            fault = due[0]
            if fault.kind == "worker_kill":
                random.Random(len(pending)).choice(workers).kill()
            elif fault.kind == "trainer_kill":
                training.kill_group()
                restart("trainer SIGKILL")
            elif fault.kind == "sigterm":
                training.proc.send_signal(signal.SIGTERM)
                # 143: stopped with a checkpoint; -15: SIGTERM's default end, before the run caught signals (its
                # first seconds: imports and config checks, with nothing written yet)
                if (code := training.proc.wait(timeout=600)) not in (128 + signal.SIGTERM, -signal.SIGTERM):
                    raise RuntimeError(f"SIGTERM ended the run with {code}, not 143; see {training.log}")
                restart(f"SIGTERM (exit {code})")
            elif fault.kind == "disk_full":
                filler = mount / "filler"
                free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
                with filler.open("wb") as f:
                    f.truncate(0)
                    f.write(b"\0" * max(0, free - headroom))
                code = training.proc.wait(timeout=1800)  # the next checkpoint write fails
                filler.unlink()
                if code != 2:
                    raise RuntimeError(f"the full disk ended the run with {code}, not 2; see {training.log}")
                restart("disk full")
            fault.applied_s = round(time.time() - start, 1)
            pending.remove(fault)
        time.sleep(0.5)
    return {"restarts": restarts, "resume_points": resume_points, "wall_s": round(time.time() - start, 1),
            "unapplied": [asdict(f) for f in pending]}


def evaluate(run_dir: Path, episodes: int, out: Path) -> list[bool]:
    """Per-episode success of run_dir's final checkpoint acting with the QWM search (scripts/evaluate.py)."""
    subprocess.run([sys.executable, str(ROOT / "scripts/evaluate.py"), f"checkpoint={run_dir}", "planner=qwm",
                    f"episodes={episodes}", "videos=0", f"hydra.run.dir={out}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    records = json.loads((out / "eval.json").read_text())["per_episode"]
    return [bool(r["success"]) for r in sorted(records, key=lambda r: r["seed"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="lift")
    parser.add_argument("--minutes", type=float, default=20.0, help="wall time the faults are spread over")
    parser.add_argument("--online-steps", type=int, default=6000, help="the runs' budget.online_steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedule-seed", type=int, default=0)
    parser.add_argument("--worker-kills", type=int, default=10)
    parser.add_argument("--trainer-kills", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=100, help="paired evaluation episodes of both runs")
    parser.add_argument("--disk-mb", type=int, default=512, help="size of the tmpfs the disturbed run writes to")
    parser.add_argument("--headroom-kb", type=int, default=256, help="space the disk-full fault leaves free")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs/chaos_soak")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="more train_qwm.py overrides for both runs (key=value)")
    args = parser.parse_args()
    from robo_rl.checkpoint import load_buffer
    from robo_rl.eval.stats import paired_difference, success_ci

    overrides = [f"task={args.task}", f"seed={args.seed}", f"budget.online_steps={args.online_steps}",
                 "logger.mode=disabled", *args.overrides]
    mount = args.workdir / "tmpfs"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", str(mount)], check=True)
    try:
        faults = fault_schedule(args.minutes, args.schedule_seed, args.worker_kills, args.trainer_kills)
        soak = disturbed_run(mount / "disturbed", overrides, faults, mount, args.headroom_kb * 1024,
                             timeout_s=args.minutes * 60 * 4, log=args.workdir / "disturbed.log")
        disturbed = mount / "disturbed"
        state = torch.load(sorted((disturbed / "checkpoints").glob("step_*.pt"))[-1], weights_only=False)
        buffer = load_buffer(disturbed, state)
        records = [json.loads(line) for line in (disturbed / "metrics.jsonl").read_text().splitlines()]
        log_every = state["config"]["budget"]["log_every"]
        checks = {
            "transitions": transitions_vs_steps(buffer, state),
            "episodes_crossing_a_restart": episodes_crossing(buffer, soak["resume_points"]),
            "repeated_transitions": repeated_transitions(buffer),
            "metric_steps": metric_steps(records, log_every, args.online_steps),
            "checkpoints_loadable": loadable_checkpoints(disturbed),
        }
        calm = args.workdir / "undisturbed"
        if not (calm / "eval.json").exists():  # a finished one of an earlier soak with these settings is reused
            training = Training(calm, overrides, args.workdir / "undisturbed.log")
            training.start(resume=(calm / "checkpoints").exists())
            if training.proc.wait() != 0:
                raise RuntimeError(f"the undisturbed run failed; see {training.log}")
        success = {name: evaluate(d, args.episodes, args.workdir / f"eval_{name}")
                   for name, d in (("disturbed", disturbed), ("undisturbed", calm))}
        shutil.copytree(disturbed, args.workdir / "disturbed", dirs_exist_ok=True)  # the tmpfs goes below
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
    applied = [f for f in faults if f.applied_s is not None]
    result = {
        "faults": {k: sum(f.kind == k for f in applied) for k in KINDS},
        "schedule": [asdict(f) for f in faults],
        **{k: soak[k] for k in ("restarts", "wall_s", "unapplied")},
        "online_transitions": checks["transitions"]["online_transitions"],
        "env_steps_taken": checks["transitions"]["env_steps_taken"],
        "episodes_crossing_a_restart": checks["episodes_crossing_a_restart"],
        "repeated_transitions": checks["repeated_transitions"],
        "duplicate_or_missing_metric_steps": checks["metric_steps"]["duplicates"] + len(checks["metric_steps"]["missing"]),
        "metric_steps": checks["metric_steps"],
        "checkpoints_loadable": checks["checkpoints_loadable"],
        "final_success": {k: {"success_rate": float(np.mean(v)), "success_ci": success_ci(v), "episodes": len(v)}
                          for k, v in success.items()},
        "success_delta": paired_difference(success["disturbed"], success["undisturbed"]),
    }
    result["all_checks_pass"] = bool(
        checks["transitions"]["ok"] and result["episodes_crossing_a_restart"] == 0 and result["repeated_transitions"] == 0
        and result["duplicate_or_missing_metric_steps"] == 0
        and all(v is True for v in result["checkpoints_loadable"].values()))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    delta = result["success_delta"]
    print(f"faults {result['faults']} over {result['wall_s']:.0f} s, {len(result['restarts'])} restarts")
    print(f"online transitions {result['online_transitions']} vs env steps taken {result['env_steps_taken']}; "
          f"episodes crossing a restart {result['episodes_crossing_a_restart']}; repeated transitions "
          f"{result['repeated_transitions']}; duplicate or missing metric steps "
          f"{result['duplicate_or_missing_metric_steps']}; checkpoints loadable "
          f"{sum(v is True for v in result['checkpoints_loadable'].values())}/{len(result['checkpoints_loadable'])}")
    print(f"success disturbed {result['final_success']['disturbed']['success_rate']:.3f} vs undisturbed "
          f"{result['final_success']['undisturbed']['success_rate']:.3f}: delta {delta['mean']:+.3f} "
          f"[{delta['ci_low']:+.3f}, {delta['ci_high']:+.3f}] over {delta['episodes']} paired episodes")
    print("all checks pass" if result["all_checks_pass"] else "SOME CHECKS FAIL")


if __name__ == "__main__":
    main()
