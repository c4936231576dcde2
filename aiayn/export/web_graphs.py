"""The browser folder's graphs: the contract's encoder and decoder, every weight stored once between them.

Both graphs keep their large constants in one external-data file, ``weights.bin``, in which each distinct tensor's
bytes are written once: the embedding both graphs look tokens up in is one copy, and the page fetches the file once
and hands the same bytes to both sessions (``page/engine.js``). fp32 is the folder's own graphs with nothing but
their storage changed and ONNX Runtime's fusions applied once here (``fused_for_the_browser``) instead of in the
browser, so they compute what they computed before.

The weight-only variants (``engines.BLOCK_VARIANTS``, the ones `aiayn translate --variant` runs on a CPU) store every
projection's weight and the embedding as the same blocks the CPU serving graphs hold (``block_quant``, the same
code), each once: the tied output projection reads the embedding's blocks. Standard operators turn them back into
fp32, (code - zero point) · scale as ONNX Runtime's ``MatMulNBits`` and ``GatherBlockQuantized`` compute it, on
constants only, so ONNX Runtime folds them once when the session loads and the products run at fp32's speed (those
two contrib ops run in onnxruntime-web's WASM build, but ``MatMulNBits`` there ignores the accuracy level and runs
6.5× slower than fp32's MatMul at the base size). Where a variant asks ONNX Runtime to quantize the activations too
(``accuracy_level`` 4: int8 per row and block), the graph does it with standard operators before each product, as
MLAS does (scale = max|x| / 127, codes rounded half to even), so the browser runs the CLI's arithmetic, up to fp32
rounding, and a row's result depends on nothing but the row. Torch-free.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE, VARIANT_KEY
from aiayn.core.folder import ModelFolder
from aiayn.core.weight_spec import EMBEDDING
from aiayn.engines import WEB_VARIANTS, WEIGHTS
from aiayn.engines.onnx.block_quant import BlockScheme, quantize_matmul
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE, ExternalData

EXTERNAL_MIN_BYTES = 1024  # smaller constants (shapes, norms, biases) stay inside the graph
ALIGNMENT = 64
INT8_ACTIVATIONS = 4  # MatMulNBits's accuracy_level that quantizes its input to int8 per row and block
INT8_MAX = 127.0


class WeightQuantizer:
    """Stores one contract graph's projection weights and embedding as ``scheme``'s blocks, turned back into fp32 by
    standard operators on constants, which ONNX Runtime folds once when the session loads: the products and lookups
    around them are the fp32 graph's own, as fast as fp32, and need no contrib op."""

    def __init__(self, graph: onnx.GraphProto, scheme: BlockScheme) -> None:
        self.graph, self.scheme = graph, scheme
        self.producer = {out: node for node in graph.node for out in node.output}
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.added: list[onnx.TensorProto] = []
        self.int8_inputs: dict[str, str] = {}  # an input already quantized for its products (q, k and v share one)
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_q{self.counter}"

    def constant(self, name: str, value: np.ndarray) -> str:
        self.added.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def source(self, name: str) -> str | None:
        """The 2-D initializer behind the fp32 value ``name``: itself, or the fp16 copy a Cast turns into it."""
        node = self.producer.get(name)
        if node is not None:
            cast = node.op_type == "Cast" and node.input[0] in self.initializers
            name = node.input[0] if cast else ""
        tensor = self.initializers.get(name)
        return name if tensor is not None and len(tensor.dims) == 2 else None

    def linear_weight(self, node: onnx.NodeProto) -> str | None:
        """For a product x @ Transpose(W), W (out, in) a torch Linear's constant weight: W's fp32 value."""
        transpose = self.producer.get(node.input[1])
        if transpose is None or transpose.op_type != "Transpose":
            return None
        perm = [list(a.ints) for a in transpose.attribute if a.name == "perm"]
        return transpose.input[0] if perm == [[1, 0]] and self.source(transpose.input[0]) else None

    def rewrite(self) -> None:
        weights: set[str] = set()  # the fp32 values to store as blocks
        products: dict[str, int] = {}  # output → K of each product over one of them
        for node in self.graph.node:
            if node.op_type == "MatMul" and (weight := self.linear_weight(node)) is not None:
                weights.add(weight)
                products[node.output[0]] = int(self.initializers[str(self.source(weight))].dims[1])
            elif node.op_type == "Gather" and (table := self.source(node.input[0])) is not None:
                if table.removesuffix(".fp16").endswith(EMBEDDING):  # positions stay fp32, as in the serving graphs
                    weights.add(node.input[0])
        nodes: list[onnx.NodeProto] = []
        for weight in sorted(weights):
            nodes += self.dequantized(weight, str(self.source(weight)))
        for node in self.graph.node:
            if set(node.output) & weights:  # the Cast that made the weight from its fp16 copy
                continue
            if node.output[0] in products and self.scheme.accuracy_level == INT8_ACTIVATIONS:
                x, before = self.int8_activations(node.input[0], products[node.output[0]])
                nodes += before
                node.input[0] = x
            nodes.append(node)
        kept = [tensor for tensor in self.graph.initializer if tensor.name not in weights]
        del self.graph.initializer[:], self.graph.node[:]
        self.graph.initializer.extend([*kept, *self.added])
        self.graph.node.extend(nodes)
        prune(self.graph)

    def dequantized(self, out: str, source: str) -> list[onnx.NodeProto]:
        """Nodes that make ``out``, the weight W (N, K) of initializer ``source``, from its blocks along K:
        (code - zero point) · scale, as ONNX Runtime's block-quantized ops compute it."""
        weight = numpy_helper.to_array(self.initializers[source]).astype(np.float32)
        n, k = weight.shape
        quantized = quantize_matmul(weight.T, self.scheme)  # one row of blocks per output: W's own rows
        name, bits = source.removesuffix(".fp16"), self.scheme.bits
        n_blocks = quantized.scales.shape[1]
        packed = self.constant(f"{name}.q{bits}", quantized.packed.reshape(n, -1))
        scales = self.constant(f"{name}.scales", quantized.scales[..., None])  # (N, n_blocks, 1)
        nodes, codes = self.codes(packed, bits, (n, n_blocks, -1))
        if quantized.zero_points is None:  # symmetric: ONNX Runtime's default zero point, 2^(bits-1)
            zero_points = self.constant(self.fresh(f"{name}.zero_point"), np.array(1 << (bits - 1), np.float32))
        else:  # packed like the codes, a byte's last half unused where the blocks are odd: (N, n_blocks, 1)
            unpacked, padded = self.codes(self.constant(f"{name}.zero_points", quantized.zero_points), bits, (n, -1, 1))
            nodes += [*unpacked, self.leading(padded, n_blocks, out + ".zp")]
            zero_points = out + ".zp"
        flat = self.constant(self.fresh("flat"), np.array([n, -1]))
        nodes += [
            helper.make_node("Sub", [codes, zero_points], [out + ".centred"]),
            helper.make_node("Mul", [out + ".centred", scales], [out + ".blocks"]),
            helper.make_node("Reshape", [out + ".blocks", flat], [out + ".padded"]),  # (N, n_blocks · block_size)
            self.leading(out + ".padded", k, out),  # (N, K)
        ]
        for index, node in enumerate(nodes):
            node.name = f"{out}.dequantize.{index}"
        return nodes

    def leading(self, x: str, count: int, out: str) -> onnx.NodeProto:
        """The first ``count`` entries of ``x`` along axis 1."""
        bounds = [
            self.constant(self.fresh(part), np.array([v])) for part, v in (("start", 0), ("end", count), ("axis", 1))
        ]
        return helper.make_node("Slice", [x, *bounds], [out])

    def codes(self, packed: str, bits: int, shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], str]:
        """``packed`` uint8 codes, low bits first, as fp32 values of ``shape``: the nodes, and their output."""
        out = self.fresh(packed)
        target = self.constant(self.fresh("shape"), np.array(shape))
        if bits == 8:
            nodes = [helper.make_node("Reshape", [packed, target], [out + ".codes"])]
        else:  # two 4-bit codes a byte: the low one first
            axes = self.constant(self.fresh("axes"), np.array([-1]))
            nodes = [
                helper.make_node(
                    "BitwiseAnd", [packed, self.constant(self.fresh("low"), np.array(15, np.uint8))], [out + ".low"]
                ),
                helper.make_node(
                    "BitShift",
                    [packed, self.constant(self.fresh("shift"), np.array(4, np.uint8))],
                    [out + ".high"],
                    direction="RIGHT",
                ),
                helper.make_node("Unsqueeze", [out + ".low", axes], [out + ".low1"]),
                helper.make_node("Unsqueeze", [out + ".high", axes], [out + ".high1"]),
                helper.make_node("Concat", [out + ".low1", out + ".high1"], [out + ".pairs"], axis=-1),
                helper.make_node("Reshape", [out + ".pairs", target], [out + ".codes"]),
            ]
        nodes.append(helper.make_node("Cast", [out + ".codes"], [out], to=onnx.TensorProto.FLOAT))
        return nodes, out

    def int8_activations(self, x: str, k: int) -> tuple[str, list[onnx.NodeProto]]:
        """``x`` (…, K) as MatMulNBits's accuracy level 4 sees it: per row and block of K, codes round(x · 127 /
        max|x|) times max|x| / 127 (a block of zeros stays zeros). The nodes, where ``x`` is not done already."""
        if x in self.int8_inputs:
            return self.int8_inputs[x], []
        size = self.scheme.block_size
        if k % size:
            raise ValueError(f"a product over {k} inputs is no whole number of {size}-value blocks")
        out = self.fresh(x)

        def const(hint: str, value: np.ndarray) -> str:
            return self.constant(self.fresh(hint), value)

        blocks, axes = const("blocks", np.array([-1, k // size, size])), const("axes", np.array([-1]))
        zero, int8_max = const("zero", np.array(0, np.float32)), const("int8_max", np.array(INT8_MAX, np.float32))
        nodes = [
            helper.make_node("Shape", [x], [out + ".shape"]),
            helper.make_node("Reshape", [x, blocks], [out + ".blocks"]),  # (rows, K / size, size)
            helper.make_node("Abs", [out + ".blocks"], [out + ".abs"]),
            helper.make_node("ReduceMax", [out + ".abs", axes], [out + ".max"], keepdims=1),
            helper.make_node("Equal", [out + ".max", zero], [out + ".empty"]),
            helper.make_node("Div", [int8_max, out + ".max"], [out + ".inverse"]),
            helper.make_node("Where", [out + ".empty", zero, out + ".inverse"], [out + ".mul"]),
            helper.make_node("Mul", [out + ".blocks", out + ".mul"], [out + ".scaled"]),
            helper.make_node("Round", [out + ".scaled"], [out + ".codes"]),  # half to even, as MLAS rounds
            helper.make_node("Div", [out + ".max", int8_max], [out + ".scale"]),
            helper.make_node("Mul", [out + ".codes", out + ".scale"], [out + ".values"]),
            helper.make_node("Reshape", [out + ".values", out + ".shape"], [out]),  # (…, K)
        ]
        for index, item in enumerate(nodes):
            item.name = f"{out}.{index}"
        self.int8_inputs[x] = out
        return out, nodes


def prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes and initializers nothing reads any more (the fp16 copies of the weights now stored as blocks)."""
    while True:
        read = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
        unused = [node for node in graph.node if not set(node.output) & read]
        if not unused:
            break
        for node in unused:
            graph.node.remove(node)
    read = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def quantize_weights(model: onnx.ModelProto, scheme: BlockScheme) -> None:
    WeightQuantizer(model.graph, scheme).rewrite()


def fused_for_the_browser(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as ONNX Runtime's extended optimizations leave it on a CPU (its fusions: LayerNormalization,
    FusedMatMul, ...), done once here rather than in every visitor's browser when the page opens (docs/onnx.md, "Threads
    and the first answer": the sessions' creation is most of the first translation's time). Constant folding is left
    to the browser (``engine.js``, level basic): folded here, the fp16 weights' casts and the w8/w4 blocks would be
    stored as fp32, two to eight times the download."""
    with tempfile.TemporaryDirectory(prefix="aiayn-web-graph-") as name:
        source, target = Path(name) / "graph.onnx", Path(name) / "fused.onnx"
        onnx.save(model, str(source))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(target)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "fused.bin")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(source), options, ["CPUExecutionProvider"], disabled_optimizers=["ConstantFolding"])
        return onnx.load(str(target))


def check_variant(variant: str) -> None:
    if variant not in WEB_VARIANTS:
        raise ValueError(f"unknown browser variant {variant!r}; choose one of {', '.join(WEB_VARIANTS)}")


def write_browser_graphs(folder: ModelFolder, variant: str, out_dir: Path) -> list[Path]:
    """encoder.onnx, decoder.onnx and their one weights.bin in ``out_dir``, from the folder's fp32 graphs, in
    ``variant`` (one of ``WEB_VARIANTS``): the files written."""
    check_variant(variant)
    written = [out_dir / ENCODER_FILE, out_dir / DECODER_FILE, out_dir / EXTERNAL_DATA_FILE]
    scheme = WEIGHTS[variant].block
    with ExternalData(written[2], ALIGNMENT) as shared:
        for graph_file, target in zip((ENCODER_FILE, DECODER_FILE), written, strict=False):
            model = onnx.load(str(folder.onnx_file(graph_file)))
            if scheme:
                quantize_weights(model, scheme)
            stamp = {entry.key: entry.value for entry in model.metadata_props} | {VARIANT_KEY: variant}
            model = fused_for_the_browser(model)
            del model.metadata_props[:]
            onnx.helper.set_model_props(model, stamp)
            shared.externalize(model.graph, EXTERNAL_MIN_BYTES)
            onnx.save(model, str(target))
    return written
