"""Robomimic and LIBERO HDF5 files <-> `Episode`s.

Robomimic layout (what robomimic's own readers expect, and what we write):
    data                attrs: total (transitions), env_args (JSON: env_name, type, env_kwargs)
    data/demo_i         attrs: num_samples (T), model_file (MJCF XML, when known)
        actions [T, A]  rewards [T]  dones [T]  states [T, D] (flattened MuJoCo state, when known)
        obs/<key> [T, ...]  next_obs/<key> [T, ...]     low-dim float, images uint8 H x W x C upright
    mask/<filter>       demo names (bytes), at least `train` and `valid`
LIBERO layout (one file per task; read, and written by `write_libero`): the same `data/demo_i` groups but
no `next_obs` and no `mask` (obs has T rows: the final observation is not kept); images `agentview_rgb` /
`eye_in_hand_rgb` stored upside down (OpenGL convention, `macros_image_convention`); the task's language
instruction in the `problem_info` JSON attr of `data`, its BDDL file in `bddl_file_name`.

In memory an `Episode` holds T+1 observations (obs[t+1] follows action t) so that nothing is
stored twice; images are channels-first and upright.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

from robo_rl.core import TASK_KEY, is_image_key

# Data-group attrs with a dedicated `Dataset` field; every other attr lands in `Dataset.attrs`.
_KNOWN_DATA_ATTRS = ("total", "env_args")
# How far past [-1, 1] a stored action may lie and still count as in range (and be clipped onto it).
# Round-off of normalized actions (float32: ~1e-7; even float16's half step: ~5e-4) stays below it;
# actions that were never normalized (raw device deltas, joint targets, scaled x50) overshoot by far
# more. robosuite's controllers clip their input to [-1, 1], so a clipped action is what the simulator
# executes.
ACTION_TOLERANCE = 1e-3
_DEMO_NAME = re.compile(r"demo_(\d+)$")
# Images are read, flipped and resized this many frames at a time. Whole-demo temporaries (15 MB per
# 128 px camera, 60 MB as float) land in the heap once glibc's adaptive mmap threshold has risen and
# fragment it: loading 100 LIBERO demos then took 3x the memory it keeps. Chunks this small are reused.
_FRAMES_PER_READ = 32


@dataclass
class Episode:
    """One demonstration or rollout of T steps.

    obs:       key -> [T+1, ...]; low-dim float32, images uint8 [T+1, C, H, W] upright,
               optionally `task_id` int64 [T+1]
    actions:   [T, A] float32 in [-1, 1]
    rewards:   [T] float32
    terminals: [T] bool, robomimic `dones` (1 at the last step / at success)
    states:    [T, D] float64 flattened MuJoCo states, when known
    """

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    states: np.ndarray | None = None
    model_file: str | None = None
    task_id: int = 0
    instruction: str | None = None
    name: str | None = None

    @property
    def num_steps(self) -> int:
        return len(self.actions)


@dataclass
class Dataset:
    path: str
    episodes: list[Episode]
    env_args: dict
    format: str  # "robomimic" | "libero"
    attrs: dict = field(default_factory=dict)  # other `data` attrs (problem_info, bddl_file_name, ...)


class DatasetError(ValueError):
    """A dataset file (or episodes to write) that cannot be used; the message says where and how to fix."""


def _where(path: str, demo: str | None = None, key: str | None = None) -> str:
    loc = f"data/{demo}" if demo else "data"
    return f"{path} [{loc}/{key}]" if key else f"{path} [{loc}]"


def demo_sort_key(name: str) -> tuple[int, str]:
    """Order demo groups numerically (demo_2 before demo_10), as robomimic does."""
    match = _DEMO_NAME.match(name)
    return (int(match.group(1)) if match else 1 << 62, name)


def _attr_value(value):
    """h5py attr -> plain Python (bytes to str, numpy scalars to Python numbers)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def read_hdf5(
    path: str | os.PathLike,
    obs_keys: Sequence[str] | None = None,
    filter_key: str | None = None,
    action_dim: int | None = None,
    task_id: int = 0,
    normalized_actions: bool = False,
    image_size: int | None = None,
) -> Dataset:
    """Read a robomimic- or LIBERO-format file (detected from its attrs) into `Episode`s.

    obs_keys:   keys to load (default: every key of the first demo). A key that some demo lacks is an error.
    filter_key: load only the demos listed under `mask/<filter_key>` (robomimic: `train`, `valid`, ...).
    action_dim: if given, every demo's actions must have this many columns.
    task_id:    task index for demos whose group carries no `task_id` attr (LIBERO: one file per task).
    normalized_actions: actions must lie in [-1, 1] (what robo_rl learns from and robosuite's controllers
                take); within ACTION_TOLERANCE outside they are clipped onto it.
    image_size: if given, images are resized to image_size x image_size as each demo is read, so a file
                is never held at its stored resolution (LIBERO's 500 128-px demos are 14.7 GB).
    NaN/Inf in actions, rewards or low-dim observations is an error.
    """
    path = os.fspath(path)
    with _open(path) as f:
        fmt, env_args, attrs = _header(f, path)
        episodes = list(_read_demos(f, path, fmt, attrs, obs_keys, filter_key, action_dim, task_id,
                                    normalized_actions, image_size))
    return Dataset(path=path, episodes=episodes, env_args=env_args, format=fmt, attrs=attrs)


def iter_hdf5(
    path: str | os.PathLike,
    obs_keys: Sequence[str] | None = None,
    filter_key: str | None = None,
    action_dim: int | None = None,
    task_id: int = 0,
    normalized_actions: bool = False,
    image_size: int | None = None,
) -> Iterator[Episode]:
    """The episodes of `read_hdf5` one at a time (the file stays open meanwhile), for files too large to
    hold whole: everything but the images is read and checked before the first episode comes (so a bad
    file fails before any of it is used, and one error lists every bad demo); a demo's images are read,
    and resized, when it is next. Arguments as for read_hdf5."""
    path = os.fspath(path)
    with _open(path) as f:
        fmt, _, attrs = _header(f, path)
        yield from _read_demos(f, path, fmt, attrs, obs_keys, filter_key, action_dim, task_id,
                               normalized_actions, image_size)


def _read_demos(f: h5py.File, path: str, fmt: str, attrs: dict, obs_keys: Sequence[str] | None,
                filter_key: str | None, action_dim: int | None, task_id: int, normalized_actions: bool,
                image_size: int | None) -> Iterator[Episode]:
    """The demos of an open file one at a time: all but their images read and checked first."""
    data = f["data"]
    demos = _demo_names(f, path, filter_key)
    if not demos:
        raise DatasetError(f"{_where(path)}: no demos to read")
    first = data[demos[0]]
    if obs_keys is None:
        if "obs" not in first:
            raise DatasetError(f"{_where(path, demos[0], 'obs')}: missing group `obs`")
        obs_keys = list(first["obs"].keys())
    instruction = json.loads(attrs["problem_info"]).get("language_instruction") if fmt == "libero" else None
    # LIBERO records the image convention it rendered with; its released files are all "opengl".
    flip = fmt == "libero" and attrs.get("macros_image_convention", "opengl") == "opengl"
    image_keys = [k for k in obs_keys if is_image_key(k)]
    low_dim = [_read_episode(data[d], path, d, [k for k in obs_keys if k not in image_keys], action_dim, task_id,
                             instruction, flip, image_size) for d in demos]
    _check_finite(path, low_dim)
    if normalized_actions:
        _check_normalized_actions(path, low_dim)
    low_dim.reverse()
    for d in demos:  # popped, so that an episode handed out is referenced by its consumer alone
        episode = low_dim.pop()
        if image_keys:
            images = _read_episode(data[d], path, d, image_keys, action_dim, task_id, instruction, flip, image_size)
            episode.obs = {k: (images.obs if k in image_keys else episode.obs)[k] for k in obs_keys}
        yield episode


def dataset_files(dataset: str | os.PathLike) -> list[Path]:
    """The HDF5 files a dataset argument names: the file itself, or every `*.hdf5` of a folder (sorted)."""
    path = Path(dataset)
    if path.is_dir():
        files = sorted(path.glob("*.hdf5"))
        if not files:
            raise DatasetError(f"{path}: folder without .hdf5 files; expected robomimic/LIBERO HDF5 files "
                               "there (or the path of one file); see datasets/registry.yaml for where to get them")
        return files
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder; expected a robomimic/LIBERO HDF5 file or a folder "
                           "of them; see datasets/registry.yaml for where to get them")
    return [path]


def demo_lengths(path: str | os.PathLike) -> list[int]:
    """Steps T of each demo of a dataset file, in the order read_hdf5 reads them, from the shape of its
    `actions` alone (no data is read): storage for a whole dataset can be allocated before reading it."""
    path = os.fspath(path)
    with _open(path) as f:
        _header(f, path)
        lengths = []
        for demo in _demo_names(f, path, None):
            if "actions" not in f["data"][demo]:
                raise DatasetError(f"{_where(path, demo, 'actions')}: missing; every demo needs actions")
            lengths.append(len(f["data"][demo]["actions"]))
    return lengths


def read_env_args(path: str | os.PathLike) -> tuple[str, dict]:
    """(format, env_args) of a dataset file from its `data` attrs alone, without reading any demo:
    format "robomimic" or "libero"; env_args as robomimic stores it (env_name, type, env_kwargs)."""
    path = os.fspath(path)
    with _open(path) as f:
        fmt, env_args, _ = _header(f, path)
    return fmt, env_args


def _open(path: str) -> h5py.File:
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such file; see datasets/registry.yaml for where to get it")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path}: cannot open as HDF5 ({e}); the file is truncated or corrupt, "
                           "download or convert it again") from e


def _header(f: h5py.File, path: str) -> tuple[str, dict, dict]:
    """(format, env_args, other `data` attrs) of an open dataset file."""
    if "data" not in f:
        raise DatasetError(f"{path}: no `data` group; this is not a robomimic/LIBERO dataset file")
    attrs = {k: _attr_value(v) for k, v in f["data"].attrs.items()}
    if "env_args" not in attrs:
        hint = ("it looks like a raw robosuite demo file: convert it with "
                "`python scripts/convert_robosuite.py input=... output=...`") if "env_info" in attrs else \
               "write it with robo_rl.data.hdf5.write_robomimic"
        raise DatasetError(f"{_where(path)}: missing attr `env_args`; {hint}")
    env_args = json.loads(attrs.pop("env_args"))
    attrs.pop("total", None)
    return "libero" if "problem_info" in attrs else "robomimic", env_args, attrs


def nonfinite_count(values: np.ndarray) -> str:
    """'' when every value is finite, else how many are not, e.g. '4 NaN' or '1 NaN, 2 Inf'."""
    if np.isfinite(values).all():
        return ""
    counts = {"NaN": int(np.isnan(values).sum()), "Inf": int(np.isinf(values).sum())}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)


def _check_finite(path: str, episodes: list[Episode]) -> None:
    """NaN/Inf in actions, rewards, MuJoCo states (episodes may start from them) or low-dim observations;
    every bad demo is listed, so one message says what to clean."""
    nonfinite = {}  # demo -> its non-finite arrays, e.g. ["actions (4 NaN)"]
    for e in episodes:
        arrays = {"actions": e.actions, "rewards": e.rewards, **({"states": e.states} if e.states is not None else {}),
                  **{f"obs/{k}": v for k, v in e.obs.items() if v.dtype.kind == "f"}}
        found = [f"{key} ({count})" for key, v in arrays.items() if (count := nonfinite_count(v))]
        if found:
            nonfinite[e.name] = found
    if nonfinite:
        listed = [f"{name} {item}" for name, items in nonfinite.items() for item in items]
        raise DatasetError(f"{path}: non-finite values in {len(nonfinite)} of {len(episodes)} demos: "
                           f"{', '.join(listed[:5])}{', ...' if len(listed) > 5 else ''}; clean or drop those demos")


def _check_normalized_actions(path: str, episodes: list[Episode]) -> None:
    """Actions more than ACTION_TOLERANCE outside [-1, 1] are an error; the others are clipped onto it."""
    peaks = {e.name: float(np.abs(e.actions).max(initial=0.0)) for e in episodes}
    outside = [name for name, peak in peaks.items() if peak > 1.0 + ACTION_TOLERANCE]
    if outside:
        worst = max(outside, key=peaks.get)
        raise DatasetError(f"{path}: actions outside [-1, 1] in {len(outside)} of {len(episodes)} demos "
                           f"(max |a| = {peaks[worst]:.4g} in {worst}); robo_rl expects normalized delta actions "
                           "in [-1, 1] (the robomimic/LIBERO convention): rescale them, or convert raw robosuite "
                           "demos with scripts/convert_robosuite.py")
    for e in episodes:
        np.clip(e.actions, -1.0, 1.0, out=e.actions)


def _demo_names(f: h5py.File, path: str, filter_key: str | None) -> list[str]:
    if filter_key is None:
        return sorted(f["data"].keys(), key=demo_sort_key)
    masks = sorted(f["mask"].keys()) if "mask" in f else []
    if filter_key not in masks:
        raise DatasetError(f"{path} [mask/{filter_key}]: no such filter key; the file has {masks or 'no masks'}. "
                           "Pick one of those or pass filter_key=None for all demos")
    names = [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in f["mask"][filter_key][()]]
    missing = [n for n in names if n not in f["data"]]
    if missing:
        raise DatasetError(f"{path} [mask/{filter_key}]: lists demos missing from `data`: {missing[:5]}")
    return sorted(names, key=demo_sort_key)


def _read_episode(group: h5py.Group, path: str, demo: str, obs_keys: Sequence[str], action_dim: int | None,
                  task_id: int, instruction: str | None, flip_images: bool, image_size: int | None) -> Episode:
    key = "actions"  # the item being read, for error messages
    try:
        for required in ("actions", "rewards", "dones", "obs"):
            if required not in group:
                raise DatasetError(f"{_where(path, demo, required)}: missing; every demo needs "
                                   "actions, rewards, dones and obs")
        actions = group["actions"][()]
        if actions.ndim != 2:
            raise DatasetError(f"{_where(path, demo, 'actions')}: expected [T, A], got shape {actions.shape}")
        T = len(actions)
        if action_dim is not None and actions.shape[1] != action_dim:
            raise DatasetError(f"{_where(path, demo, 'actions')}: action dimension {actions.shape[1]}, "
                               f"expected {action_dim}; use a dataset recorded with the same controller "
                               "or fix action_dim in the task config")
        if "num_samples" in group.attrs and int(group.attrs["num_samples"]) != T:
            raise DatasetError(f"{_where(path, demo)}: attr num_samples={int(group.attrs['num_samples'])} but "
                               f"actions has {T} rows; the file is inconsistent, convert it again")

        def column(name: str) -> np.ndarray:
            nonlocal key
            key = name
            value = group[name][()]
            if len(value) != T:
                raise DatasetError(f"{_where(path, demo, name)}: {len(value)} rows but actions has {T}")
            return value

        rewards = column("rewards").astype(np.float32).reshape(T)
        terminals = column("dones").astype(bool).reshape(T)
        states = column("states").astype(np.float64) if "states" in group else None

        has_next = "next_obs" in group
        obs = {}
        for k in obs_keys:
            key = f"obs/{k}"
            if k not in group["obs"]:
                raise DatasetError(f"{_where(path, demo, key)}: missing; this demo has obs keys "
                                   f"{sorted(group['obs'].keys())}. Drop `{k}` from the config's obs keys "
                                   "or use a dataset that records it")
            stored = group[key]
            if len(stored) != T:
                raise DatasetError(f"{_where(path, demo, key)}: {len(stored)} rows but actions has {T}")
            if has_next:
                key = f"next_obs/{k}"
                if k not in group["next_obs"]:
                    raise DatasetError(f"{_where(path, demo, key)}: missing while obs/{k} exists")
                if len(group[key]) != T:
                    raise DatasetError(f"{_where(path, demo, key)}: {len(group[key])} rows but actions has {T}")
                last = group[key][T - 1 : T]  # the only next observation not already in obs
            else:
                last = stored[T - 1 : T]  # LIBERO: repeat the final observation as the final next observation
            key = f"obs/{k}"
            if is_image_key(k):
                obs[k] = _read_images(stored, last, flip_images, image_size)
            else:
                obs[k] = _to_memory(k, np.concatenate([stored[()], last]))
    except DatasetError:
        raise
    except (OSError, KeyError, ValueError) as e:
        raise DatasetError(f"{_where(path, demo, key)}: unreadable ({e}); the file is truncated or corrupt, "
                           "download or convert it again") from e

    model_file = group.attrs.get("model_file")
    return Episode(
        obs=obs,
        actions=actions.astype(np.float32),
        rewards=rewards,
        terminals=terminals,
        states=states,
        model_file=None if model_file is None else _attr_value(model_file),
        task_id=int(group.attrs.get("task_id", task_id)),
        instruction=_attr_value(group.attrs["instruction"]) if "instruction" in group.attrs else instruction,
        name=group.name.rsplit("/", 1)[-1],
    )


def _read_images(frames: h5py.Dataset, last: np.ndarray, flip: bool, image_size: int | None) -> np.ndarray:
    """Stored frames [T, H, W, C] and the final next observation `last` [1, H, W, C] -> upright
    [T+1, C, S, S] uint8 (S: image_size, else H = W as stored), read _FRAMES_PER_READ frames at a time."""
    T, H, W, C = frames.shape
    size = (image_size, image_size) if image_size else (H, W)
    images = np.empty((T + 1, C, *size), np.uint8)
    for start in range(0, T, _FRAMES_PER_READ):
        stop = min(start + _FRAMES_PER_READ, T)
        images[start:stop] = _frames_to_memory(frames[start:stop], flip, image_size)
    images[T:] = _frames_to_memory(last, flip, image_size)
    return images


def _frames_to_memory(frames: np.ndarray, flip: bool, image_size: int | None) -> np.ndarray:
    """Frames as stored [N, H, W, C] (upside down when `flip`) -> upright [N, C, H, W] uint8, resized to
    image_size x image_size when given."""
    if flip:
        frames = frames[:, ::-1]
    images = np.ascontiguousarray(rearrange(frames, "n h w c -> n c h w")).astype(np.uint8, copy=False)
    return images if image_size is None else _resize_images(images, image_size)


def _to_memory(key: str, values: np.ndarray) -> np.ndarray:
    """Low-dim observations as stored -> in memory: float32 (`task_id`: int64)."""
    if key == TASK_KEY:
        return values.astype(np.int64)
    return values.astype(np.float32)


def _resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """[N, C, H, W] uint8 -> [N, C, size, size] uint8 by area averaging (dataset cameras at another
    resolution than the env's: LIBERO files are 128 px), so demos and env observations share one shape."""
    if images.shape[-2:] == (size, size):
        return images
    resized = F.interpolate(torch.from_numpy(images).float(), size=(size, size), mode="area")
    return resized.round_().clamp_(0, 255).to(torch.uint8).numpy()


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------
def write_robomimic(
    path: str | os.PathLike,
    episodes: Sequence[Episode],
    env_args: dict,
    valid_fraction: float = 0.1,
    attrs: dict | None = None,
) -> None:
    """Write episodes as a robomimic dataset with `mask/train` and `mask/valid` filter keys.

    Episodes keep their names when they are unique `demo_<n>` names (so filter keys of a source file
    still apply), else they become demo_0..demo_{N-1}. The file appears atomically: it is written under
    a temporary name and renamed, so a failure never leaves a partial file at `path`.
    """
    _write_file(path, episodes, env_args, attrs or {}, valid_fraction)


def write_libero(
    path: str | os.PathLike,
    episodes: Sequence[Episode],
    instruction: str,
    bddl_file_name: str,
    env_args: dict,
    attrs: dict | None = None,
) -> None:
    """Write one task's episodes as a LIBERO dataset file, laid out as LIBERO's scripts/create_dataset.py lays
    out the official ones (see the module docstring). The final observation of each episode is not kept
    (LIBERO keeps T observations; `read_hdf5` repeats the last one). Written atomically."""
    problem = {"problem_name": env_args.get("env_name"), "language_instruction": instruction}
    _write_file(path, episodes, env_args, {"problem_info": problem, "bddl_file_name": bddl_file_name,
                                           "macros_image_convention": "opengl", **(attrs or {})}, None)


def _write_file(path: str | os.PathLike, episodes: Sequence[Episode], env_args: dict, attrs: dict,
                valid_fraction: float | None) -> None:
    """Validate and write episodes as `data/demo_i` groups with `data` attrs (dicts and lists as JSON):
    robomimic layout with `mask/train` and `mask/valid` when `valid_fraction` is given, else LIBERO's. The
    file is written under a temporary name and renamed, so a failure never leaves a partial file at `path`."""
    path = os.fspath(path)
    if not episodes:
        raise DatasetError(f"{path}: no episodes to write")
    names = _output_names(episodes)
    obs_keys = sorted(episodes[0].obs.keys() - {TASK_KEY})
    for name, episode in zip(names, episodes):
        _validate_episode(path, name, episode, obs_keys)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            for name, episode in zip(names, episodes):
                _write_episode(data.create_group(name), episode, libero=valid_fraction is None)
            data.attrs["total"] = int(sum(e.num_steps for e in episodes))
            data.attrs["env_args"] = json.dumps(env_args)
            for k, v in attrs.items():
                if v is None:
                    continue
                data.attrs[k] = json.dumps(v) if isinstance(v, dict | list) else v
            if valid_fraction is not None:
                train, valid = _split_train_valid(names, valid_fraction)
                f.create_dataset("mask/train", data=np.array(train, dtype="S"))
                f.create_dataset("mask/valid", data=np.array(valid, dtype="S"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _output_names(episodes: Sequence[Episode]) -> list[str]:
    names = [e.name for e in episodes]
    if all(n is not None and _DEMO_NAME.match(n) for n in names) and len(set(names)) == len(names):
        return names
    return [f"demo_{i}" for i in range(len(episodes))]


def _validate_episode(path: str, name: str, e: Episode, obs_keys: list[str]) -> None:
    where = f"{path}: episode {name}"
    T = e.num_steps
    if e.actions.ndim != 2 or T == 0:
        raise DatasetError(f"{where} actions: expected [T>0, A], got shape {e.actions.shape}")
    if sorted(e.obs.keys() - {TASK_KEY}) != obs_keys:
        raise DatasetError(f"{where} obs: keys {sorted(e.obs)} differ from the first episode's {obs_keys}; "
                           "robomimic needs the same keys in every demo")
    for k in obs_keys:
        if is_image_key(k) and (e.obs[k].ndim != 4 or e.obs[k].dtype != np.uint8):
            raise DatasetError(f"{where} obs/{k}: images must be uint8 [T+1, C, H, W], "
                               f"got {e.obs[k].dtype} {e.obs[k].shape}")
    lengths = {"rewards": len(e.rewards), "terminals": len(e.terminals)}
    if e.states is not None:
        lengths["states"] = len(e.states)
    lengths.update({f"obs/{k}": len(v) - 1 for k, v in e.obs.items()})  # obs has one more row than actions
    for key, n in lengths.items():
        if n != T:
            raise DatasetError(f"{where} {key}: {n} steps but actions has {T} "
                               "(obs needs T+1 rows, every other array T); fix the episode before writing")


def _write_episode(group: h5py.Group, e: Episode, libero: bool) -> None:
    """robomimic: obs and next_obs, images upright, task id and instruction per demo; LIBERO: obs only (T rows),
    images upside down."""
    group.attrs["num_samples"] = e.num_steps
    if e.model_file is not None:
        group.attrs["model_file"] = e.model_file
    if not libero:  # a LIBERO file is one task: its instruction (problem_info) names it, as in LIBERO's own
        group.attrs["task_id"] = int(e.task_id)
        if e.instruction is not None:
            group.attrs["instruction"] = e.instruction
    group.create_dataset("actions", data=e.actions)
    group.create_dataset("rewards", data=e.rewards)
    group.create_dataset("dones", data=e.terminals.astype(np.int64))  # robomimic stores dones as integers
    if e.states is not None:
        group.create_dataset("states", data=e.states)
    for k, v in e.obs.items():
        if k == TASK_KEY:  # kept as the demo attr; robomimic has no modality for it
            continue
        if is_image_key(k):  # [T+1, C, H, W] upright -> [T+1, H, W, C], LIBERO's rows bottom first
            v = np.ascontiguousarray((v[:, :, ::-1] if libero else v).transpose(0, 2, 3, 1))
        group.create_dataset(f"obs/{k}", data=v[:-1])
        if not libero:
            group.create_dataset(f"next_obs/{k}", data=v[1:])


def _split_train_valid(names: list[str], valid_fraction: float) -> tuple[list[str], list[str]]:
    """Deterministic split; at least one training demo, and one validation demo when asked and possible."""
    n_valid = int(round(valid_fraction * len(names)))
    if valid_fraction > 0 and len(names) > 1:
        n_valid = max(n_valid, 1)
    n_valid = min(n_valid, len(names) - 1)
    valid_idx = set(np.random.default_rng(0).permutation(len(names))[:n_valid].tolist())
    train = [n for i, n in enumerate(names) if i not in valid_idx]
    valid = [n for i, n in enumerate(names) if i in valid_idx]
    return train, valid
