"""Memory and time of loading a LIBERO-10-sized dataset directory into the replay buffer.

The official LIBERO-10 set is 10 files (one per task) of 50 demos of ~300 steps with two 128x128
cameras: ~14.7 GB of raw uint8 images, more than this machine's RAM budget of 12 GB. Training stores
images at `env.image_size` (84 by default), resized as each demo is read. This script writes synthetic
files of the official layout and size (LIBERO's scripts/create_dataset.py: the official key names and
dtypes, images stored upside down, the task's instruction in `problem_info`; gzip-compressed in chunks,
with moving gradients and a moving block so that they compress but are not constant), then loads the
directory exactly as `train_qwm.py task=libero_10 dataset=DIR` does (`offline_episodes` +
`build_buffer`) in a fresh subprocess, and reports its peak RSS (the kernel's high-water mark,
ru_maxrss), the load time and the buffer's bytes against the raw bytes of the files.

    nice -n 15 env OMP_NUM_THREADS=1 python benchmarks/libero_memory.py --demos 500 --steps 300 \
        --size 128 --image-size 84 --json runs/bench/libero_memory.json

The files go to a temporary folder under runs/ (gitignored), deleted at the end unless --keep;
--dir reuses a folder written before. JSON: peak_rss_bytes, load_s, buffer_bytes, raw_bytes,
peak_over_buffer ((peak RSS - RSS before loading) / buffer bytes), bytes per transition (buffer vs raw).
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SUITE = "libero_10"
NUM_TASKS = 10
LOW_DIM = {"joint_states": 7, "gripper_states": 2, "ee_states": 6, "ee_pos": 3, "ee_ori": 3}  # LIBERO's obs
CAMERAS = ("agentview_rgb", "eye_in_hand_rgb")
STATE_DIM, ROBOT_STATE_DIM = 92, 9  # flattened MuJoCo state (LIBERO-10 scenes: 70-110) and robot_states
FRAMES_PER_CHUNK = 32


# ---------------------------------------------------------------------------------------------
# Synthetic files of the official layout
# ---------------------------------------------------------------------------------------------
def frames(rng: np.random.Generator, steps: int, size: int) -> np.ndarray:
    """[steps, size, size, 3] uint8: colour bands drifting over time and a block moving across them."""
    yy, xx = np.mgrid[0:size, 0:size]
    slope = rng.uniform(0.2, 1.5, size=(2, 3))
    base = (xx[..., None] * slope[0] + yy[..., None] * slope[1]).astype(np.uint16)  # [size, size, 3]
    drift = (np.arange(steps)[:, None] * rng.uniform(0.2, 1.0, 3)).astype(np.uint16)  # [steps, 3]
    images = base + drift[:, None, None]
    images &= 0xF0  # bands of flat colour 16 levels apart (gzip finds runs), wrapping at 256
    images = images.astype(np.uint8)
    side = size // 6
    path = rng.integers(0, size - side, size=2) + (np.arange(steps)[:, None] * rng.integers(-1, 2, size=2))
    path = np.clip(path, 0, size - side)
    colour = rng.integers(0, 256, size=3, dtype=np.uint8)
    for k, (y, x) in enumerate(path):
        images[k, y : y + side, x : x + side] = colour
    return images


def write_task_file(path: Path, instruction: str, num_demos: int, steps: int, size: int, seed: int) -> int:
    """One task's file as LIBERO's create_dataset.py writes it; returns the raw bytes of its arrays."""
    rng = np.random.default_rng(seed)
    raw = 0
    compressed = dict(compression="gzip", compression_opts=1)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                 "domain_name": "robosuite", "language_instruction": instruction})
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation",
                                             "env_kwargs": {"camera_heights": size, "camera_widths": size}})
        data.attrs["bddl_file_name"] = f"libero/libero/bddl_files/{SUITE}/{path.stem}.bddl"
        data.attrs["macros_image_convention"] = "opengl"
        data.attrs["tag"] = "libero-v1"
        data.attrs["num_demos"] = num_demos
        for i in range(num_demos):
            g = data.create_group(f"demo_{i}")
            arrays = {f"obs/{k}": rng.normal(size=(steps, d)) for k, d in LOW_DIM.items()}
            arrays.update({f"obs/{k}": frames(rng, steps, size)[:, ::-1] for k in CAMERAS})  # upside down
            dones = np.zeros(steps, np.uint8)
            dones[-1] = 1
            arrays.update(actions=rng.uniform(-1, 1, size=(steps, 7)), states=rng.normal(size=(steps, STATE_DIM)),
                          robot_states=rng.normal(size=(steps, ROBOT_STATE_DIM)), rewards=dones, dones=dones)
            for name, array in arrays.items():
                chunks = (min(steps, FRAMES_PER_CHUNK), *array.shape[1:])
                g.create_dataset(name, data=array, chunks=chunks, **compressed)
                raw += array.nbytes
            g.attrs["num_samples"] = steps
    return raw


def write_suite(folder: Path, demos: int, steps: int, size: int) -> int:
    """NUM_TASKS files named as the official ones (<instruction>_demo.hdf5); returns their raw bytes."""
    from robo_rl.envs.libero import task_instructions

    instructions = task_instructions(SUITE)
    per_task = -(-demos // NUM_TASKS)
    raw = 0
    for task in range(NUM_TASKS):
        n = min(per_task, demos - task * per_task)
        if n <= 0:
            break
        name = re.sub(r"\W+", "_", instructions[task])
        raw += write_task_file(folder / f"{name}_demo.hdf5", instructions[task], n, steps, size, seed=task)
        print(f"  wrote task {task}: {n} demos", flush=True)
    return raw


# ---------------------------------------------------------------------------------------------
# Loading, in a fresh process (so that its peak RSS is the load's alone)
# ---------------------------------------------------------------------------------------------
def rss_bytes() -> int:
    """This process's resident memory now (VmRSS)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def load(folder: str, image_size: int) -> dict:
    """Load `folder` as `train_qwm.py task=libero_10 dataset=folder env.image_size=...` does."""
    from hydra import compose, initialize_config_dir

    from robo_rl.core import TASK_KEY
    from robo_rl.envs import env_spec
    from robo_rl.train.run import build_buffer
    from robo_rl.train.sources import offline_episodes

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["task=libero_10", f"dataset={folder}", f"env.image_size={image_size}"])
    spec = env_spec(cfg)
    before = rss_bytes()
    started = time.perf_counter()
    demos = offline_episodes(cfg, spec)
    buffer = build_buffer(cfg, {**demos.obs_shapes, TASK_KEY: ()}, demos)
    load_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    offline = buffer._offline.arrays()  # the demos' storage (the online ring is allocated, untouched)
    return {"rss_before_load_bytes": before, "peak_rss_bytes": peak, "rss_after_load_bytes": rss_bytes(),
            "load_s": load_s, "buffer_bytes": int(sum(a.nbytes for a in offline.values())),
            "image_bytes": int(sum(a.nbytes for k, a in offline.items() if k.removeprefix("obs/") in CAMERAS)),
            "transitions": buffer.num_offline, "slots": len(buffer._offline),
            "stored_image_shape": list(buffer.obs_shapes[CAMERAS[0]])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, default=500)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--size", type=int, default=128, help="camera resolution stored in the files")
    p.add_argument("--image-size", type=int, default=84, help="env.image_size: the resolution the buffer stores")
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--dir", type=str, default=None, help="load this folder (written before with --keep)")
    p.add_argument("--keep", action="store_true", help="keep the written files")
    p.add_argument("--load", type=str, default=None, help=argparse.SUPPRESS)  # the subprocess's job
    args = p.parse_args()
    if args.load:
        print(json.dumps(load(args.load, args.image_size)))
        return

    if args.dir:
        folder, written_s = Path(args.dir), 0.0
        raw = None
    else:
        (ROOT / "runs").mkdir(exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="libero_memory_", dir=ROOT / "runs"))
        print(f"writing {args.demos} demos x {args.steps} steps, 2 cameras {args.size}px -> {folder}", flush=True)
        started = time.perf_counter()
        raw = write_suite(folder, args.demos, args.steps, args.size)
        written_s = time.perf_counter() - started
    try:
        disk = sum(f.stat().st_size for f in folder.glob("*.hdf5"))
        proc = subprocess.run([sys.executable, __file__, "--load", str(folder), "--image-size", str(args.image_size)],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"loading failed:\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder)
    n = result["transitions"]
    raw_image_per_transition = len(CAMERAS) * args.size**2 * 3
    result.update(demos=args.demos, steps=args.steps, file_image_size=args.size, image_size=args.image_size,
                  disk_bytes=disk, write_s=written_s, raw_bytes=raw,
                  raw_image_bytes=n * raw_image_per_transition,
                  load_overhead_bytes=result["peak_rss_bytes"] - result["rss_before_load_bytes"],
                  buffer_bytes_per_transition=result["buffer_bytes"] / n,
                  raw_image_bytes_per_transition=raw_image_per_transition)
    result["peak_over_buffer"] = result["load_overhead_bytes"] / result["buffer_bytes"]
    gb = 1e9
    rows = [("demos x steps", f"{args.demos} x {args.steps}"),
            ("cameras in files / in buffer", f"2 x {args.size}px / 2 x {args.image_size}px"),
            ("files on disk (gzip)", f"{disk / gb:.2f} GB"),
            ("raw images at file size", f"{result['raw_image_bytes'] / gb:.2f} GB"),
            ("buffer (offline part)", f"{result['buffer_bytes'] / gb:.2f} GB"),
            ("RSS before loading", f"{result['rss_before_load_bytes'] / gb:.2f} GB"),
            ("peak RSS", f"{result['peak_rss_bytes'] / gb:.2f} GB"),
            ("peak - before / buffer", f"{result['peak_over_buffer']:.3f}"),
            ("load time", f"{result['load_s']:.0f} s"),
            ("bytes/transition buffer vs raw images",
             f"{result['buffer_bytes_per_transition']:.0f} vs {raw_image_per_transition}")]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if args.json:
        from robo_rl.utils.logging import write_json

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, result)


if __name__ == "__main__":
    main()
