"""Weight-only block quantization for ONNX Runtime's ``com.microsoft`` ``MatMulNBits`` and
``GatherBlockQuantized`` (NumPy only: the CPU serving graphs and the browser folder both build from it).

A weight is cut along its input dimension into blocks of ``block_size`` values; each block keeps one fp32
scale (and, asymmetric, one zero point) and its values as ``bits``-bit codes, dequantized as
(code - zero point) · scale. Codes are packed low bits first, two 4-bit codes to a byte; with no zero points
ONNX Runtime takes 2^(bits-1), which is how the symmetric codes are stored (offset by it).

Each weight-only variant's scheme is a row of the table of weights (``aiayn.engines.WEIGHTS``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK_ROWS = 4096  # rows quantized at a time


@dataclass(frozen=True)
class BlockScheme:
    """How one variant quantizes: code width, block length along the input dimension, zero points or not, and
    ``MatMulNBits``'s ``accuracy_level`` (4: the activations are quantized to int8 per row and block inside the
    op, so a row's result depends on no other row once the kernel's row tiles are whole, ``kernel_rows.py``; 0:
    they stay fp32 and the weight is dequantized)."""

    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: int

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"block quantization takes 4 or 8 bits, not {self.bits}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"the block size must be a power of two ≥ 16, not {self.block_size}")


@dataclass(frozen=True)
class QuantizedMatMul:
    """The inputs after A of one ``MatMulNBits`` node (B, scales, zero points if asymmetric) and its attributes."""

    packed: np.ndarray  # B: (N, n_blocks, block_size · bits / 8) uint8
    scales: np.ndarray  # (N, n_blocks) float32
    zero_points: np.ndarray | None  # (N, ceil(n_blocks · bits / 8)) uint8, packed like B; None when symmetric
    attributes: dict[str, int]  # K, N, bits, block_size, accuracy_level

    def constants(self) -> list[np.ndarray]:
        """B, scales and (asymmetric) zero points, in the node's input order after A."""
        return [self.packed, self.scales] + ([] if self.zero_points is None else [self.zero_points])


@dataclass(frozen=True)
class QuantizedGather:
    """The inputs of one ``GatherBlockQuantized`` node but its indices (data, scales, zero points if asymmetric)
    and its attributes: rows are gathered (axis 0), each row quantized in blocks along its length (axis 1)."""

    data: np.ndarray  # (rows, columns · bits / 8) uint8
    scales: np.ndarray  # (rows, n_blocks) float32
    zero_points: np.ndarray | None  # (rows, ceil(n_blocks · bits / 8)) uint8; None when symmetric
    attributes: dict[str, int]  # gather_axis, quantize_axis, bits, block_size

    def constants(self) -> list[np.ndarray]:
        """data, scales and (asymmetric) zero points: the node's inputs are data, indices, scales, zero points."""
        return [self.data, self.scales] + ([] if self.zero_points is None else [self.zero_points])


def quantize_blocks(rows: np.ndarray, scheme: BlockScheme) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each row of ``rows`` (R, C) in blocks of ``scheme.block_size`` along C → unsigned codes (R, n_blocks ·
    block_size) uint8 (C zero-padded to whole blocks), scales (R, n_blocks) float32 and zero points
    (R, n_blocks) uint8, or None when symmetric (the codes then sit around 2^(bits-1)).

    ``CHUNK_ROWS`` rows at a time: NumPy's temporaries stay a few MiB, not several copies of a whole embedding."""
    n_rows, n_cols = rows.shape
    n_blocks = -(-n_cols // scheme.block_size)
    codes = np.empty((n_rows, n_blocks * scheme.block_size), np.uint8)
    scales = np.empty((n_rows, n_blocks), np.float32)
    zero_points = None if scheme.symmetric else np.empty((n_rows, n_blocks), np.uint8)
    for start in range(0, n_rows, CHUNK_ROWS):
        chunk = slice(start, start + CHUNK_ROWS)
        blocks = np.zeros((len(rows[chunk]), n_blocks * scheme.block_size), np.float32)
        blocks[:, :n_cols] = rows[chunk]
        chunk_codes, scales[chunk], chunk_zero_points = quantize_chunk(
            blocks.reshape(len(blocks), n_blocks, -1), scheme
        )
        codes[chunk] = chunk_codes.reshape(len(blocks), -1)
        if zero_points is not None:
            zero_points[chunk] = chunk_zero_points
    return codes, scales, zero_points


def quantize_chunk(blocks: np.ndarray, scheme: BlockScheme) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (rows, n_blocks, block_size) float32 → codes uint8 of the same shape, scales and zero points
    (rows, n_blocks) (the zero points all 2^(bits-1) when symmetric)."""
    top = (1 << scheme.bits) - 1
    half = 1 << (scheme.bits - 1)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    if scheme.symmetric:
        # The value of largest magnitude maps to -2^(bits-1): one more level than ±(2^(bits-1) - 1) would give.
        scales = np.where(-low > high, low, high) / np.float32(-half)
        zero_points = np.full(scales.shape, half, np.float32)
    else:  # the range always holds 0, so that zero weights (and padding) come back exactly
        low, high = np.minimum(low, 0), np.maximum(high, 0)
        scales = (high - low) / np.float32(top)
        zero_points = np.clip(np.rint(-low / np.where(scales == 0, 1, scales)), 0, top)
    safe = np.where(scales == 0, 1, scales)[..., None]
    codes = np.clip(np.rint(blocks / safe) + zero_points[..., None], 0, top)
    return codes.astype(np.uint8), scales.astype(np.float32), zero_points.astype(np.uint8)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (R, C) < 2^bits as uint8 → (R, ceil(C · bits / 8)), low bits first: 4-bit pairs share a byte."""
    if bits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    if codes.shape[1] % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)))
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int, n_codes: int) -> np.ndarray:
    """``pack``'s inverse: (R, bytes) uint8 → the first ``n_codes`` codes of each row, (R, n_codes) uint8."""
    if bits == 8:
        return packed[:, :n_codes]
    return np.stack((packed & 0x0F, packed >> 4), axis=-1).reshape(packed.shape[0], -1)[:, :n_codes]


def quantize_matmul(weight: np.ndarray, scheme: BlockScheme) -> QuantizedMatMul:
    """The right-hand side of x (…, K) @ ``weight`` (K, N) as ``MatMulNBits`` stores it: transposed, one row
    per output, in blocks along K."""
    k, n = weight.shape
    codes, scales, zero_points = quantize_blocks(np.asarray(weight, np.float32).T, scheme)
    n_blocks = scales.shape[1]
    return QuantizedMatMul(
        packed=pack(codes, scheme.bits).reshape(n, n_blocks, scheme.block_size * scheme.bits // 8),
        scales=scales,
        zero_points=None if zero_points is None else pack(zero_points, scheme.bits),
        attributes={
            "K": k,
            "N": n,
            "bits": scheme.bits,
            "block_size": scheme.block_size,
            "accuracy_level": scheme.accuracy_level,
        },
    )


def quantize_gather(table: np.ndarray, scheme: BlockScheme) -> QuantizedGather:
    """A lookup table (rows, columns), e.g. an embedding, as ``GatherBlockQuantized`` reads it; columns must be a
    whole number of blocks (the op has no padding)."""
    n_rows, n_cols = table.shape
    if n_cols % scheme.block_size:
        raise ValueError(f"a table of {n_cols} columns is no whole number of {scheme.block_size}-value blocks")
    codes, scales, zero_points = quantize_blocks(np.asarray(table, np.float32), scheme)
    return QuantizedGather(
        data=pack(codes, scheme.bits),
        scales=scales,
        zero_points=None if zero_points is None else pack(zero_points, scheme.bits),
        attributes={"gather_axis": 0, "quantize_axis": 1, "bits": scheme.bits, "block_size": scheme.block_size},
    )


def dequantize(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int) -> np.ndarray:
    """Unpacked codes (R, n_blocks · block_size), scales (R, n_blocks), unpacked zero points (R, n_blocks) or
    None (2^(bits-1)) → the fp32 values (R, n_blocks · block_size) that ONNX Runtime computes with."""
    n_rows, n_blocks = scales.shape
    offset = np.float32(1 << (bits - 1)) if zero_points is None else zero_points.astype(np.float32)[..., None]
    blocks = codes.reshape(n_rows, n_blocks, -1).astype(np.float32)
    return ((blocks - offset) * scales[..., None]).reshape(n_rows, -1)


def dequantize_matmul(quantized: QuantizedMatMul) -> np.ndarray:
    """The (K, N) weight that ``quantized`` stands for."""
    attrs = quantized.attributes
    n, k, bits, size = attrs["N"], attrs["K"], attrs["bits"], attrs["block_size"]
    n_blocks = quantized.scales.shape[1]
    codes = unpack(quantized.packed.reshape(n, -1), bits, n_blocks * size)
    zero_points = None if quantized.zero_points is None else unpack(quantized.zero_points, bits, n_blocks)
    return dequantize(codes, quantized.scales, zero_points, bits)[:, :k].T


def dequantize_gather(quantized: QuantizedGather) -> np.ndarray:
    """The (rows, columns) table that ``quantized`` stands for."""
    bits = quantized.attributes["bits"]
    n_blocks = quantized.scales.shape[1]
    codes = unpack(quantized.data, bits, n_blocks * quantized.attributes["block_size"])
    zero_points = None if quantized.zero_points is None else unpack(quantized.zero_points, bits, n_blocks)
    return dequantize(codes, quantized.scales, zero_points, bits)
