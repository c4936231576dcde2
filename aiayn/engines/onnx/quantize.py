"""The exported int8 graphs (`aiayn export --variant int8`): ONNX Runtime's dynamic quantization of the contract's
graphs, for other runtimes (the CPU serving engine builds its own int8 graphs, activations per row: ``row_int8.py``).

Dynamic quantization stores weights as int8 and quantizes activations per
call, so it needs no calibration data; it suits a CPU, where ONNX Runtime has
int8 kernels. Not exact: a variant is judged by agreement and BLEU
(``aiayn/export/checks.py``), not by parity. Torch-free.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

# One scale per output channel rather than one per matrix: a row of small weights keeps its own resolution.
PER_CHANNEL = True
FLOAT = 1  # onnx.TensorProto.FLOAT (the serve path has no onnx package)


def quantize_int8(model: Path) -> bytes:
    """The graph file ``model`` (its external data, if any, beside it) with int8 weights in every op ONNX Runtime
    quantizes (MatMul and Gather among them), one scale per output channel.

    ONNX Runtime's pre-processing runs first (shape inference, constant folding), as its docs advise: the quantizer
    only takes weights that are initializers, and the output projection is the embedding's transpose, folded only
    then (so that this variant holds the tied matrix twice, as int8).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        prepared, target = Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        quant_pre_process(str(model), str(prepared))
        quantize_dynamic(
            str(prepared),
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=PER_CHANNEL,
            extra_options={"DefaultTensorType": FLOAT},  # contrib-op outputs have no inferred type
        )
        return target.read_bytes()
