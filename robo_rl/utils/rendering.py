"""Headless OpenGL selection for MuJoCo. Must run before mujoco/robosuite are imported."""
from __future__ import annotations

import ctypes.util
import os


def configure_mujoco_gl() -> str:
    """Pick `MUJOCO_GL`: the user's choice if set, else `egl`, else `osmesa` when EGL is absent.

    PyOpenGL must agree with MuJoCo on the platform, so `PYOPENGL_PLATFORM` follows.
    """
    if "MUJOCO_GL" not in os.environ:
        has_egl = ctypes.util.find_library("EGL") is not None
        has_osmesa = ctypes.util.find_library("OSMesa") is not None
        os.environ["MUJOCO_GL"] = "egl" if has_egl or not has_osmesa else "osmesa"
    backend = os.environ["MUJOCO_GL"]
    if backend in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend
