"""Many demos from a few, as the first step of a run: `train_qwm.py task=lift dataset=FEW.hdf5 demos.generate=N`.

A raw robosuite file (human teleoperation: states and actions, no observations) is first converted by
re-executing each demo's hand path with the path tracker (`convert_robosuite.py track_path=true`: key-pulse
actions teach a cloned policy to wait); a robomimic dataset of the task is used as it is. Then N demos are
generated from it (`generate_demos.py`: each source path moved with the object to new scenes, kept only when it
succeeds) and the run trains on the sources plus the generated demos. Both steps run the simulator, so their
env steps (failed attempts too) are the run's interaction with the env as much as its online steps are: the
run reports them (eval.json: `demo_env_steps`, `env_steps_total`).

Everything lands in the run's `demos/` folder with a record of what it cost; a resumed run (or another rank)
reads the record instead of generating again. Nothing is written until a step completes, so a run stopped
during generation starts it over.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from robo_rl.data.hdf5 import DatasetError, dataset_files
from robo_rl.demos.convert import convert_robosuite, is_raw_robosuite, raw_env_name
from robo_rl.demos.generate import generate_demos
from robo_rl.schemas import TaskConfig, TrainConfig
from robo_rl.train.sources import check_dataset
from robo_rl.utils.logging import write_json
from robo_rl.utils.schema import ConfigError

FOLDER = "demos"


@dataclass
class GeneratedDemos:
    dataset: Path  # the robomimic file the run trains on: the source demos, then the generated ones
    env_steps: int  # simulator steps it took: the path tracker's re-executions and every generation attempt


def check_generation_source(dataset: str, task: TaskConfig) -> None:
    """`dataset=` for demos.generate: one file, raw robosuite demos recorded in the task's env or a robomimic
    dataset of the task (`robo_rl/config.py` runs this before a run starts)."""
    try:
        dataset_files(dataset)  # exists, or a message naming where to get it
        if Path(dataset).is_dir():
            raise ConfigError(f"dataset={dataset} with demos.generate: generation starts from one file of demos, "
                              "not a folder; pass the file")
        raw = is_raw_robosuite(dataset)
        recorded = raw_env_name(dataset) if raw else None
    except DatasetError as e:  # its message starts with the path
        raise ConfigError(f"dataset={e}") from None
    if not raw:
        check_dataset(dataset, task)
    elif recorded != task.env_name:
        raise ConfigError(f"dataset {dataset} holds raw demos recorded in {recorded}, but task={task.name} runs "
                          f"{task.env_name}: pass the task of the file, or {task.env_name} demos")


def generated_demos(cfg: TrainConfig, run_dir: Path) -> GeneratedDemos:
    """The run's generated dataset (module docstring): read from its record in run_dir/demos/ when a run made
    it before, else made now."""
    folder = Path(run_dir) / FOLDER
    n, source = cfg.demos.generate, Path(cfg.dataset).resolve()
    output = folder / f"generated{n}_seed{cfg.seed}.hdf5"
    record_path = output.with_suffix(".json")
    if record_path.exists() and output.exists():
        record = json.loads(record_path.read_text())
        if record["source"] == str(source):
            print(f"[data] {n} demos generated from {source} before: {output}", flush=True)
            return GeneratedDemos(output, record["env_steps"])
    folder.mkdir(parents=True, exist_ok=True)
    record = {"source": str(source), "num_demos": n, "seed": cfg.seed, "conversion_env_steps": 0}
    if is_raw_robosuite(source):
        tracked = folder / f"{source.stem}_tracked.hdf5"
        print(f"[data] {source}: raw demos, re-executing their hand paths with the path tracker -> {tracked}",
              flush=True)
        reports = convert_robosuite(str(source), str(tracked), track_path=True)
        record["conversion_env_steps"] = sum(r.kept_steps for r in reports)
        print(f"[data] {sum(r.success for r in reports)} of {len(reports)} demos still succeed tracked "
              f"({record['conversion_env_steps']} env steps)", flush=True)
        source = tracked
    print(f"[data] generating {n} demos from {source} -> {output}", flush=True)
    report = generate_demos(str(source), str(output), n, cfg.task.object_symmetry, seed=cfg.seed)
    record |= {"attempts": report.attempts, "generated": report.generated, "generation_env_steps": report.env_steps,
               "env_steps": record["conversion_env_steps"] + report.env_steps}
    print(f"[data] {report.generated} of {report.attempts} executions succeeded; making the demos took "
          f"{record['env_steps']} env steps", flush=True)
    write_json(record_path, record)
    return GeneratedDemos(output, record["env_steps"])
