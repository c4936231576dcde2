"""Writing an ONNX graph from a folder's weights, node by node: the builder the serving graphs and the attention
view share (``graphs.py``, ``attention_view.py``); their weights go to one external-data file
(``onnx/external_data.py``).

Each method answers to a part of the paper it builds (§3.1 the residual stacks, eq. 2 the feed-forward, §3.4 the
scaled embeddings, §3.5 the positions); the weight matrices are fp32, fp16, block-quantized (``block_quant.py``) or
int8 per column with the activations quantized per row in the graph (``row_int8.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aiayn.core.config import ModelConfig
from aiayn.core.contract import IR_VERSION, OPSET, GraphSpec, TensorSpec
from aiayn.core.weight_spec import BIAS, EMBEDDING, W_1, W_2, WEIGHT
from aiayn.engines.onnx.block_quant import BlockScheme, quantize_gather, quantize_matmul
from aiayn.engines.onnx.external_data import ExternalData
from aiayn.engines.onnx.row_int8 import (
    ACTIVATION_LEVELS,
    ACTIVATION_ZERO_POINT,
    LOOKUP_LEVELS,
    SMALLEST_TOP,
    quantize_columns,
)

MS_DOMAIN = "com.microsoft"
EXTERNAL_MIN_BYTES = 4096  # constants from this size on are external data (ONNX Runtime wants ≥ 128 bytes)
POSITION_MARGIN = 64  # positions past max_len: outputs run up to source length + 50
Sublayers = list[tuple[str, Callable[[str], str]]]  # (the norm's weight prefix, the sub-layer) in stack order


def positions_length(config: ModelConfig) -> int:
    """The positions a model's graphs have (the rows of their positions' table)."""
    return config.max_len + POSITION_MARGIN


def sinusoidal_table(length: int, d_model: int, layout: str) -> np.ndarray:
    """§3.5 as ``aiayn.model.layers.sinusoidal_positions`` computes it, (length, d_model) float32: sin/cos pairs
    interleaved, or (``layout`` "halves", Marian's) the d/2 sines first and the d/2 cosines after them."""
    inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / d_model))
    angles = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]  # (length, d_model / 2)
    sin, cos = np.sin(angles), np.cos(angles)
    if layout == "halves":
        return np.concatenate((sin, cos), axis=-1)
    return np.stack((sin, cos), axis=-1).reshape(length, d_model)


class GraphBuilder:
    """Nodes, initializers and unique names for one graph; its large constants go to ``external``; its weight
    matrices are ``dtype`` (float constants all are), block-quantized by ``scheme``, or int8 with ``int8_levels``
    levels a side (``row_int8.py``; 0: not int8)."""

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        external: ExternalData,
        scheme: BlockScheme | None = None,
        dtype: str = "float32",
        int8_levels: int = 0,
    ) -> None:
        self.weights = weights
        self.external = external
        self.scheme = scheme
        self.int8_levels = int8_levels
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0
        self.shared: set[str] = set()  # the names of the constants ``const_once`` made
        self.row_zero_points = ""  # int8: the activations' zero point, one per row (``int8_rows``)

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def const(self, name: str, value: np.ndarray) -> str:
        value = np.ascontiguousarray(value if value.dtype != np.float32 else value.astype(self.dtype, copy=False))
        if value.nbytes >= EXTERNAL_MIN_BYTES:
            self.initializers.append(self.external.reference(name, value))
        else:  # shapes and scalars stay inline: ONNX Runtime's shape inference reads them
            self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def const_once(self, name: str, value: np.ndarray) -> str:
        """A small constant that several nodes read, stored once under ``name``."""
        if name not in self.shared:
            self.shared.add(name)
            self.const(name, value)
        return name

    def weight(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float32)

    @property
    def quantized(self) -> bool:
        """The weight matrices are stored quantized: each projection is a node of its own (no fp32 Attention op)."""
        return self.scheme is not None or self.int8_levels > 0

    def op(
        self, op_type: str, inputs: list[str], hint: str, n_out: int = 1, domain: str = "", **attrs: Any
    ) -> list[str]:
        outputs = [self.fresh(hint) for _ in range(n_out)]
        node = helper.make_node(op_type, inputs, outputs, name=self.fresh(op_type), domain=domain or None, **attrs)
        self.nodes.append(node)
        return outputs

    def op1(self, op_type: str, inputs: list[str], hint: str, domain: str = "", **attrs: Any) -> str:
        return self.op(op_type, inputs, hint, 1, domain, **attrs)[0]

    def linear(self, x: str, names: list[str], hint: str) -> str:
        """x (rows, in) @ Wᵀ + b for one or several torch Linears fused along the outputs → (rows, Σ out)."""
        w = np.concatenate([self.weight(f"{n}.{WEIGHT}") for n in names], axis=0).T  # (in, out)
        b = np.concatenate([self.weight(f"{n}.{BIAS}") for n in names])
        return self.matmul(x, w, hint, self.const(self.fresh(hint + ".b"), b))

    def matmul(self, x: str, w: np.ndarray, hint: str, bias: str = "") -> str:
        """x (rows, in) @ ``w`` (in, out) (+ ``bias``): fp32 MatMul (+ Add, which ORT fuses into a Gemm),
        ``MatMulNBits`` with the bias as its own input, or int8 rows times int8 columns (``int8_matmul``)."""
        if self.int8_levels:
            return self.int8_matmul(x, w, hint, bias)
        if self.scheme is None:
            y = self.op1("MatMul", [x, self.const(self.fresh(hint + ".w"), w)], hint)
            return self.op1("Add", [y, bias], hint) if bias else y
        quantized = quantize_matmul(w, self.scheme)
        b, scales, *zero_points = (
            self.const(self.fresh(f"{hint}.{part}"), array)
            for part, array in zip(("q", "scales", "zero_points"), quantized.constants(), strict=False)
        )
        inputs = [x, b, scales, *(zero_points or [""]), "", bias]  # A, B, scales, zero_points, g_idx, bias
        while inputs[-1] == "":
            inputs.pop()
        return self.op1("MatMulNBits", inputs, hint, MS_DOMAIN, **quantized.attributes)

    def int8_rows(self, x: str, hint: str) -> tuple[str, str]:
        """x (rows, in) → its uint8 codes round(x / s) + 128 (rows, in) and each row's scale s = max|x| / 127
        (rows, 1): from the row alone (``row_int8.quantize_rows`` is the same in NumPy).

        QuantizeLinear takes one zero point per row beside the row's scale: every product of a serving graph has
        the same rows (the encoder's tokens, the decoder's rows), so the first one makes them for all."""
        last_axis = self.const_once("int8.last_axis", np.array([-1]))
        top = self.op1("ReduceMax", [self.op1("Abs", [x], hint + ".abs"), last_axis], hint + ".max")  # (rows, 1)
        top = self.op1("Max", [top, self.const_once("int8.smallest_top", np.array(SMALLEST_TOP, np.float32))], hint)
        levels = self.const_once("int8.levels", np.array(ACTIVATION_LEVELS, np.float32))
        scale = self.op1("Div", [top, levels], hint + ".scale")  # (rows, 1)
        per_row = self.op1("Reshape", [scale, self.const_once("int8.flat", np.array([-1]))], hint + ".scales")
        if not self.row_zero_points:
            zero_point = self.const_once("int8.zero_point", np.array(ACTIVATION_ZERO_POINT, np.uint8))
            rows = self.op1("Shape", [x], "int8.rows", end=1)  # [rows]
            self.row_zero_points = self.op1("Expand", [zero_point, rows], "int8.row_zero_points")  # (rows,)
        return self.op1("QuantizeLinear", [x, per_row, self.row_zero_points], hint + ".q", axis=0), scale

    def int8_matmul(self, x: str, w: np.ndarray, hint: str, bias: str = "") -> str:
        """x (rows, in) @ ``w`` (in, out) (+ ``bias``) as int8: x quantized per row (``int8_rows``), ``w`` per
        column (``row_int8.quantize_columns``), their integer product scaled by the row's scale times the column's
        (``MatMulIntegerToFloat``: the int32 sums of MLAS's u8·s8 kernel, then one multiply), then the bias: an Add
        of its own, as the op's bias input is added before a per-row scale multiplies (ONNX Runtime 1.31)."""
        codes, row_scales = self.int8_rows(x, hint)
        quantized = quantize_columns(w, self.int8_levels)
        weights = self.const(self.fresh(hint + ".q"), quantized.codes)
        scales = self.const(self.fresh(hint + ".scales"), quantized.scales)
        zero_point = self.const_once("int8.zero_point", np.array(ACTIVATION_ZERO_POINT, np.uint8))
        inputs = [codes, weights, row_scales, scales, zero_point]  # A, B, their scales, A's zero point
        y = self.op1("MatMulIntegerToFloat", inputs, hint, MS_DOMAIN)
        return self.op1("Add", [y, bias], hint) if bias else y

    def lookup(self, table: np.ndarray, ids: str, hint: str) -> str:
        """Rows of ``table`` (vocab, d) at ``ids`` (any shape) → (*ids.shape, d): fp32 Gather, int8 rows times
        their scales, or ``GatherBlockQuantized`` where the rows are whole blocks."""
        if self.int8_levels:
            rows = quantize_columns(table.T, LOOKUP_LEVELS)  # a row of the table is a column here
            codes = self.op1("Gather", [self.const(hint + ".q", np.ascontiguousarray(rows.codes.T)), ids], hint)
            scales = self.op1("Gather", [self.const(hint + ".scales", rows.scales[:, None]), ids], hint + ".s")
            return self.op1("Mul", [self.op1("Cast", [codes], hint + ".f", to=onnx.TensorProto.FLOAT), scales], hint)
        if self.scheme is None or table.shape[1] % self.scheme.block_size:
            return self.op1("Gather", [self.const(hint, table), ids], hint)
        quantized = quantize_gather(table, self.scheme)
        data, scales, *zero_points = (
            self.const(f"{hint}.{part}", array)
            for part, array in zip(("q", "scales", "zero_points"), quantized.constants(), strict=False)
        )
        return self.op1(
            "GatherBlockQuantized", [data, ids, scales, *zero_points], hint, MS_DOMAIN, **quantized.attributes
        )

    def activate(self, x: str, activation: str) -> str:
        """The feed-forward's hidden activation (one of ``config.ACTIVATIONS``) as ONNX Runtime runs it best:
        Relu, fused with the Gemm before it into FusedGemm; x·Sigmoid(x), fused into one QuickGelu (α = 1 is the
        SiLU); the erf GELU of torch's F.gelu as the contrib Gelu (opset 18 has none; the Erf formula would be
        fused into the same kernel). Either costs the Gemms' time within noise (32 rows, 512 → 2048 → 512)."""
        if activation == "relu":
            return self.op1("Relu", [x], "relu")
        if activation == "swish":
            return self.op1("Mul", [x, self.op1("Sigmoid", [x], "sigmoid")], "swish")
        return self.op1("Gelu", [x], "gelu", MS_DOMAIN)

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        scale = self.const(self.fresh(prefix + ".g"), self.weight(f"{prefix}.{WEIGHT}"))
        bias = self.const(self.fresh(prefix + ".b"), self.weight(f"{prefix}.{BIAS}"))
        return self.op1("LayerNormalization", [x, scale, bias], "ln", axis=-1, epsilon=eps)

    def stack(self, x: str, sublayers: Sublayers, final_norm: str, config: ModelConfig) -> str:
        """Each sub-layer of ``x`` with its residual and norm (§3.1, §5.4 without dropout): x + f(LN(x)) pre-LN,
        with a final LN; LN(x + f(x)) post-LN."""
        eps = config.layer_norm_eps
        for norm_name, function in sublayers:
            if config.norm_first:
                x = self.op1("Add", [x, function(self.layer_norm(x, norm_name, eps))], "res")
            else:
                x = self.layer_norm(self.op1("Add", [x, function(x)], "res"), norm_name, eps)
        return self.layer_norm(x, final_norm, eps) if config.norm_first else x

    def feed_forward(self, x: str, prefix: str, activation: str) -> str:
        """Eq. 2: max(0, x W1 + b1) W2 + b2, or another ``activation`` in place of max(0, ·)."""
        hidden = self.activate(self.linear(x, [f"{prefix}.{W_1}"], "ffn1"), activation)
        return self.linear(hidden, [f"{prefix}.{W_2}"], "ffn2")

    def embed(self, config: ModelConfig, ids: str) -> str:
        """§3.4: the input embeddings of ``ids`` (any shape) → (*ids.shape, d), scaled by √d_model unless the
        checkpoint leaves the scale out."""
        scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        return self.lookup(self.weight(EMBEDDING) * np.float32(scale), ids, "embedding_in")

    def positions(self, config: ModelConfig) -> str:
        """§3.5: the positions' table (``positions_length``, d) in the config's layout."""
        return self.const("positions", sinusoidal_table(positions_length(config), config.d_model, config.positions))

    def model(self, spec: GraphSpec) -> bytes:
        """The graph with the inputs and outputs that ``spec`` declares, serialized."""
        inputs, outputs = ([value_info(t) for t in tensors] for tensors in (spec.inputs, spec.outputs))
        graph = helper.make_graph(self.nodes, spec.file, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
            producer_name="aiayn",
        )
        model.ir_version = IR_VERSION
        return model.SerializeToString()


def value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)), spec.shape)
