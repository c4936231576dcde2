"""The search's selection head: a TopK node that the serve engine appends to the decoder graph it runs.

Greedy and beam search only ever look at each row's best few next tokens
(``StepModel.step_top``). Selecting them inside the graph means ONNX Runtime
hands back (rows, k) values per step instead of the (rows, vocab) log-softmax
(5 MB a step for beam 4 at batch 32), and NumPy has no vocabulary-wide work left.

decoder.onnx itself stays as the contract says, with plain ONNX operators for
other runtimes; the head is added to its graph in memory at load time (``onnx.helper``).
"""

from __future__ import annotations

import onnx
from onnx import helper

from aiayn.core.contract import LOG_PROBS, TOP_K_INPUT, TOP_K_OUTPUTS
from aiayn.engines.onnx.tiny_graphs import tensor_info


def with_top_k_head(decoder: bytes) -> bytes:
    """The serialized decoder plus ``TopK(log_probs, top_k)`` along the vocabulary (ONNX's default axis -1).

    ONNX's TopK returns the largest first and, among equal values, the lower index first:
    the tie rule of ``aiayn.search.step.top_columns``. ONNX Runtime's CPU kernel keeps it (tested); its CUDA
    kernel is not checked here (no GPU), so on CUDA a tie between exactly equal log-probabilities, rare in
    fp32, may be broken the other way.
    """
    top_log_probs, top_ids = TOP_K_OUTPUTS
    try:
        model = onnx.load_from_string(decoder)
    except Exception as err:  # protobuf's DecodeError: the bytes are no ModelProto
        raise ValueError(f"not an ONNX graph ({err})") from None
    model.graph.node.append(
        helper.make_node("TopK", [LOG_PROBS, TOP_K_INPUT.name], [top_log_probs.name, top_ids.name], "top_k")
    )
    model.graph.input.append(tensor_info(TOP_K_INPUT.name, TOP_K_INPUT.dtype, TOP_K_INPUT.shape))
    model.graph.output.extend(tensor_info(spec.name, spec.dtype, spec.shape) for spec in TOP_K_OUTPUTS)
    return model.SerializeToString()
