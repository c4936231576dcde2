"""The int8 variants: ONNX Runtime dynamic quantization, of the exported graphs and of the serving graphs.

Dynamic quantization stores weights as int8 and quantizes activations per
call, so it needs no calibration data; it suits a CPU, where ONNX Runtime has
int8 kernels. Not exact: a variant is judged by agreement and BLEU
(``aiayn/export/checks.py``), not by parity. Torch-free.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

# One scale per output channel rather than one per matrix: a row of small weights keeps its own resolution.
PER_CHANNEL = True
FLOAT = 1  # onnx.TensorProto.FLOAT (the serve path has no onnx package)


def quantize_int8(model: Path, op_types: Sequence[str] | None = None, pre_process: bool = False) -> bytes:
    """The graph file ``model`` (its external data, if any, beside it) with int8 weights of ``op_types`` (default:
    every op ONNX Runtime quantizes, MatMul and Gather among them), one scale per output channel.

    ``pre_process`` runs ONNX Runtime's pre-processing first (shape inference, constant folding), as its docs
    advise for the exported graphs: the quantizer only takes weights that are initializers, and there the output
    projection is the embedding's transpose, folded only then (so that variant holds the tied matrix twice, as
    int8). The serving graphs store that transpose already, and the pre-processing's shape inference stops at
    their contrib ops.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        source, prepared, target = model, Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        if pre_process:
            quant_pre_process(str(source), str(prepared))
            source = prepared
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=PER_CHANNEL,
            op_types_to_quantize=list(op_types) if op_types else None,
            extra_options={"DefaultTensorType": FLOAT},  # contrib-op outputs have no inferred type
        )
        return target.read_bytes()
