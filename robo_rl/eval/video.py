"""MP4 export of evaluation episodes, frames annotated with the step and success."""
from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import numpy as np
from PIL import Image, ImageDraw


def annotate(frame: np.ndarray, text: str, success: bool) -> np.ndarray:
    """Frame [H, W, 3] uint8 with `text` in the top-left corner (green once the task succeeded)."""
    image = Image.fromarray(frame)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, image.width, 12), fill=(0, 0, 0))
    draw.text((2, 0), text, fill=(80, 255, 80) if success else (255, 255, 255))
    return np.asarray(image)


def write_mp4(path: str | Path, frames: list[np.ndarray], fps: int = 20) -> Path:
    """Write frames [H, W, 3] uint8 as H.264 mp4 (imageio-ffmpeg ships its own ffmpeg)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The format is named: without imageio-ffmpeg, imageio would pick another writer by itself (TIFF) and fail
    # on the video arguments; named, the error says which package is missing.
    with imageio.get_writer(path, format="FFMPEG", fps=fps, codec="libx264", quality=7, macro_block_size=1) as writer:
        for frame in frames:
            writer.append_data(frame)
    return path
