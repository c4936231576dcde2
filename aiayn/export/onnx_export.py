"""Writes a model folder's encoder and decoder as ONNX graphs that follow ``contract.py``.

The graphs wrap the model's own ``encode()``, ``start_cache()`` and ``decode()``;
nothing of the model is re-implemented here. The exporter is torch.onnx's
TorchScript path (``dynamo=False``): in torch 2.13 it keeps every axis named in
``dynamic_axes`` symbolic (proven by tests at sizes unlike the example), it
lets us switch off constant folding (which would store the tied embedding
twice), and it is about ten times faster than the dynamo path (the bundled
decoder: 2 s against 22 s here), whose graphs compute the same.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

import aiayn
from aiayn.core.config import ModelConfig
from aiayn.core.contract import (
    EXPORTER_KEY,
    OPSET,
    VARIANT_KEY,
    VARIANTS,
    GraphSpec,
    contract,
    decoder_spec,
    encoder_spec,
    stamp,
    variant_file,
)
from aiayn.core.folder import ONNX_SECTION, ModelFolder
from aiayn.core.outputs import sync_tree
from aiayn.engines.onnx.quantize import quantize_int8
from aiayn.model.cache import KVCache
from aiayn.model.transformer import Transformer

# Initializers smaller than this stay fp32: the Cast nodes would cost more than they save.
MIN_COMPACT_ELEMENTS = 1024
# Op types that keep fp32 arithmetic in the fp16 graphs, besides the position encodings: the
# log-softmax over the whole vocabulary, whose outputs the beam search adds up.
FP32_OPS_IN_FP16 = ("LogSoftmax",)


def require_folder_weights(model: Transformer, folder: ModelFolder) -> None:
    """The graphs are stamped with the hashes of the folder's files, so ``model`` must be exactly those."""
    from safetensors.torch import load_file

    if folder.config.fingerprint() != model.config.fingerprint():
        raise ValueError(f"the model to export is not the one described by {folder.config_file}")
    saved = load_file(str(folder.weights_file))
    current = model.state_dict()
    differ = sorted(set(saved) ^ set(current)) + sorted(
        k for k in current if k in saved and not torch.equal(saved[k].to(current[k]), current[k])
    )
    if differ:
        raise ValueError(
            f"the model to export differs from {folder.weights_file} in {len(differ)} tensors ({differ[0]}, ...); "
            "save its weights into the folder first"
        )


class EncoderGraph(nn.Module):
    """src_ids → memory and each decoder layer's cross-attention keys/values."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(src_ids)  # (batch, src_len, d_model)
        cache = self.model.start_cache(memory)
        return (memory, *cache.cross_kv)  # the cache's order is the contract's


class DecoderGraph(nn.Module):
    """One decoding step over any number of new tokens, with the past keys/values in and out."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.n_layers = model.config.n_decoder_layers

    def forward(self, tgt_ids: Tensor, position_offset: Tensor, src_mask: Tensor, *kv: Tensor) -> tuple[Tensor, ...]:
        n = self.n_layers
        cross, past = kv[: 2 * n], kv[2 * n :]
        cache = KVCache(past, cross)
        out = self.model.decode(tgt_ids, cache, src_mask[:, None, None, :], offset=position_offset)
        log_probs = F.log_softmax(out.logits, dim=-1)  # (batch, new_len, vocab)
        return (log_probs, *out.cache.self_kv, out.cross_attention)


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


def export_graph(module: nn.Module, args: tuple[Tensor, ...], spec: GraphSpec, path: Path) -> None:
    """Trace ``module`` to ``path``. No constant folding: folding the tied embedding's transpose would
    store the matrix twice (ONNX Runtime folds it in memory when it loads the graph)."""
    with warnings.catch_warnings():
        # The TorchScript path is deprecated in favour of dynamo; chosen on purpose (module docstring).
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        # attention.py takes √d_head from a tensor size; d_head is fixed by the config, so the constant is right.
        warnings.filterwarnings("ignore", "Converting a tensor to a Python float", torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamic_axes={t.name: t.dynamic_axes() for t in (*spec.inputs, *spec.outputs) if t.dynamic_axes()},
            opset_version=OPSET,
            do_constant_folding=False,
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


def position_nodes(graph: onnx.GraphProto) -> list[str]:
    """Names of the nodes that compute the sinusoidal positions: the Sin/Cos nodes and all they depend on.

    In fp16 an angle pos · ω near pos = 100 is off by up to 0.03, so these stay fp32 (§3.5's table)."""
    producer = {out: node for node in graph.node for out in node.output}
    wanted = [node for node in graph.node if node.op_type in ("Sin", "Cos")]
    names: set[str] = set()
    while wanted:
        node = wanted.pop()
        if node.name in names:
            continue
        names.add(node.name)
        wanted += [producer[name] for name in node.input if name in producer]
    return sorted(names)


def convert_to_fp16(source: Path, target: Path) -> None:
    """fp16 arithmetic inside, the contract's fp32 inputs and outputs kept (Casts at the edges)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = onnx.load(str(source))
    kept_fp32 = position_nodes(model.graph)
    model = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP32_OPS_IN_FP16],
        node_block_list=kept_fp32,
    )
    join_fp32_nodes(model.graph, set(kept_fp32))
    converted = OnnxModel(model)
    converted.topological_sort()  # the converter appends its Casts at the end; the checker wants order
    onnx.save(converted.model, str(target))


def join_fp32_nodes(graph: onnx.GraphProto, kept_fp32: set[str]) -> None:
    """Pass fp32 values straight between two nodes kept in fp32.

    The converter wraps each kept node in Casts on its own, so a value from one
    kept node to the next would go fp32 → fp16 → fp32 and lose the precision
    the nodes were kept for (and a value with two kept consumers gets two Casts
    of the same name). Here such a pair of Casts is bypassed and then dropped.
    """
    producer = {out: node for node in graph.node for out in node.output}

    def cast_to(node: onnx.NodeProto | None, dtype: int) -> bool:
        return node is not None and node.op_type == "Cast" and helper.get_attribute_value(node.attribute[0]) == dtype

    for node in graph.node:
        for i, name in enumerate(node.input):
            up = producer.get(name)
            if cast_to(up, TensorProto.FLOAT) and cast_to(down := producer.get(up.input[0]), TensorProto.FLOAT16):
                source = producer.get(down.input[0])
                if source is not None and source.name in kept_fp32:
                    node.input[i] = down.input[0]
    while True:
        used = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
        unused = [n for n in graph.node if n.op_type == "Cast" and not set(n.output) & used]
        if not unused:
            return
        for node in unused:
            graph.node.remove(node)


def declare_io(graph: onnx.GraphProto, spec: GraphSpec) -> None:
    """Write the contract's axis names on the graph's inputs and outputs: ONNX Runtime's quantization
    pre-processing renames them (``total_len`` becomes ``new_len + past_len``)."""
    for values, tensors in ((graph.input, spec.inputs), (graph.output, spec.outputs)):
        for value, tensor in zip(values, tensors, strict=True):
            dims = value.type.tensor_type.shape.dim
            for dim, axis in zip(dims, tensor.shape, strict=True):
                if isinstance(axis, str):
                    dim.dim_param = axis
                else:
                    dim.dim_value = axis


def finish_graph(path: Path, spec: GraphSpec, metadata: dict[str, str]) -> None:
    """Compact, declare the contract's axes, stamp metadata, check fully, and write as one self-contained file."""
    model = onnx.load(str(path))
    store_weights_as_fp16(model.graph)
    declare_io(model.graph, spec)
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    model.producer_name = "aiayn"
    model.producer_version = aiayn.__version__
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def export_onnx(
    model: Transformer, folder: ModelFolder | str | Path, variants: Sequence[str] = ("fp32",)
) -> dict[str, str]:
    """Write the graphs of ``model`` into ``folder`` and record the contract in config.json.

    The fp32 graphs are always written (the other variants derive from them and
    are judged against them); ``variants`` may add ``int8`` and ``fp16``. All
    files are written to a temporary folder first, so a failure leaves the old
    export in place. Returns the metadata stamped into every graph.
    """
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown ONNX variants {unknown}; choose from {', '.join(VARIANTS)}")
    wanted = [v for v in VARIANTS if v == "fp32" or v in variants]
    folder = folder if isinstance(folder, ModelFolder) else ModelFolder.open(folder)
    config = model.config
    model = model.eval().to("cpu")
    require_folder_weights(model, folder)
    metadata = {
        **stamp(config, folder.weights_sha256),
        EXPORTER_KEY: f"aiayn {aiayn.__version__}, torch {torch.__version__}",
    }
    encoder_args, decoder_args = example_inputs(config)
    with tempfile.TemporaryDirectory(dir=folder.path, prefix=".export-") as tmp, torch.no_grad():
        drafts = Path(tmp)
        for module, args, spec in (
            (EncoderGraph(model), encoder_args, encoder_spec(config)),
            (DecoderGraph(model), decoder_args, decoder_spec(config)),
        ):
            plain = drafts / spec.file
            export_graph(module, args, spec, plain)
            if "fp16" in wanted:
                convert_to_fp16(plain, drafts / variant_file(spec.file, "fp16"))
            if "int8" in wanted:
                int8 = quantize_int8(plain)
                (drafts / variant_file(spec.file, "int8")).write_bytes(int8)
            for variant in wanted:
                finish_graph(drafts / variant_file(spec.file, variant), spec, {**metadata, VARIANT_KEY: variant})
        sync_tree(drafts)  # on disk before they are renamed over the old graphs
        for variant in wanted:
            for spec in (encoder_spec(config), decoder_spec(config)):
                (drafts / variant_file(spec.file, variant)).replace(folder.onnx_file(spec.file, variant))
    folder.write_section(ONNX_SECTION, {**contract(config), **metadata, "variants": wanted})
    return metadata
