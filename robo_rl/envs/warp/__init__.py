"""GPU-batched robosuite tasks on MuJoCo Warp (`env.backend=warp`); the same interface as `envs.vector.VecEnv`."""
from robo_rl.utils.rendering import configure_mujoco

configure_mujoco()  # mujoco picks its OpenGL backend when first imported; videos use mujoco.Renderer

from robo_rl.envs.warp.env import WarpVecEnv  # noqa: E402

__all__ = ["WarpVecEnv"]
