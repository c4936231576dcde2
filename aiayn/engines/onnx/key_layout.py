"""Where a cached key's position lies in the self-attention cache, per device: the one place that knows.

DecoderMaskedMultiHeadAttention's CUDA kernel keeps each layer's keys as (rows, heads, d_head / x, capacity, x),
x = 16 bytes / element size (4 in fp32, 8 in fp16): a thread reads 16 bytes of one position at a time
(``decoder_masked_multihead_attention_impl.cu``; ``past_key`` in ONNX Runtime's ContribOperators.md). Its values,
and every key on the CPU, are plain (rows, heads, capacity, d_head). The engine's cache tensor is
(2 · layers, rows, heads, capacity, d_head) either way (keys at 2i, values at 2i + 1): the same bytes, read in the
kernel's order. Code that moves positions (growing the cache, giving a row another row's history) goes through
``plain`` and ``in_kernel_layout``; moving whole rows (a Gather along the rows axis) needs neither.
"""

from __future__ import annotations

import numpy as np

CHUNK_BYTES = 16  # what one CUDA thread reads of a key at a time


def key_chunk(device: str, dtype: np.dtype, d_head: int) -> int:
    """x: a key's values per chunk in the device's kernel; ``d_head`` (one chunk: the plain layout) on the CPU."""
    return CHUNK_BYTES // dtype.itemsize if device == "cuda" else d_head


def plain(cache: np.ndarray, x: int) -> np.ndarray:
    """The cache (2 · layers, rows, heads, capacity, d_head) in the kernel's layout → every position plain."""
    kv, rows, heads, capacity, d_head = cache.shape
    out = cache.copy()
    keys = cache[0::2].reshape(kv // 2, rows, heads, d_head // x, capacity, x)
    out[0::2] = keys.transpose(0, 1, 2, 4, 3, 5).reshape(kv // 2, rows, heads, capacity, d_head)
    return out


def in_kernel_layout(cache: np.ndarray, x: int) -> np.ndarray:
    """``plain``'s inverse: a plain cache → the kernel's layout, as a new array."""
    kv, rows, heads, capacity, d_head = cache.shape
    out = cache.copy()
    keys = cache[0::2].reshape(kv // 2, rows, heads, capacity, d_head // x, x)
    out[0::2] = keys.transpose(0, 1, 2, 4, 3, 5).reshape(kv // 2, rows, heads, capacity, d_head)
    return out
