"""The int8 variant: ONNX Runtime dynamic quantization (what it costs in BLEU: ``checks.py``).

Dynamic quantization stores the MatMul and Gather weights as int8 and
quantizes activations per call, so it needs no calibration data; it suits a
CPU, where ONNX Runtime has int8 kernels. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

# One scale per output channel rather than one per matrix: a row of small weights keeps its own resolution.
PER_CHANNEL = True


def quantize_int8(source: Path, target: Path) -> None:
    """int8 weights of MatMul and Gather, one scale per output channel, from the plain fp32 graph.

    ONNX Runtime's pre-processing (shape inference, constant folding) comes first, as its docs advise:
    the quantizer only takes weights that are initializers, and the output projection is the
    embedding's folded transpose (so this variant holds the tied matrix twice, as int8).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = target.with_name("prepared." + target.name)
    quant_pre_process(str(source), str(prepared))
    quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8, per_channel=PER_CHANNEL)
    prepared.unlink()

