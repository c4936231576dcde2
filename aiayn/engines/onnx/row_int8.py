"""The int8 variant's arithmetic: weights in int8 once, one scale per output column; activations in int8 per row
(one scale per token), quantized inside the serving graphs before each product (NumPy only).

A product x (rows, K) @ W (K, N) becomes Σ_k a[r, k] · b[k, n] in int32, times s_r · c_n: a row's codes and scale
come from that row alone and integer sums are exact in any order, so a sentence's result is the same bits alone as
in any batch, on every CPU whose kernel does not saturate (CTranslate2's int8 on a CPU quantizes the same way).

The activations go to ONNX Runtime as uint8 around the zero point 128 (u8·s8: the product MLAS runs on its int8
kernels, AMX, AVX-512 VNNI or AVX-VNNI; s8·s8 falls back to a portable C++ loop on x86). Without VNNI MLAS's
u8·s8 kernel adds products in pairs into int16 and saturates: there the weights keep ``NARROW_LEVELS`` a side
(``serving/int8_kernel.py`` asks the CPU), so that nothing saturates anywhere and each CPU's integers are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FULL_LEVELS = 127  # |weight code| ≤ 127, where the CPU's kernel sums u8·s8 products exactly
NARROW_LEVELS = 64  # |weight code| ≤ 64 elsewhere: two u8·s8 products, 255 · 64 · 2 = 32 640, never leave int16
ACTIVATION_LEVELS = 127  # |activation code| ≤ 127, stored as code + 128 in uint8
ACTIVATION_ZERO_POINT = 128
LOOKUP_LEVELS = 127  # an embedding row looked up is no product's operand: the whole int8 range
CHUNK_COLUMNS = 4096  # columns quantized at a time (NumPy's temporaries stay a few MiB)
SMALLEST_TOP = 1e-30  # a row's max |x| at least this: a row of zeros gets a scale, and codes 0 (128 stored)


@dataclass(frozen=True)
class Int8Columns:
    """A matrix (K, N) as int8 codes and one scale per column: value = code · scale."""

    codes: np.ndarray  # (K, N) int8
    scales: np.ndarray  # (N,) float32

    def dequantized(self) -> np.ndarray:
        """The (K, N) float32 matrix the codes stand for."""
        return self.codes.astype(np.float32) * self.scales


def quantize_columns(matrix: np.ndarray, levels: int) -> Int8Columns:
    """Each column of ``matrix`` (K, N) symmetric in int8: its largest magnitude maps to ±``levels``, codes
    rounded half to even; an all-zero column keeps scale 1 and codes 0."""
    k, n = matrix.shape
    codes = np.empty((k, n), np.int8)
    scales = np.empty(n, np.float32)
    for start in range(0, n, CHUNK_COLUMNS):
        part = np.asarray(matrix[:, start : start + CHUNK_COLUMNS], np.float32)
        top = np.abs(part).max(axis=0)
        scale = np.where(top == 0, np.float32(levels), top) / np.float32(levels)
        codes[:, start : start + CHUNK_COLUMNS] = np.clip(np.rint(part / scale), -levels, levels)
        scales[start : start + CHUNK_COLUMNS] = scale
    return Int8Columns(codes, scales)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the graphs compute for activations ``x`` (rows, K): uint8 codes round(x / s) + 128 and scales
    s = max|x| / 127 per row (rows, 1) (a row of zeros: codes 128). The tests' reference."""
    top = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(SMALLEST_TOP))
    scales = (top / np.float32(ACTIVATION_LEVELS)).astype(np.float32)
    codes = np.clip(np.rint(x / scales) + ACTIVATION_ZERO_POINT, 0, 255).astype(np.uint8)
    return codes, scales
