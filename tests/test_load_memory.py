"""A LIBERO dataset folder loads the way training loads it: images resized to env.image_size as each
demo is read, and no more memory held on the way than about the buffer it fills (the official
LIBERO-10 set is 14.7 GB at its stored 128 px; benchmarks/libero_memory.py measures that scale)."""
import json
import re
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
from hydra import compose, initialize_config_dir

from robo_rl.core import TASK_KEY
from robo_rl.envs import env_spec
from robo_rl.envs.libero import task_instructions
from robo_rl.train.run import build_buffer
from robo_rl.train.sources import offline_episodes

ROOT = Path(__file__).resolve().parents[1]
STORED, CONFIGURED = 64, 32  # camera pixels in the files, env.image_size
CAMERAS = ("agentview_rgb", "eye_in_hand_rgb")
LOW_DIM = {"joint_states": 7, "gripper_states": 2, "ee_states": 6}
TASKS, DEMOS, STEPS = 2, 20, 60


def write_task(path: Path, instruction: str, rng: np.random.Generator) -> list[np.ndarray]:
    """One task's file in LIBERO's layout (images upside down, no next_obs); returns each demo's upright
    agentview frames [STEPS, H, W, 3]."""
    upright = []
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": instruction})
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation", "env_kwargs": {}})
        data.attrs["macros_image_convention"] = "opengl"
        for i in range(DEMOS):
            g = data.create_group(f"demo_{i}")
            for camera in CAMERAS:
                frames = rng.integers(0, 256, size=(STEPS, STORED, STORED, 3), dtype=np.uint8)
                g.create_dataset(f"obs/{camera}", data=frames[:, ::-1], chunks=(8, STORED, STORED, 3))
                if camera == CAMERAS[0]:
                    upright.append(frames)
            for key, dim in LOW_DIM.items():
                g.create_dataset(f"obs/{key}", data=rng.normal(size=(STEPS, dim)))
            g.create_dataset("actions", data=rng.uniform(-1, 1, size=(STEPS, 7)))
            dones = np.zeros(STEPS, np.uint8)
            dones[-1] = 1
            g.create_dataset("rewards", data=dones)
            g.create_dataset("dones", data=dones)
    return upright


def test_libero_folder_loads_resized_within_about_the_buffers_memory(tmp_path):
    rng = np.random.default_rng(0)
    instructions = task_instructions("libero_10")[:TASKS]
    upright = [write_task(tmp_path / (re.sub(r"\W+", "_", text) + "_demo.hdf5"), text, rng) for text in instructions]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["task=libero_10", f"dataset={tmp_path}", f"env.image_size={CONFIGURED}",
                                           "budget=smoke"])
    spec = env_spec(cfg)

    tracemalloc.start()  # numpy reports its arrays' memory to tracemalloc: the buffer and every temporary
    try:
        demos = offline_episodes(cfg, spec)
        buffer = build_buffer(cfg, {**demos.obs_shapes, TASK_KEY: ()}, demos)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert buffer.num_offline == TASKS * DEMOS * STEPS
    assert buffer.obs_shapes[CAMERAS[0]] == (3, CONFIGURED, CONFIGURED)
    # area averaging of the upright frames: each 2x2 block's mean (ties to even, as torch rounds)
    k = STORED // CONFIGURED
    blocks = upright[1][0][5].reshape(CONFIGURED, k, CONFIGURED, k, 3).astype(np.float64).mean(axis=(1, 3))
    stored_at = DEMOS * (STEPS + 1) + 5  # task 1's first demo, step 5 (each demo takes T+1 slots)
    np.testing.assert_array_equal(buffer._offline.obs[CAMERAS[0]][stored_at], np.round(blocks).transpose(2, 0, 1))
    assert buffer._offline.obs[TASK_KEY][stored_at] == 1

    held = sum(a.nbytes for part in (buffer._offline, buffer._online) for a in part.arrays().values())
    offline_images = sum(buffer._offline.obs[c].nbytes for c in CAMERAS)
    # On top of the buffer: the demo being read and the one being copied, and one chunk of frames at the
    # stored size (~0.1 of the images here). Reading a whole file before copying it would add at least
    # a file's images at the configured size (0.5 here; 4x that at the stored size), the whole folder 1.
    assert peak - held < 0.25 * offline_images, (peak - held, offline_images)
