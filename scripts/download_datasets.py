"""Download a registered dataset: `python scripts/download_datasets.py name=robomimic/lift/ph/low_dim`.

`name=list` prints every registered name. Without network it fails within `timeout` seconds and says
where to put the file by hand.
"""
import sys

from omegaconf import DictConfig

from robo_rl.utils.cli import command
from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads (the config check imports it): OpenMP reads its spin setting once


@command("download_datasets")
def main(cfg: DictConfig) -> None:
    from robo_rl.data.registry import DEFAULT_ROOT, DownloadError, download, load_registry

    registry = load_registry()
    if cfg.name == "list":
        for name, entry in registry.items():
            print(f"{name:<40} {entry.format:<14} {len(entry.files):>3} file(s){'' if entry.urls else '  (make)'}")
        return
    try:
        paths = download(cfg.name, cfg.root or DEFAULT_ROOT, cfg.timeout, registry)
    except (DownloadError, ValueError) as e:
        sys.exit(f"error: {e}")
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
