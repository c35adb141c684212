"""Which float precision the matmuls of a device run fastest in, for the learner's update and the search."""
from __future__ import annotations

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def auto_bf16(device: torch.device) -> bool:
    """What precision "auto" picks: bf16 on a CPU that runs bfloat16 matmuls natively (AMX tiles or AVX512-BF16
    dot products: a 1024x512x512 matmul ran 2.7x faster in bf16 than fp32 on a Zen 4 core, 6.7x on an AMX one),
    where the work is bound by GEMM arithmetic. Without either, oneDNN emulates bf16, slower than fp32. On CUDA
    fp32: at these nets' sizes a GPU is bound by kernel launches and autocast's casts only add kernels (one H200,
    16 envs, benchmarks/qwm_search.py: 14.8 ms in bf16, 9.6 ms in fp32)."""
    if device.type != "cpu":
        return False
    # private in torch 2.x; absent: assume the instructions are not there
    checks = (getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    return any(check is not None and check() for check in checks)


def uses_bf16(precision: str, device: torch.device) -> bool:
    """Whether a `precision` setting ("auto", "fp32" or "bf16") runs under bf16 autocast on `device`."""
    return precision == "bf16" or (precision == "auto" and auto_bf16(device))
