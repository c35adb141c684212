"""Observation encoder: a dict of low-dim vectors, camera images and a task id -> one latent z.

Every learner (policy, critic, world model) acts on z, so this is the only module that knows
observation keys. Low-dim keys are normalised with fixed statistics (buffers, saved in
checkpoints), each camera goes through a small CNN (random-shift augmented while training), the task
(`task_id`) is embedded, and an MLP fuses the parts into z with SimNorm (TD-MPC2).

A task is embedded one of two ways (`EncoderConfig.task`): `index`, a learned vector per task id, or
`language`, a learned projection of a fixed embedding of the task's instruction. The instruction
embeddings come in as a table [num_tasks, D] (a buffer, so checkpoints carry it); this module never
sees text or a text model (robo_rl/data/language.py makes the table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from robo_rl.core import TASK_KEY, Obs, is_image_key
from robo_rl.nets.mlp import SimNorm, mlp

# Floor for normalisation std: near-constant features (e.g. a quaternion component that hardly
# moves in the demos) would otherwise be blown up to huge values by small online deviations.
MIN_STD = 1e-2

# Smallest side the 4-layer CNN below accepts (kernels 7, 5, 3, 3; strides 2, 2, 2, 1).
MIN_IMAGE_SIZE = 39


@dataclass
class EncoderConfig:
    latent_dim: int = 256  # size of z
    hidden_dims: tuple[int, ...] = (256,)  # fusion MLP
    simnorm_dim: int = 8  # SimNorm group size on z; 0 leaves z unnormalised
    cnn_channels: int = 32  # channels of each of the 4 conv layers
    image_feature_dim: int = 64  # per-camera feature after the CNN
    share_cnn: bool = False  # one CNN for all cameras instead of one each
    random_shift_pad: int = 4  # DrQ random-shift augmentation in pixels (training only); 0 disables
    task_embed_dim: int = 32  # task embedding size, used when num_tasks > 1
    task: Literal["index", "language"] = "index"  # a learned vector per task id | projected instruction embedding
    language_dim: int = 384  # D of the instruction embedding table (all-MiniLM-L6-v2: 384)


class ImageEncoder(nn.Module):
    """uint8 [N, C, H, W] -> [N, F]: 4 conv layers (TD-MPC2's stack), then Linear -> LayerNorm -> Tanh."""

    def __init__(self, image_shape: tuple[int, int, int], channels: int, feature_dim: int):
        super().__init__()
        if min(image_shape[1:]) < MIN_IMAGE_SIZE:
            raise ValueError(
                f"image shape {image_shape} is too small for the CNN; height and width must be >= {MIN_IMAGE_SIZE}"
            )
        c = channels
        self.convs = nn.Sequential(
            nn.Conv2d(image_shape[0], c, 7, stride=2), nn.ReLU(),
            nn.Conv2d(c, c, 5, stride=2), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride=2), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        conv_dim = self.convs(torch.zeros(1, *image_shape)).shape[-1]
        self.head = nn.Sequential(nn.Linear(conv_dim, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(image))


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ augmentation: pad by edge replication, crop back at an integer offset drawn per image.

    images: float [N, C, H, W] -> [N, C, H, W]; offsets uniform in [0, 2 * pad] on each axis.
    """
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2, 1), device=images.device)
    rows = torch.arange(h, device=images.device) + offsets[:, 0]  # [N, H]
    cols = torch.arange(w, device=images.device) + offsets[:, 1]  # [N, W]
    batch = torch.arange(n, device=images.device)[:, None, None]
    # Advanced indices around a slice put their broadcast dims first: [N, H, W, C].
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


class InstructionEmbedding(nn.Module):
    """task id [N] -> a learned projection of its instruction's fixed embedding [N, E].

    `table` [num_tasks, D] is a buffer (in every state_dict, never trained), NaN until `set_table`: an
    encoder used before its instructions are known gives NaN latents, not a silently task-blind z.
    """

    def __init__(self, num_tasks: int, language_dim: int, embed_dim: int):
        super().__init__()
        self.register_buffer("table", torch.full((num_tasks, language_dim), float("nan")))
        self.projection = nn.Linear(language_dim, embed_dim)

    @torch.no_grad()
    def set_table(self, table: torch.Tensor) -> None:
        """table [num_tasks, D]: row t embeds the instruction of task t."""
        if tuple(table.shape) != tuple(self.table.shape):
            raise ValueError(f"instruction embeddings of shape {tuple(table.shape)}; this encoder embeds "
                             f"{self.table.shape[0]} tasks with D={self.table.shape[1]} (agent.encoder.language_dim)")
        self.table.copy_(table)

    def forward(self, task_id: torch.Tensor) -> torch.Tensor:
        return self.projection(self.table[task_id])


class ObsEncoder(nn.Module):
    """obs dict -> z [..., latent_dim]; any leading dims ([B], [T, B], ...) are kept.

    obs_shapes:    key -> shape of one observation: low-dim (D,), image (C, H, W) for keys ending in
                   `_image`/`_rgb` (uint8), `task_id` () (int64, used when num_tasks > 1).
    normalization: optional key -> (mean, std) for low-dim keys; see `set_normalization`.
    """

    def __init__(
        self,
        obs_shapes: dict[str, tuple[int, ...]],
        num_tasks: int = 1,
        config: EncoderConfig | None = None,
        normalization: dict[str, tuple] | None = None,
    ):
        super().__init__()
        self.config = config = config or EncoderConfig()
        self.obs_shapes = {k: tuple(s) for k, s in obs_shapes.items()}
        self.image_keys = sorted(k for k in obs_shapes if is_image_key(k))
        self.low_dim_keys = sorted(k for k in obs_shapes if k != TASK_KEY and not is_image_key(k))
        for key in self.low_dim_keys:
            if len(self.obs_shapes[key]) != 1:
                raise ValueError(f"low-dim obs {key!r} has shape {self.obs_shapes[key]}; flatten it to (D,)")
        for key in self.image_keys:
            if len(self.obs_shapes[key]) != 3:
                raise ValueError(f"image obs {key!r} has shape {self.obs_shapes[key]}; expected (C, H, W)")
        if not self.low_dim_keys and not self.image_keys:
            raise ValueError(f"obs_shapes {obs_shapes} has no low-dim or image key to encode")
        self.num_tasks = num_tasks
        self.uses_task = num_tasks > 1 and config.task_embed_dim > 0
        if self.uses_task and TASK_KEY not in obs_shapes:
            raise ValueError(f"num_tasks={num_tasks} but obs_shapes has no {TASK_KEY!r} key")

        low_dim = sum(self.obs_shapes[k][0] for k in self.low_dim_keys)
        self.register_buffer("low_dim_mean", torch.zeros(low_dim))
        self.register_buffer("low_dim_std", torch.ones(low_dim))
        if normalization:
            self.set_normalization(normalization)

        self.cnns = nn.ModuleDict()
        if self.image_keys:
            shapes = {self.obs_shapes[k] for k in self.image_keys}
            if config.share_cnn and len(shapes) > 1:
                raise ValueError(f"share_cnn needs equal image shapes; got {shapes}")
            cnn_keys = self.image_keys[:1] if config.share_cnn else self.image_keys
            for key in cnn_keys:
                self.cnns[key] = ImageEncoder(self.obs_shapes[key], config.cnn_channels, config.image_feature_dim)
        self.task_embedding = None
        if self.uses_task and config.task == "language":
            self.task_embedding = InstructionEmbedding(num_tasks, config.language_dim, config.task_embed_dim)
        elif self.uses_task:
            self.task_embedding = nn.Embedding(num_tasks, config.task_embed_dim, max_norm=1.0)

        fused_dim = low_dim + len(self.image_keys) * config.image_feature_dim
        fused_dim += config.task_embed_dim if self.uses_task else 0
        if config.simnorm_dim and config.latent_dim % config.simnorm_dim:
            raise ValueError(f"latent_dim {config.latent_dim} is not a multiple of simnorm_dim {config.simnorm_dim}")
        self.fuse = mlp(
            fused_dim,
            config.hidden_dims,
            config.latent_dim,
            out_layer=SimNorm(config.simnorm_dim) if config.simnorm_dim else None,
        )

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    def set_instruction_embeddings(self, table: torch.Tensor) -> None:
        """The fixed instruction embeddings [num_tasks, D] of a `task=language` encoder (row t: task t)."""
        if not isinstance(self.task_embedding, InstructionEmbedding):
            raise ValueError(f"this encoder embeds tasks by {self.config.task} over {self.num_tasks} task(s); "
                             "instruction embeddings need task=language and num_tasks > 1")
        self.task_embedding.set_table(table)

    @torch.no_grad()
    def set_normalization(self, stats: dict[str, tuple]) -> None:
        """Normalise low-dim key k as (x - mean) / max(std, MIN_STD); stats: k -> (mean [D], std [D])."""
        offset = 0
        for key in self.low_dim_keys:
            dim = self.obs_shapes[key][0]
            if key in stats:
                mean, std = (torch.as_tensor(v, dtype=torch.float32).reshape(-1) for v in stats[key])
                if mean.numel() != dim or std.numel() != dim:
                    raise ValueError(
                        f"normalization for {key!r}: mean {mean.numel()} / std {std.numel()} values, expected {dim}"
                    )
                self.low_dim_mean[offset : offset + dim] = mean
                self.low_dim_std[offset : offset + dim] = std.clamp_min(MIN_STD)
            offset += dim
        unknown = set(stats) - set(self.low_dim_keys)
        if unknown:
            raise ValueError(f"normalization for unknown low-dim keys {sorted(unknown)}; known: {self.low_dim_keys}")

    def forward(self, obs: Obs) -> torch.Tensor:
        missing = [k for k in (*self.low_dim_keys, *self.image_keys) if k not in obs]
        if self.uses_task and TASK_KEY not in obs:
            missing.append(TASK_KEY)
        if missing:
            raise KeyError(f"obs is missing keys {missing}; it has {sorted(obs)}")
        first = (self.low_dim_keys or self.image_keys)[0]
        lead = obs[first].shape[: obs[first].dim() - len(self.obs_shapes[first])]  # e.g. [B] or [T, B]

        parts = []
        if self.low_dim_keys:
            low_dim = torch.cat([obs[k].reshape(-1, self.obs_shapes[k][0]) for k in self.low_dim_keys], -1)
            parts.append((low_dim - self.low_dim_mean) / self.low_dim_std)
        for key in self.image_keys:
            image = obs[key].reshape(-1, *self.obs_shapes[key]).float().div(255.0).sub(0.5)
            if self.training and self.config.random_shift_pad > 0:
                image = random_shift(image, self.config.random_shift_pad)
            parts.append(self.cnns[self.image_keys[0] if self.config.share_cnn else key](image))
        if self.uses_task:
            parts.append(self.task_embedding(obs[TASK_KEY].reshape(-1).long()))
        z = self.fuse(torch.cat(parts, -1))
        return z.reshape(*lead, self.config.latent_dim)
