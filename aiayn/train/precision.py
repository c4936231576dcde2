"""`--precision`: fp32, or bf16 autocast where the hardware computes bf16 natively.

``auto`` keeps what training always did: bf16 autocast on a GPU that supports it, fp32 everywhere else
(on CPUs bf16 autocast did not train faster here, see the README). ``bf16`` asks for it explicitly and is
refused where the hardware would only emulate it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def bf16_native(device: torch.device) -> bool:
    """bf16 arithmetic in hardware: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_precision(asked: str, device: torch.device) -> str:
    """``auto``/``fp32``/``bf16`` on ``device`` → ``fp32`` or ``bf16``, or a clear refusal."""
    if asked not in PRECISIONS:
        raise ValueError(f"unknown precision {asked!r}; choose one of {', '.join(PRECISIONS)}")
    if asked == "auto":
        return "bf16" if device.type == "cuda" and bf16_native(device) else "fp32"
    if asked == "bf16" and not bf16_native(device):
        what = "this GPU" if device.type == "cuda" else f"this {device.type.upper()} (no AVX512-BF16 or AMX)"
        raise ValueError(f"--precision bf16: {what} has no native bf16 arithmetic; use --precision fp32")
    return asked


def autocast(precision: str, device: torch.device) -> AbstractContextManager[Any]:
    """The forward's context: bf16 autocast, or nothing (fp32)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
