"""Writes a model folder's encoder and decoder as ONNX graphs that follow ``contract.py``.

The graphs wrap the model's own ``encode()``, ``start_cache()`` and ``decode()``;
nothing of the model is re-implemented here.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

import aiayn
from aiayn.export.contract import OPSET, GraphSpec, contract, decoder_spec, encoder_spec, variant_file
from aiayn.model.cache import KVCache
from aiayn.model.config import ModelConfig, write_config_section
from aiayn.model.folder import WEIGHTS_FILE
from aiayn.model.transformer import Transformer

# Initializers smaller than this stay fp32: the Cast nodes would cost more than they save.
MIN_COMPACT_ELEMENTS = 4096


def weights_digest(folder: Path) -> str:
    """sha256 of model.safetensors: ties exported graphs to the exact weights they came from."""
    return hashlib.sha256((Path(folder) / WEIGHTS_FILE).read_bytes()).hexdigest()


def interleave(keys: tuple[Tensor, ...], values: tuple[Tensor, ...]) -> list[Tensor]:
    """(k0, k1), (v0, v1) → [k0, v0, k1, v1]: the contract's order of per-layer tensors."""
    return [t for pair in zip(keys, values, strict=True) for t in pair]


class EncoderGraph(nn.Module):
    """src_ids → memory and each decoder layer's cross-attention keys/values."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(src_ids)  # (batch, src_len, d_model)
        cache = self.model.start_cache(memory)
        return (memory, *interleave(cache.cross_keys, cache.cross_values))


class DecoderGraph(nn.Module):
    """One decoding step over any number of new tokens, with the past keys/values in and out."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.n_layers = model.config.n_decoder_layers

    def forward(self, tgt_ids: Tensor, position_offset: Tensor, src_mask: Tensor, *kv: Tensor) -> tuple[Tensor, ...]:
        n = self.n_layers
        cross, past = kv[: 2 * n], kv[2 * n :]
        cache = KVCache(past[0::2], past[1::2], cross[0::2], cross[1::2])
        out = self.model.decode(tgt_ids, cache, src_mask[:, None, None, :], offset=position_offset)
        log_probs = F.log_softmax(out.logits, dim=-1)  # (batch, new_len, vocab)
        return (log_probs, *interleave(out.cache.self_keys, out.cache.self_values), out.cross_attention)


def example_inputs(config: ModelConfig) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Example tensors for tracing; every dynamic size is ≥ 2 and distinct so none gets frozen."""
    batch, src_len, past_len, new_len = 3, 7, 4, 2
    src_ids = torch.randint(4, config.vocab_size, (batch, src_len))
    src_ids[0, -2:] = config.special_tokens.pad
    kv_shape = (batch, config.n_heads, src_len, config.d_head)
    past_shape = (batch, config.n_heads, past_len, config.d_head)
    cross = [torch.randn(kv_shape) for _ in range(2 * config.n_decoder_layers)]
    past = [torch.randn(past_shape) for _ in range(2 * config.n_decoder_layers)]
    decoder_args = (
        torch.randint(4, config.vocab_size, (batch, new_len)),
        torch.tensor(past_len, dtype=torch.int64),
        src_ids != config.special_tokens.pad,
        *cross,
        *past,
    )
    return (src_ids,), decoder_args


def export_graph(
    module: nn.Module, args: tuple[Tensor, ...], spec: GraphSpec, path: Path, fold_constants: bool = False
) -> None:
    """Trace ``module`` to ``path``. No folding by default: folding the tied embedding's transpose would
    store the matrix twice; the int8 variant folds, so the quantizer sees the projection as an initializer."""
    torch.onnx.export(
        module,
        args,
        str(path),
        dynamo=False,  # the TorchScript exporter keeps every axis named in dynamic_axes symbolic
        input_names=[t.name for t in spec.inputs],
        output_names=[t.name for t in spec.outputs],
        dynamic_axes={t.name: t.dynamic_axes() for t in (*spec.inputs, *spec.outputs) if t.dynamic_axes()},
        opset_version=OPSET,
        do_constant_folding=fold_constants,
    )


def store_weights_as_fp16(graph: onnx.GraphProto) -> None:
    """Store large fp32 initializers as fp16 + Cast to fp32, where that is exact.

    model.safetensors holds fp16-rounded weights, so this halves the file and
    changes no value; ONNX Runtime folds the casts once when it loads the graph.
    """
    casts = []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < MIN_COMPACT_ELEMENTS:
            continue
        values = numpy_helper.to_array(init)
        half = values.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), values):
            continue
        name = init.name
        init.CopyFrom(numpy_helper.from_array(half, name + ".fp16"))
        casts.append(helper.make_node("Cast", [name + ".fp16"], [name], to=TensorProto.FLOAT, name="cast_" + name))
    for node in reversed(casts):
        graph.node.insert(0, node)


def finish_graph(path: Path, metadata: dict[str, str], compact: bool = True) -> None:
    """Compact, stamp metadata, check fully, and write as one self-contained file."""
    model = onnx.load(str(path))
    if compact:
        store_weights_as_fp16(model.graph)
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    model.producer_name = "aiayn"
    model.producer_version = aiayn.__version__
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def export_onnx(model: Transformer, folder: Path, variants: Sequence[str] = ("fp32",)) -> dict[str, str]:
    """Write the graphs of ``model`` into ``folder`` (fp32, and int8 if asked); record the contract in config.json."""
    folder = Path(folder)
    config = model.config
    model = model.eval().to("cpu")
    metadata = {
        "aiayn.config_fingerprint": config.fingerprint(),
        "aiayn.weights_sha256": weights_digest(folder),
        "aiayn.exporter": f"aiayn {aiayn.__version__}, torch {torch.__version__}",
    }
    encoder_args, decoder_args = example_inputs(config)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for module, args, spec in (
            (EncoderGraph(model), encoder_args, encoder_spec(config)),
            (DecoderGraph(model), decoder_args, decoder_spec(config)),
        ):
            draft = Path(tmp) / spec.file
            if "int8" in variants:
                export_graph(module, args, spec, draft, fold_constants=True)
                quantized = folder / variant_file(spec.file, "int8")
                quantize_int8(draft, quantized)
                finish_graph(quantized, metadata, compact=False)
            export_graph(module, args, spec, draft)
            finish_graph(draft, metadata)
            draft.replace(folder / spec.file)
    write_config_section(folder, "onnx", {**contract(config), **metadata})
    return metadata


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic quantization: int8 weights of MatMul and Gather, activations quantized per call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
