"""The browser folder's graphs: the contract's encoder and decoder, every weight stored once between them.

Both graphs keep their large constants in one external-data file, ``weights.bin``, in which each distinct tensor's
bytes are written once: the embedding both graphs look tokens up in is one copy, and the page fetches the file once
and hands the same bytes to both sessions (``page/engine.js``). fp32 is the folder's own graphs with nothing but
their storage changed, so they compute exactly what they computed before.

The weight-only variants (``block_quant.VARIANTS``, the ones `aiayn translate --variant` runs on a CPU) replace
every projection ``x @ Wᵀ`` with ``MatMulNBits`` and the embedding lookups with ``GatherBlockQuantized``, quantized
by the same code as the CPU serving graphs, so the weights are the same numbers. The tied output projection is the
embedding's own blocks (the same bytes in ``weights.bin``). Where a variant asks ONNX Runtime to quantize the
activations too (``accuracy_level`` 4: int8 per row and block), the graph does it with standard operators before
the product, as MLAS does (scale = max|x| / 127, codes rounded half to even), since onnxruntime-web's WASM build
ignores the accuracy level and multiplies in fp32; so the browser runs the CLI's arithmetic, and a row's result
depends on nothing but the row. Torch-free.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE, VARIANT_KEY
from aiayn.core.folder import ModelFolder
from aiayn.core.weight_spec import EMBEDDING
from aiayn.engines.onnx.block_quant import VARIANTS, BlockScheme, quantize_gather, quantize_matmul

WEIGHTS_FILE = "weights.bin"
WEB_VARIANTS = ("fp32", *VARIANTS)
EXTERNAL_MIN_BYTES = 1024  # smaller constants (shapes, norms, biases) stay inside the graph
ALIGNMENT = 64
MS_DOMAIN = "com.microsoft"
INT8_ACTIVATIONS = 4  # MatMulNBits's accuracy_level that quantizes its input to int8 per row and block
INT8_MAX = 127.0


class SharedWeights:
    """One external-data file for several graphs, each distinct tensor's bytes written once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("wb")
        self.written: dict[bytes, int] = {}  # sha256 of the bytes → offset

    def externalize(self, graph: onnx.GraphProto) -> None:
        """Point every large initializer of ``graph`` into the file (appending what it does not hold yet)."""
        for tensor in graph.initializer:
            data = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            if len(data) < EXTERNAL_MIN_BYTES:
                continue
            digest = hashlib.sha256(data).digest()
            if digest not in self.written:
                offset = -(-self.file.tell() // ALIGNMENT) * ALIGNMENT
                self.file.seek(offset)
                self.file.write(data)
                self.written[digest] = offset
            for field in ("raw_data", "float_data", "int32_data", "int64_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", self.path.name), ("offset", self.written[digest]), ("length", len(data))):
                tensor.external_data.add(key=key, value=str(value))

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


class WeightQuantizer:
    """Rewrites one contract graph's projections and embedding lookups into ``scheme``'s block-quantized ops."""

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

    def weight(self, name: str) -> tuple[str, np.ndarray] | None:
        """The constant behind ``name``, fp32 (an initializer, or the Cast of its fp16 copy): (its name, value)."""
        node = self.producer.get(name)
        if node is not None and node.op_type == "Cast" and node.input[0] in self.initializers:
            name = node.input[0]
        elif node is not None or name not in self.initializers:
            return None
        value = numpy_helper.to_array(self.initializers[name]).astype(np.float32)
        return name.removesuffix(".fp16"), value

    def transposed_weight(self, name: str) -> tuple[str, np.ndarray] | None:
        """A torch Linear's weight (out, in) behind ``Transpose(perm=[1, 0])``, as the product's (in, out)."""
        node = self.producer.get(name)
        if node is None or node.op_type != "Transpose":
            return None
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        found = self.weight(node.input[0]) if perm == [[1, 0]] else None
        return None if found is None or found[1].ndim != 2 else (found[0], found[1].T)

    def constant(self, name: str, value: np.ndarray) -> str:
        self.added.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def rewrite(self) -> None:
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            if node.op_type == "MatMul" and (found := self.transposed_weight(node.input[1])) is not None:
                nodes += self.matmul(node, *found)
            elif node.op_type == "Gather" and (table := self.table(node.input[0])) is not None:
                nodes.append(self.lookup(node, *table))
            else:
                nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(self.added)
        prune(self.graph)

    def table(self, name: str) -> tuple[str, np.ndarray] | None:
        """The embedding behind ``name``, when its rows are whole blocks (``GatherBlockQuantized`` has no padding);
        positions and other tables stay fp32, as in the serving graphs."""
        found = self.weight(name)
        if found is None or not found[0].endswith(EMBEDDING) or found[1].ndim != 2:
            return None
        return found if found[1].shape[1] % self.scheme.block_size == 0 else None

    def matmul(self, node: onnx.NodeProto, name: str, weight: np.ndarray) -> list[onnx.NodeProto]:
        quantized = quantize_matmul(weight, self.scheme)
        parts = zip(("q", "scales", "zero_points"), quantized.constants(), strict=False)
        inputs = [self.constant(f"{name}.{part}", array) for part, array in parts]
        attributes: dict[str, Any] = dict(quantized.attributes)
        before: list[onnx.NodeProto] = []
        x = node.input[0]
        if attributes["accuracy_level"] == INT8_ACTIVATIONS:
            x, before = self.int8_activations(x, attributes["K"])
            attributes["accuracy_level"] = 0  # the input is already int8 values: multiply them exactly as given
        product = helper.make_node(
            "MatMulNBits", [x, *inputs], list(node.output), name=node.name, domain=MS_DOMAIN, **attributes
        )
        return [*before, product]

    def lookup(self, node: onnx.NodeProto, name: str, table: np.ndarray) -> onnx.NodeProto:
        quantized = quantize_gather(table, self.scheme)
        data, scales, *zero_points = (
            self.constant(f"{name}.rows.{part}", array)
            for part, array in zip(("q", "scales", "zero_points"), quantized.constants(), strict=False)
        )
        return helper.make_node(
            "GatherBlockQuantized",
            [data, node.input[1], scales, *zero_points],
            list(node.output),
            name=node.name,
            domain=MS_DOMAIN,
            **dict[str, Any](quantized.attributes),
        )

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
    """Drop the nodes and initializers nothing reads any more (the Casts and Transposes of replaced weights)."""
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
    if not any(opset.domain == MS_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def check_variant(variant: str) -> None:
    if variant not in WEB_VARIANTS:
        raise ValueError(f"unknown browser variant {variant!r}; choose one of {', '.join(WEB_VARIANTS)}")


def write_browser_graphs(folder: ModelFolder, variant: str, out_dir: Path) -> list[Path]:
    """encoder.onnx, decoder.onnx and their one weights.bin in ``out_dir``, from the folder's fp32 graphs, in
    ``variant`` (one of ``WEB_VARIANTS``): the files written."""
    check_variant(variant)
    written = [out_dir / ENCODER_FILE, out_dir / DECODER_FILE, out_dir / WEIGHTS_FILE]
    with SharedWeights(written[2]) as shared:
        for graph_file, target in zip((ENCODER_FILE, DECODER_FILE), written, strict=False):
            model = onnx.load(str(folder.onnx_file(graph_file)))
            if variant in VARIANTS:
                quantize_weights(model, VARIANTS[variant])
            stamp = {entry.key: entry.value for entry in model.metadata_props} | {VARIANT_KEY: variant}
            del model.metadata_props[:]
            onnx.helper.set_model_props(model, stamp)
            shared.externalize(model.graph)
            onnx.save(model, str(target))
    return written
