"""How many rows this machine's ``MatMulNBits`` kernel must be given so that a row's result is its own.

With ``accuracy_level`` 4 ONNX Runtime quantizes each row of A to int8 on its own, so nothing but the row should
decide its result. Yet MLAS's int8 kernels take rows in tiles, two at a time on every x86 instruction set it
dispatches them to (AVX2, AVX-VNNI, AVX-512, AVX-512 VNNI), and a row left over goes through another routine that
sums in another order: on AVX-512 the odd last row, on AVX2 a lone row of 4-bit blocks (docs/speed.md, "Batch-mates
on every CPU", cites the routines). Which kernel runs depends on the CPU, and a CPU nobody here has may tile
otherwise, so the engine asks this one (``row_multiple``) by running one node: slices of 1 to ``MAX_ROWS`` rows,
each padded with copies of its first row to a multiple of 1, 2, 4, … rows, against the same rows inside a batch of
``PROBE_BATCH``. The smallest multiple under which every slice gives the very bits it gives inside the batch is the
one the engine pads every batch to.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from aiayn.core.contract import IR_VERSION, OPSET
from aiayn.engines.onnx.block_quant import BlockScheme, QuantizedMatMul, quantize_matmul

MS_DOMAIN = "com.microsoft"
MULTIPLES = (1, 2, 4, 8, 16)  # row multiples tried, smallest first; each divides MLAS's 128-row thread slices
MAX_ROWS = 16  # slices of 1 to this many rows
PROBE_BATCH = 64  # the batch each slice is compared with
PROBE_K, PROBE_N = 512, 258  # N not a multiple of 4: the kernels' leftover columns are probed too
# MLAS's x86 dispatches for MatMulNBits, widest first, each with the /proc/cpuinfo flags it needs
# (platform.cpp: AVX-512 core is AVX512F/BW/DQ/VL; AVX-512 VNNI wins over AVX-VNNI where both are present).
INSTRUCTION_SETS = (
    ("AVX-512 VNNI", ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")),
    ("AVX-512", ("avx512f", "avx512bw", "avx512dq", "avx512vl")),
    ("AVX-VNNI", ("avx2", "fma", "avx_vnni")),
    ("AVX2", ("avx2", "fma")),
)


def matmul_session(quantized: QuantizedMatMul, threads: int = 1) -> ort.InferenceSession:
    """One ``MatMulNBits`` node over ``quantized``: x (rows, K) float32 → y (rows, N)."""
    names = [f"c{i}" for i in range(len(quantized.constants()))]
    attributes: dict[str, Any] = dict(quantized.attributes)
    node = helper.make_node("MatMulNBits", ["x", *names], ["y"], domain=MS_DOMAIN, **attributes)
    graph = helper.make_graph(
        [node],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", quantized.attributes["K"]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", quantized.attributes["N"]])],
        [numpy_helper.from_array(c, n) for c, n in zip(quantized.constants(), names, strict=True)],
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = IR_VERSION
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def padded(rows: np.ndarray, multiple: int) -> np.ndarray:
    """``rows`` (m, K), then copies of its first row up to a multiple of ``multiple`` rows."""
    missing = -len(rows) % multiple
    return np.concatenate([rows, np.repeat(rows[:1], missing, axis=0)]) if missing else rows


def slice_starts(m: int) -> tuple[int, ...]:
    """Where the slices of ``m`` rows start in the probe's batch: its first row, and an odd row further on."""
    return (0, (2 * m + 1) % (PROBE_BATCH - MAX_ROWS))


@cache
def row_multiple(scheme: BlockScheme, threads: int = 1) -> int | None:
    """The fewest rows, as a multiple, that every ``MatMulNBits`` run of ``scheme`` must have so that each row's
    result is the same bits alone as among any others, on this machine; None when no multiple in ``MULTIPLES``
    makes it so. Measured once per process and scheme (20–70 ms here)."""
    rng = np.random.default_rng(0)
    session = matmul_session(quantize_matmul(rng.normal(0, 0.05, (PROBE_K, PROBE_N)).astype(np.float32), scheme))
    x = rng.normal(0, 1, (PROBE_BATCH, PROBE_K)).astype(np.float32)
    together = session.run(None, {"x": x})[0]

    def holds(multiple: int) -> bool:
        for m in range(1, MAX_ROWS + 1):
            for start in slice_starts(m):
                alone = session.run(None, {"x": padded(x[start : start + m], multiple)})[0][:m]
                if not np.array_equal(alone, together[start : start + m]):
                    return False
        return True

    return next((multiple for multiple in MULTIPLES if holds(multiple)), None)


def instruction_set(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The widest of MLAS's x86 dispatches this CPU's flags allow (Linux), else what is known of the CPU."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "an unknown instruction set (no /proc/cpuinfo)"
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
    return next((name for name, needs in INSTRUCTION_SETS if flags.issuperset(needs)), "no AVX2 (or not x86)")


def rows_for(scheme: BlockScheme | None, threads: int = 1) -> int:
    """The row multiple an engine of ``scheme`` (None: fp32 or int8, whose rows need none) pads its batches to;
    where none makes this machine's kernel give a row its own result, one line on stderr says so, and 1."""
    if scheme is None:
        return 1
    multiple = row_multiple(scheme, threads)
    if multiple is None:
        print(
            f"warning: ONNX Runtime's {scheme.bits}-bit MatMulNBits kernel on this CPU ({instruction_set()}) gives a"
            f" row results that depend on the rows beside it, whatever the padding: a sentence may translate"
            f" differently alone and batched",
            file=sys.stderr,
        )
        return 1
    return multiple
