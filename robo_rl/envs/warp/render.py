"""Camera images of the batched worlds.

- `BatchCameraRenderer`: MuJoCo Warp's ray tracer renders every world in one launch, for image
  observations ([B, 3, H, W] uint8, upright like robomimic's).
- `FrameRenderer`: MuJoCo's OpenGL renderer on one world's state copied to the CPU, for videos
  (the same pictures robosuite's offscreen renderer makes).
Both show what robosuite's offscreen renderer shows: visual geoms (groups 1-2), no collision geoms,
no sites.
"""
from __future__ import annotations

import mujoco
import mujoco_warp as mjw
import numpy as np
import torch
import warp as wp

VISUAL_GEOM_GROUPS = (1, 2)  # robosuite hides group 0 (collision meshes) in its offscreen renders


def camera_id(mjm: mujoco.MjModel, camera: str) -> int:
    cam = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if cam < 0:
        names = [mujoco.mj_id2name(mjm, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(mjm.ncam)]
        raise ValueError(f"unknown camera {camera!r}; the scene has {names}")
    return cam


@wp.kernel
def _unpack_rgb(packed: wp.array2d[wp.uint32], adr: int, width: int, out: wp.array4d[wp.uint8]):
    """Packed 0x00RRGGBB pixels [B, adr + y * W + x] (row 0 at the top) -> out [B, 3, H, W]."""
    world, pixel = wp.tid()
    value = packed[world, adr + pixel]
    y = pixel // width
    x = pixel - y * width
    out[world, 0, y, x] = wp.uint8((value >> wp.uint32(16)) & wp.uint32(0xFF))
    out[world, 1, y, x] = wp.uint8((value >> wp.uint32(8)) & wp.uint32(0xFF))
    out[world, 2, y, x] = wp.uint8(value & wp.uint32(0xFF))


class BatchCameraRenderer:
    """Ray-traced RGB images of `cameras` for all worlds of a MuJoCo Warp data."""

    def __init__(self, mjm: mujoco.MjModel, nworld: int, cameras: tuple[str, ...], size: int):
        ids = [camera_id(mjm, c) for c in cameras]
        self.size, self.nworld = size, nworld
        self.context = mjw.create_render_context(
            mjm,
            nworld=nworld,
            cam_res=(size, size),
            render_rgb=True,
            render_depth=False,
            render_seg=False,
            enabled_geom_groups=list(VISUAL_GEOM_GROUPS),
            cam_active=[i in ids for i in range(mjm.ncam)],
        )
        # The context lists active cameras in model order; find each requested camera's pixel block.
        rgb_adr = self.context.rgb_adr.numpy()
        self.adr = {name: int(rgb_adr[sorted(ids).index(cam)]) for name, cam in zip(cameras, ids)}

    def render(self, m: mjw.Model, d: mjw.Data, device: torch.device) -> dict[str, torch.Tensor]:
        """camera -> [B, 3, H, W] uint8 (upright), written by Warp straight into the torch tensors."""
        mjw.refit_bvh(m, d, self.context)
        mjw.render(m, d, self.context)
        images = {}
        for name, adr in self.adr.items():
            out = torch.empty((self.nworld, 3, self.size, self.size), dtype=torch.uint8, device=device)
            wp.launch(
                _unpack_rgb,
                dim=(self.nworld, self.size * self.size),
                inputs=[self.context.rgb_data, adr, self.size],
                outputs=[wp.from_torch(out)],
            )
            images[name] = out
        return images


class FrameRenderer:
    """MuJoCo's standard renderer on single world states (videos, and the reference in tests)."""

    def __init__(self, mjm: mujoco.MjModel):
        self.mjm = mjm
        self.data = mujoco.MjData(mjm)
        self.option = mujoco.MjvOption()
        self.option.geomgroup[:] = 0
        self.option.geomgroup[list(VISUAL_GEOM_GROUPS)] = 1
        self.option.sitegroup[:] = 0
        self._renderers: dict[int, mujoco.Renderer] = {}

    def render(self, qpos: np.ndarray, camera: str, size: int) -> np.ndarray:
        """qpos [nq] -> upright RGB frame [size, size, 3] uint8."""
        if size not in self._renderers:
            if size > min(self.mjm.vis.global_.offwidth, self.mjm.vis.global_.offheight):
                raise ValueError(f"render size {size} exceeds the scene's offscreen buffer "
                                 f"({self.mjm.vis.global_.offwidth}x{self.mjm.vis.global_.offheight})")
            self._renderers[size] = mujoco.Renderer(self.mjm, size, size)
        self.data.qpos[:] = qpos
        mujoco.mj_kinematics(self.mjm, self.data)
        mujoco.mj_camlight(self.mjm, self.data)
        renderer = self._renderers[size]
        renderer.update_scene(self.data, camera=camera_id(self.mjm, camera), scene_option=self.option)
        return renderer.render()

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()
