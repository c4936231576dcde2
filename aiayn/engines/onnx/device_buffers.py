"""The serving engine's state in the device's memory: what ``--engine onnx`` keeps on a GPU.

The serving graphs (``serving_graphs.py``) built from the weights for the device's ops
(``serving_spec.SERVING_OPS``: DecoderMaskedMultiHeadAttention on a cache preallocated to the search's length
limit, fp32 or fp16), under the search's step interface. What lives on the device stays there:

- the encoder's cross keys/values of every decoder layer, one tensor (2 · layers, sentences, heads, src_len,
  d_head), computed once per batch and read by each layer through its own slice of it (bound by address);
- the self-attention cache, one tensor (2 · layers, rows, heads, capacity, d_head), bound as both the cache and
  the present of each layer: the new key/value is written in place;
- per step only the new ids and positions go in, and only each row's k best ids and log-probabilities
  (the selection head inside the graph) come out.

``select`` moves no cache for the beam's reordering: each row writes its new key/value in its own slot, and reads
each earlier position from the row of its sentence that a host table names (``cache_indirection``, (sentences,
beams, capacity) int32, DecoderMaskedMultiHeadAttention's own mechanism), so a reorder rewrites that table only. A
sentence that leaves or moves changes the state's map from the search's sentences to the batch's blocks
(``DeviceState.blocks``); finished sentences run on, unread, until the read ones fall to ``COMPACT_BELOW`` of the
blocks, and only then are the read blocks of the cache and their cross keys/values gathered to the front by one
Gather on the device (``io.BoundIO.take``). A sentence's beams share its cross keys/values (``group``).

It runs wherever ONNX Runtime has kernels for the device's ops: the CUDA graphs also run on the CPU provider
(DecoderMaskedMultiHeadAttention and MultiHeadAttention have fp32 CPU kernels), which is how they are proven
without a GPU (``tests/engines/test_cuda_graphs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnxruntime as ort

from aiayn.core import contract
from aiayn.core.config import ModelConfig
from aiayn.engines.onnx import key_layout, serving_spec
from aiayn.engines.onnx.io import BoundIO
from aiayn.engines.onnx.rows import COMPACT_BELOW, consume, distinct, run_length
from aiayn.engines.onnx.serving_spec import ServingOps
from aiayn.engines.onnx.sessions import CPU
from aiayn.search.greedy import EXTRA_LEN


@dataclass(eq=False)
class DeviceBatch:
    """One encoded batch: ``sentences`` blocks of ``group`` rows; its row r is the search's row r."""

    cross: ort.OrtValue  # (2 · layers, sentences, heads, src_len, d_head) on the device
    src_mask: np.ndarray  # (sentences, src_len) int32, 1 = real token
    group: int = 1  # rows per sentence
    cache: ort.OrtValue | None = None  # (2 · layers, rows, heads, capacity, d_head) on the device, from the 1st step
    # (sentences, group, capacity) int32: for row r·group + j and position t < past_len, its key/value is in row
    # r·group + indirection[r, j, t]
    indirection: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 0), np.int32))
    past_len: int = 0
    version: int = 0  # bumped by every step: a state of an older version is consumed
    binding: ort.IOBinding | None = None
    bound_k: int = 0  # the k the outputs are bound for
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (rows,) the step's tokens, on the host
    # The inputs a step rewrites, each an OrtValue where its kernel reads it (``serving_spec.HOST_READ``), bound once
    # and written only through ONNX Runtime (``update_inplace``): a GPU copies a host array when it is bound, so a
    # NumPy write behind a bound value would never be seen there.
    step_inputs: dict[str, ort.OrtValue] = field(default_factory=dict)
    outputs: tuple[ort.OrtValue, ...] = ()  # (rows, k) values and ids, on the device: read by copying

    @property
    def sentences(self) -> int:
        return int(self.cross.shape()[1])

    @property
    def rows(self) -> int:
        return self.sentences * self.group


@dataclass(frozen=True)
class DeviceState:
    """The search's view of a batch: its sentence s is the batch's block ``blocks[s]`` (finished sentences' blocks run
    on, unread, until compaction)."""

    batch: DeviceBatch
    version: int
    blocks: np.ndarray  # (search sentences,) physical block of each

    @cached_property
    def identity(self) -> bool:
        return self.blocks.size == self.batch.sentences and bool((self.blocks == np.arange(self.blocks.size)).all())

    @cached_property
    def rows(self) -> np.ndarray:
        """(search rows,) the physical row of each."""
        g = self.batch.group
        return (self.blocks[:, None] * g + np.arange(g)).reshape(-1)


def fresh_state(batch: DeviceBatch) -> DeviceState:
    return DeviceState(batch, batch.version, np.arange(batch.sentences))


class DeviceBuffers:
    """The decoder state of the serving graphs for ``ops`` in OrtValues on the sessions' device: encode, step and
    select, every input written through ONNX Runtime where its kernel reads it."""

    def __init__(
        self, config: ModelConfig, ops: ServingOps, encoder: ort.InferenceSession, decoder: ort.InferenceSession
    ) -> None:
        self.config, self.ops, self.encoder, self.decoder = config, ops, encoder, decoder
        self.provider = decoder.get_providers()[0]
        self.device = "cpu" if self.provider == CPU else "cuda"  # OrtValues' device type
        self.io = BoundIO(encoder, decoder, self.provider, 1)
        self.dtype = np.dtype(ops.dtype)
        tokens = config.special_tokens
        self.eos_id, self.pad_id = tokens.eos, tokens.pad
        self.cross_names, self.cache_names, self.present_names = (
            contract.kv_names(config, prefix) for prefix in ("cross", "cache", "present")
        )
        decoder_spec = serving_spec.serving_decoder_spec(config, ops)
        # DecoderMaskedMultiHeadAttention's positions: every row at the one cached length (its graphs have no GQA's
        # total length)
        positions = (serving_spec.SEQLENS_K, serving_spec.PAST_LEN)
        self.position_specs = [t for t in decoder_spec.inputs if t.name in positions]
        self.input_names = {t.name for t in decoder_spec.inputs}
        self.key_chunk = key_layout.key_chunk(self.device, self.dtype, config.d_head)

    # -- encoder -----------------------------------------------------------------------------------------

    def start(self, src_ids: np.ndarray) -> DeviceState:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)  # (batch, src_len)
        src_mask = (src_ids != self.pad_id).astype(np.int32)
        feeds = {contract.SRC_IDS: src_ids, contract.SRC_MASK: src_mask}
        _, (cross,) = self.io.encode(feeds, [serving_spec.CROSS_KV], src_mask)
        return fresh_state(DeviceBatch(cross, src_mask))

    # -- decoder -----------------------------------------------------------------------------------------

    def bind_slices(self, binding: ort.IOBinding, value: ort.OrtValue, names: list[str], output: list[str]) -> None:
        """Bind slice i (along the first axis) of the device tensor ``value`` as input ``names[i]`` and, where
        ``output`` names one, as that output too (the same memory: written in place)."""
        shape = value.shape()
        part = shape[1:]
        part_bytes = int(np.prod(part)) * self.dtype.itemsize
        base = value.data_ptr()
        for i, name in enumerate(names):
            address = base + i * part_bytes
            binding.bind_input(name, self.device, 0, self.dtype.type, part, address)
            if output:
                binding.bind_output(output[i], self.device, 0, self.dtype.type, part, address)

    def capacity_for(self, batch: DeviceBatch) -> int:
        """Cache positions to allocate: the search's default limit, source length + 50 (it grows if exceeded)."""
        return int(batch.cross.shape()[3]) + EXTRA_LEN + 1

    def allocate(self, shape: list[int], dtype: type, name: str) -> ort.OrtValue:
        """An OrtValue for input ``name`` where its kernel reads it: host memory or the device's."""
        where = "cpu" if name in serving_spec.HOST_READ else self.device
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, where, 0)

    def bind(self, batch: DeviceBatch) -> None:
        """Bind every decoder input and the cache outputs of ``batch`` (once per batch, again after a select)."""
        rows, cfg = batch.rows, self.config
        if batch.cache is None:  # positions past the length are never read: no need to clear it
            capacity = self.capacity_for(batch)
            shape = [2 * cfg.n_decoder_layers, rows, cfg.n_heads, capacity, cfg.d_head]
            batch.cache = ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype.type, self.device, 0)
            batch.indirection = np.zeros((batch.sentences, batch.group, capacity), np.int32)
        batch.ids = np.full(rows, self.eos_id, np.int64)
        binding = self.decoder.io_binding()
        batch.step_inputs = {contract.TGT_IDS: self.allocate([rows], np.int64, contract.TGT_IDS)}
        if (name := serving_spec.CACHE_INDIRECTION) in self.input_names:
            batch.step_inputs[name] = self.allocate(list(batch.indirection.shape), np.int32, name)
            batch.step_inputs[name].update_inplace(batch.indirection)  # as it stays with one row per sentence
        for spec in self.position_specs:
            shape = [rows if axis == "rows" else int(axis) for axis in spec.shape]
            batch.step_inputs[spec.name] = self.allocate(shape, np.int32, spec.name)
        for name, value in batch.step_inputs.items():
            binding.bind_ortvalue_input(name, value)
        constants = {  # copied where their kernels read them, once: never written after
            serving_spec.BEAM_WIDTH: np.array([batch.group], np.int32),
            serving_spec.GROUP_SHAPE: np.array([batch.sentences, batch.group, cfg.d_model], np.int64),
            contract.SRC_MASK: batch.src_mask,
        }
        for name, array in constants.items():
            if name in self.input_names:
                binding.bind_cpu_input(name, array)
        self.bind_slices(binding, batch.cross, self.cross_names, [])
        self.bind_slices(binding, batch.cache, self.cache_names, self.present_names)
        batch.binding, batch.bound_k = binding, 0

    def bind_outputs(self, batch: DeviceBatch, k: int) -> None:
        """(Re)bind the head's ``k`` and its (rows, k) outputs, left on the device."""
        assert batch.binding is not None
        batch.binding.bind_cpu_input(contract.TOP_K, np.array([k], np.int64))
        batch.outputs = (
            ort.OrtValue.ortvalue_from_shape_and_type([batch.rows, k], np.float32, self.device, 0),
            ort.OrtValue.ortvalue_from_shape_and_type([batch.rows, k], np.int64, self.device, 0),
        )
        for name, value in zip((contract.TOP_LOG_PROBS, contract.TOP_IDS), batch.outputs, strict=True):
            batch.binding.bind_ortvalue_output(name, value)
        batch.bound_k = k

    def write_step_inputs(self, batch: DeviceBatch) -> None:
        """The step's tokens, positions and indirection table, written into the bound values by ONNX Runtime."""
        for name, value in batch.step_inputs.items():
            if name == contract.TGT_IDS:
                value.update_inplace(batch.ids)
            elif name == serving_spec.CACHE_INDIRECTION:
                if batch.group > 1:  # with one row per sentence the table stays as bound (zeros: its own row)
                    value.update_inplace(batch.indirection)
            else:
                value.update_inplace(np.full(value.shape(), batch.past_len, np.int32))

    def grow(self, batch: DeviceBatch) -> None:
        """Double the cache capacity (a search whose limit exceeds source length + 50) by way of the host: rare."""
        assert batch.cache is not None
        old, t = key_layout.plain(batch.cache.numpy(), self.key_chunk), batch.past_len
        cache = np.zeros((*old.shape[:3], 2 * old.shape[3], old.shape[4]), old.dtype)
        cache[:, :, :, :t] = old[:, :, :, :t]
        batch.cache = self.on_device(cache)
        indirection = np.zeros((*batch.indirection.shape[:2], cache.shape[3]), np.int32)
        indirection[:, :, :t] = batch.indirection[:, :, :t]
        batch.indirection = indirection
        self.bind(batch)

    def on_device(self, plain_cache: np.ndarray) -> ort.OrtValue:
        """A plain cache copied to the device in its kernel's key layout."""
        cache = key_layout.in_kernel_layout(plain_cache, self.key_chunk)
        return ort.OrtValue.ortvalue_from_numpy(cache, self.device, 0)

    def run_step(self, state: DeviceState, tgt_ids: np.ndarray, k: int) -> tuple[tuple[np.ndarray, ...], DeviceState]:
        """Feed ``tgt_ids`` (rows, new_len), one token at a time; the head's outputs for the search's rows."""
        batch = consume(state)
        rows = None if state.identity else state.rows
        n = batch.rows if rows is None else rows.size
        if tgt_ids.ndim != 2 or tgt_ids.shape[0] != n:
            raise ValueError(f"tgt_ids must be (rows, new_len) with {n} rows, got {tgt_ids.shape}")
        if batch.binding is None or batch.cache is None:
            self.bind(batch)
        for column in range(tgt_ids.shape[1]):
            assert batch.cache is not None
            if batch.past_len + 1 > batch.cache.shape()[3]:
                self.grow(batch)
            if batch.bound_k != k:
                self.bind_outputs(batch, k)
            if rows is None:
                batch.ids[:] = tgt_ids[:, column]
            else:
                batch.ids[rows] = tgt_ids[:, column]  # other rows (finished sentences) run on, unread
            batch.indirection[:, :, batch.past_len] = np.arange(batch.group)  # each row's new key/value: its own
            self.write_step_inputs(batch)
            self.decoder.run_with_iobinding(batch.binding)
            batch.past_len += 1
        # numpy() copies from a GPU but is a view of host memory the next step overwrites: a copy either way
        outputs = tuple(out.numpy().copy() if rows is None else out.numpy()[rows] for out in batch.outputs)
        return outputs, DeviceState(batch, batch.version, state.blocks)

    # -- row selection -----------------------------------------------------------------------------------

    def select(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        """The search's new rows, ``rows`` of the old ones: within sentence blocks, by the indirection table alone;
        sentences that leave or move, by the state's map of blocks, until so few are read that the read blocks are
        gathered to the front on the device; anything else, by way of the host."""
        rows = np.asarray(rows, dtype=np.int64)
        batch = consume(state)
        g, t = batch.group, batch.past_len
        n = state.blocks.size * g
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= n)):
            raise ValueError(f"rows must be indices below {n}")
        of = (rows // g).reshape(-1, g) if rows.size % g == 0 else None  # (new sentences, g) each row's old sentence
        if batch.cache is None and g == 1 and (k := run_length(rows)) and distinct(rows[::k]):
            return fresh_state(self.regrouped(batch, state.blocks[rows[::k]], k))  # the beam's k copies, at the start
        if of is None or not (of == of[:, :1]).all() or not distinct(of[:, 0]):
            physical = state.rows[rows]
            return fresh_state(self.regrouped(batch, physical // g, 1, self.materialized(batch, physical)))
        read = state.blocks[of[:, 0]]  # (new sentences,) the physical blocks still read
        if batch.cache is not None:  # the beams' reordering: their histories only
            beams = (rows % g).reshape(-1, g)[:, :, None]
            batch.indirection[read, :, :t] = np.take_along_axis(batch.indirection[read, :, :t], beams, axis=1)
        if not 0 < read.size <= COMPACT_BELOW * batch.sentences:
            return DeviceState(batch, batch.version, read)
        cache = None
        if batch.cache is not None:
            cache = self.io.take([batch.cache], (read[:, None] * g + np.arange(g)).reshape(-1), axis=1)[0]
        fresh = self.regrouped(batch, read, g, cache)
        if cache is not None:
            fresh.indirection = np.ascontiguousarray(batch.indirection[read])
        return fresh_state(fresh)

    def regrouped(
        self, batch: DeviceBatch, sentences: np.ndarray, group: int, cache: ort.OrtValue | None = None
    ) -> DeviceBatch:
        """A batch of ``group`` rows for each of ``sentences`` (old ones), over ``cache``."""
        unchanged = sentences.size == batch.sentences and bool((sentences == np.arange(sentences.size)).all())
        cross = batch.cross if unchanged else self.io.take([batch.cross], sentences, axis=1)[0]
        fresh = DeviceBatch(cross, np.ascontiguousarray(batch.src_mask[sentences]), group, past_len=batch.past_len)
        if cache is not None:
            fresh.cache = cache
            fresh.indirection = np.zeros((sentences.size, group, int(cache.shape()[3])), np.int32)
        return fresh

    def materialized(self, batch: DeviceBatch, rows: np.ndarray) -> ort.OrtValue | None:
        """Each of ``rows`` with its whole history in its own row, by way of the host: for selections that cross
        sentences, which the searches never make (they keep each sentence's beams together)."""
        if batch.cache is None:
            return None
        cache, g, t = key_layout.plain(batch.cache.numpy(), self.key_chunk), batch.group, batch.past_len
        history = rows[:, None] // g * g + batch.indirection.reshape(batch.rows, -1)[rows, :t]  # (new rows, t)
        own = np.zeros((cache.shape[0], rows.size, *cache.shape[2:]), cache.dtype)
        own[:, :, :, :t] = cache[:, history, :, np.arange(t)].transpose(2, 0, 3, 1, 4)  # (rows, t, kv, h, d) → …
        return self.on_device(own)
