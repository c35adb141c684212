"""Known datasets (datasets/registry.yaml): where each file lives locally and where to get it.

Nothing downloads implicitly: `dataset_files` only looks on disk and, when a file is missing, says
which command or URL provides it; `download` is called on purpose (scripts/download_datasets.py).
"""
from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

REGISTRY_PATH = Path(__file__).resolve().parents[2] / "datasets" / "registry.yaml"
DEFAULT_ROOT = REGISTRY_PATH.parent


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    format: str  # robomimic | libero | robosuite_raw
    files: tuple[str, ...]  # relative to the download root
    urls: tuple[str, ...] = ()  # templates; "{name}" is a file's base name
    make: str | None = None
    horizon: int | None = None
    notes: str = ""

    def paths(self, root: str | os.PathLike = DEFAULT_ROOT) -> list[Path]:
        return [Path(root) / f for f in self.files]

    def sources(self, file: str) -> list[str]:
        return [u.format(name=Path(file).name) for u in self.urls]

    def how_to_get(self, file: str, root: str | os.PathLike) -> str:
        target = Path(root) / file
        if self.urls:
            urls = " or ".join(self.sources(file))
            return (f"run `python scripts/download_datasets.py name={self.name}`, or download {urls} "
                    f"by hand and put it at {target}")
        return f"make it with: {self.make}" if self.make else f"put it at {target}"


class DownloadError(RuntimeError):
    pass


def load_registry(path: str | os.PathLike = REGISTRY_PATH) -> dict[str, RegistryEntry]:
    with open(path) as f:
        raw = yaml.safe_load(f)
    return {
        name: RegistryEntry(name=name, format=e["format"], files=tuple(e["files"]), urls=tuple(e.get("urls") or ()),
                            make=e.get("make"), horizon=e.get("horizon"), notes=e.get("notes", ""))
        for name, e in raw.items()
    }


def lookup(name: str, registry: dict[str, RegistryEntry] | None = None) -> RegistryEntry:
    registry = registry if registry is not None else load_registry()
    if name not in registry:
        close = [n for n in registry if name.split("/")[0] in n][:8]
        raise ValueError(f"unknown dataset {name!r}; known names look like {close or sorted(registry)[:8]} "
                       "(see datasets/registry.yaml)")
    return registry[name]


def dataset_files(name: str, root: str | os.PathLike = DEFAULT_ROOT,
                  registry: dict[str, RegistryEntry] | None = None) -> list[Path]:
    """The local files of a registered dataset; FileNotFoundError (with how to get them) if any is missing."""
    entry = lookup(name, registry)
    missing = [f for f, p in zip(entry.files, entry.paths(root)) if not p.exists()]
    if missing:
        raise FileNotFoundError(f"dataset {name}: {len(missing)} of {len(entry.files)} files missing, e.g. "
                                f"{Path(root) / missing[0]}; {entry.how_to_get(missing[0], root)}")
    return entry.paths(root)


def download(name: str, root: str | os.PathLike = DEFAULT_ROOT, timeout: float = 10.0,
             registry: dict[str, RegistryEntry] | None = None) -> list[Path]:
    """Fetch the missing files of a dataset. Fails at the first unreachable file (after trying each of its
    URLs with `timeout` seconds to connect), naming where to put it by hand. Partial downloads never
    remain under the final name."""
    entry = lookup(name, registry)
    if not entry.urls:
        raise DownloadError(f"dataset {name} has no public download; {entry.how_to_get(entry.files[0], root)}")
    for file, target in zip(entry.files, entry.paths(root)):
        if target.exists():
            continue
        errors = []
        for url in entry.sources(file):
            try:
                _fetch(url, target, timeout)
                break
            except (urllib.error.URLError, OSError) as e:  # no network, DNS failure, timeout, HTTP error
                errors.append(f"{url}: {getattr(e, 'reason', e)}")
        else:
            raise DownloadError(f"could not download {file} ({'; '.join(errors)}). "
                                f"Without network, fetch it elsewhere and put it at {target}")
    return entry.paths(root)


def _fetch(url: str, target: Path, timeout: float) -> None:
    tmp = target.with_name(target.name + ".part")
    with urllib.request.urlopen(url, timeout=timeout) as response:
        target.parent.mkdir(parents=True, exist_ok=True)  # only once the server answered
        try:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(response, out, length=1 << 20)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
