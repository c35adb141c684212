"""Process-wide MuJoCo setup: headless OpenGL selection, and where MuJoCo's warnings go."""
from __future__ import annotations

import ctypes.util
import os
import sys


def configure_mujoco() -> str:
    """Set up MuJoCo for this process; call it before mujoco/robosuite are first imported. Returns the
    OpenGL backend.

    `MUJOCO_GL`: the user's choice if set, else `egl`, else `osmesa` when EGL is absent; PyOpenGL must
    agree with MuJoCo on the platform, so `PYOPENGL_PLATFORM` follows. MuJoCo's warnings (an unstable
    simulation, a full contact buffer) go to stderr only: by default MuJoCo also appends them to
    MUJOCO_LOG.TXT in the working directory, littering wherever a command was started.
    """
    if "MUJOCO_GL" not in os.environ:
        has_egl = ctypes.util.find_library("EGL") is not None
        has_osmesa = ctypes.util.find_library("OSMesa") is not None
        os.environ["MUJOCO_GL"] = "egl" if has_egl or not has_osmesa else "osmesa"
    backend = os.environ["MUJOCO_GL"]
    if backend in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    import mujoco

    mujoco.set_mju_user_warning(_print_warning)
    return backend


def _print_warning(message: str) -> None:
    print(f"[mujoco] WARNING: {message}", file=sys.stderr, flush=True)
