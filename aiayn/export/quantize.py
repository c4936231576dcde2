"""The int8 variant: ONNX Runtime dynamic quantization, and what it costs in BLEU.

Dynamic quantization stores the MatMul and Gather weights as int8 and
quantizes activations per call, so it needs no calibration data; it suits a
CPU, where ONNX Runtime has int8 kernels. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aiayn.model.data import ParallelCorpus
from aiayn.model.metrics import Scores

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


def bleu_by_variant(
    folder: Path, corpus: ParallelCorpus, variants: Sequence[str], beam_size: int = 4
) -> dict[str, Scores]:
    """sacreBLEU of each ONNX variant's translations of ``corpus`` (ONNX Runtime on the CPU)."""
    from aiayn.model.config import load_config
    from aiayn.model.evaluate import evaluate
    from aiayn.model.folder import TOKENIZER_FILE
    from aiayn.model.tokenizer import SubwordTokenizer
    from aiayn.search.translator import SearchSettings, Translator
    from aiayn.serve.engine import OnnxEngine

    tokenizer = SubwordTokenizer.load(Path(folder) / TOKENIZER_FILE)
    max_len = load_config(folder).max_len
    scores = {}
    for variant in variants:
        translator = Translator(OnnxEngine.load(folder, device="cpu", variant=variant), tokenizer, max_len)
        scores[variant] = evaluate(translator, corpus, SearchSettings(beam_size=beam_size), progress=False).scores
    return scores
