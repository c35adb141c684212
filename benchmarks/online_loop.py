"""The online loop of a default run, timed: env steps per second of `scripts/train_qwm.py` at budget=cpu
(acting with the default search, `budget.utd` updates per env step, buffer adds, logging), against the same
loop on a baseline commit run in the same invocation.

    python benchmarks/online_loop.py --task lift --json OUT [--obs state] [--env-steps 600] [--rounds 2]
    python benchmarks/online_loop.py --task libero_10 --obs state --json OUT

Each measurement is a real training run (a short offline phase, then `--env-steps` online env steps; LIBERO
suites start online from scratch, as collecting their scripted demos would take longer than the loop) whose
rate is its last online log record: env steps over the online loop's wall time, evaluations excluded; once
that record is written the run is stopped (its final evaluation is no part of the loop).
Rounds of this checkout and the baseline are interleaved and the best of each is reported (other processes
only ever slow a round down). JSON keys:
  env_steps_per_s            this checkout's loop
  split                      seconds of that run's loop in env stepping, act (the search), update, buffer, other
  baseline_env_steps_per_s   the same command on `--baseline` (a git worktree of it, run with this venv)
  speedup_vs_baseline        env_steps_per_s / baseline_env_steps_per_s
  env_only_steps_per_s       the same envs (make_vec_env of the same config) stepped with random actions: the
                             loop's ceiling without acting or learning
  two_jobs_vs_alone          [a, b]: two copies of this checkout's loop started together, each one's rate over
                             the rate alone (1.0: no slowdown; 0.5: two jobs share the cores fairly)
  overrides, rounds, load_average
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "cdf2382"  # main before the online-loop work (issue 46): lockstep loop, torch's default OpenMP spin


def loop_overrides(task: str, obs: str, env_steps: int, extra: list[str]) -> list[str]:
    """train_qwm.py overrides for a loop of `env_steps` online env steps that both commits accept."""
    overrides = [f"task={task}", f"env={obs}", "budget=cpu", f"budget.online_steps={env_steps}",
                 "budget.eval_episodes=1", f"budget.checkpoint_every={env_steps}", f"budget.log_every={env_steps}",
                 "logger.mode=disabled"]
    if task.startswith("libero"):
        overrides.append("task.expert=null")  # online from scratch: no demo collection before the loop
    else:
        overrides.append("budget.offline_steps=100")
    return overrides + extra


def start_loop(root: Path, run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """scripts/train_qwm.py of checkout `root` (its robo_rl shadows the installed one) in the background."""
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled"}
    for key in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):  # each checkout applies its own thread policy
        env.pop(key, None)
    log = (run_dir.parent / f"{run_dir.name}.log").open("w")
    return subprocess.Popen([sys.executable, str(root / "scripts/train_qwm.py"), f"hydra.run.dir={run_dir}",
                             *overrides], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)


def last_loop_record(run_dir: Path, env_steps: int) -> dict | None:
    """The run's online log record at `env_steps` (the loop's end), once it is written; None before."""
    metrics = run_dir / "metrics.jsonl"
    # every record ends in a newline: what follows the last one is a record still being written
    lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
    records = (json.loads(line) for line in lines)
    return next((r for r in records if "rollout/steps_per_s" in r and r.get("env_steps", 0) >= env_steps), None)


def run_loops(jobs: list[tuple[Path, Path]], overrides: list[str], env_steps: int) -> list[dict]:
    """Loops of (checkout, run dir) started together; each one's rate and, where the checkout logs it, the
    loop's split. Once every loop of the group has logged its end, the runs are stopped (SIGTERM): the final
    evaluation is no part of the loop (LIBERO's takes over 10 minutes), and while any loop still runs the others
    keep running, so that no loop of a group ends on an emptier machine than it ran on."""
    procs = [start_loop(root, run_dir, overrides) for root, run_dir in jobs]
    try:
        while True:
            records = [last_loop_record(run_dir, env_steps) for _, run_dir in jobs]
            if all(records):
                break
            for (_, run_dir), proc, record in zip(jobs, procs, records):
                if record is None and proc.poll() is not None:
                    raise RuntimeError(f"the loop in {run_dir} failed (exit {proc.returncode}): see {run_dir}.log")
            time.sleep(2)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    results = []
    for last in records:
        split = {k.removeprefix("rollout/seconds_"): v for k, v in last.items() if k.startswith("rollout/seconds_")}
        results.append({"env_steps_per_s": last["rollout/steps_per_s"], "split": split or None})
    return results


def env_only_rate(task: str, obs: str, env_steps: int) -> float:
    """Env steps/s of the run's envs (make_vec_env of the same config) under uniform random actions."""
    from robo_rl.utils.threads import prepare_openmp

    prepare_openmp()
    import numpy as np
    from hydra import compose, initialize_config_dir

    from robo_rl.envs import make_vec_env

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"task={task}", f"env={obs}"])
    env = make_vec_env(cfg)
    try:
        rng = np.random.default_rng(0)
        env.reset(seed=0)
        start, steps = time.perf_counter(), 0
        while steps < env_steps:
            env.step(rng.uniform(-1, 1, (env.num_envs, 7)))
            steps += env.num_envs
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def baseline_checkout(rev: str, where: Path) -> Path:
    """A detached git worktree of `rev` under `where`."""
    path = where / f"baseline-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="lift")
    parser.add_argument("--obs", default="state", choices=["state", "image"])
    parser.add_argument("--env-steps", type=int, default=600, help="online env steps of each loop")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of this checkout and the baseline")
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with ('none': skip)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="more train_qwm.py overrides for both loops (key=value)")
    args = parser.parse_args()
    overrides = loop_overrides(args.task, args.obs, args.env_steps, args.overrides)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="online_loop_") as tmp:
        tmp = Path(tmp)
        base = baseline_checkout(args.baseline, tmp) if args.baseline != "none" else None
        try:
            rounds: dict[str, list[dict]] = {"this": [], "baseline": []}
            for r in range(args.rounds):
                rounds["this"] += run_loops([(ROOT, tmp / f"this{r}")], overrides, args.env_steps)
                if base is not None:
                    rounds["baseline"] += run_loops([(base, tmp / f"baseline{r}")], overrides, args.env_steps)
            two = run_loops([(ROOT, tmp / "two_a"), (ROOT, tmp / "two_b")], overrides, args.env_steps)
        finally:
            if base is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
        env_only = env_only_rate(args.task, args.obs, args.env_steps)
    best = max(rounds["this"], key=lambda r: r["env_steps_per_s"])
    alone = best["env_steps_per_s"]
    results = {
        "task": args.task, "obs": args.obs, "env_steps": args.env_steps,
        "env_steps_per_s": alone, "split": best["split"],
        "env_only_steps_per_s": env_only,
        "two_jobs_vs_alone": [r["env_steps_per_s"] / alone for r in two],
        "overrides": overrides, "rounds": rounds, "load_average": [load_before, os.getloadavg()[0]],
    }
    if rounds["baseline"]:
        baseline = max(r["env_steps_per_s"] for r in rounds["baseline"])
        results |= {"baseline": args.baseline, "baseline_env_steps_per_s": baseline,
                    "speedup_vs_baseline": alone / baseline}
    print(f"online loop, {args.task} {args.obs}, {args.env_steps} env steps, best of {args.rounds} round(s), "
          f"load {load_before:.2f} -> {results['load_average'][1]:.2f}")
    print(f"{'this checkout':28s} {alone:8.2f} env steps/s")
    if rounds["baseline"]:
        print(f"{'baseline ' + args.baseline:28s} {results['baseline_env_steps_per_s']:8.2f} env steps/s   "
              f"speedup {results['speedup_vs_baseline']:.2f}x")
    print(f"{'env only (random actions)':28s} {env_only:8.2f} env steps/s")
    print(f"{'two jobs vs alone':28s} " + " / ".join(f"{x:.2f}" for x in results["two_jobs_vs_alone"]))
    if best["split"]:
        total = sum(best["split"].values())
        print("split: " + ", ".join(f"{k} {v:.1f} s ({v / total:.0%})" for k, v in best["split"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
