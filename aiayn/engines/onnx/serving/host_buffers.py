"""The serving engine's state on the CPU: NumPy buffers that ONNX Runtime reads and writes where they are.

Per batch, every array the decoder reads or writes is allocated once and bound once
(ONNX Runtime I/O binding over NumPy memory). A step writes the new token ids and
lengths into the bound arrays in place, runs the session, and reads the outputs
from the bound arrays: no per-step binding, no per-step allocation, no cache copy.

Rows are grouped by sentence: ``group`` rows per sentence (1 for greedy, the beam
size for beam search) sit in one block of physical rows and share that sentence's
cross keys/values, which are never repeated per beam. ``select`` is cheap:

- the beam's reordering within a sentence moves no cache at all for a beam's first
  child (it takes over its parent's row); only a further child of the same parent
  gets a copy of the parent's filled cache, in a row that a childless beam left;
- a sentence that leaves the search just stops being read: its rows keep running
  (on </s>) until the live sentences fall to ``COMPACT_BELOW`` of the physical
  ones, and only then are the live blocks moved to the front (filled part only);
- the beam's first step runs on one row per sentence (all its beams would start from <s>); the selection after
  it, each sentence's row k times, makes that row a block of k copies (``regroup``);
- anything else (rows repeated across sentences, say) falls back to a general
  gather into fresh buffers with one row per sentence.

A graph of weight-only blocks runs its encoder and decoder on a multiple of the rows that this machine's
``MatMulNBits`` kernel tiles (``row_multiple``, probed at load by ``kernel_rows.py``; 2 on every x86 CPU): unread
copies of the first sentence make up the rows, and compaction keeps spare blocks, so that a sentence's translation
is the same bits alone or among others.

States are linear: ``run_step``/``select`` consume their state (the buffers are updated in place) and a
consumed state refuses to be used again (``rows.consume``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from aiayn.core import contract
from aiayn.core.config import ModelConfig
from aiayn.engines.onnx.serving import spec
from aiayn.engines.onnx.serving.rows import COMPACT_BELOW, consume, distinct, run_length
from aiayn.search.greedy import EXTRA_LEN


def ortvalue(array: np.ndarray) -> ort.OrtValue:
    """An OrtValue over ``array``'s own memory (CPU): what ONNX Runtime writes there, NumPy sees."""
    if not array.flags.c_contiguous:
        raise ValueError("only C-contiguous arrays can be bound")
    return ort.OrtValue.ortvalue_from_numpy(array)


def bind_head(binding: ort.IOBinding, rows: int, k: int, keep_alive: list[ort.OrtValue]) -> tuple[np.ndarray, ...]:
    """Bind the selection head's ``k`` and its host outputs for ``rows``: the (rows, k) values and ids arrays that
    each run fills; the OrtValues over them join ``keep_alive``."""
    outputs: tuple[np.ndarray, np.ndarray] = (np.empty((rows, k), np.float32), np.empty((rows, k), np.int64))
    k_value = ortvalue(np.array([k], np.int64))
    binding.bind_ortvalue_input(contract.TOP_K, k_value)
    keep_alive.append(k_value)
    for name, array in zip((contract.TOP_LOG_PROBS, contract.TOP_IDS), outputs, strict=True):
        value = ortvalue(array)
        binding.bind_ortvalue_output(name, value)
        keep_alive.append(value)
    return outputs


@dataclass(eq=False)
class Batch:
    """The physical arrays of one encoded batch: ``sentences`` blocks of ``group`` rows."""

    cross: np.ndarray  # (2 · layers, sentences, heads, src_len, d_head): keys at 2i, values at 2i + 1
    src_mask: np.ndarray  # (sentences, src_len) int32, 1 = real token
    group: int = 1  # rows per sentence
    cache: np.ndarray | None = None  # (2 · layers, sentences · group, heads, capacity, d_head), from the first step
    past_len: int = 0
    version: int = 0  # bumped by every step/select: a state of an older version is consumed
    binding: ort.IOBinding | None = None
    bound_k: int = 0  # the k the output arrays are bound for
    # Small per-step inputs, bound once and written in place: (rows,) ids and lengths, scalars.
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seqlens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    total_len: np.ndarray = field(default_factory=lambda: np.zeros((), np.int32))
    outputs: tuple[np.ndarray, ...] = ()  # (rows, k) values and ids
    keep_alive: list[ort.OrtValue] = field(default_factory=list)  # OrtValues the binding refers to

    @property
    def sentences(self) -> int:
        return self.cross.shape[1]

    @property
    def rows(self) -> int:
        return self.sentences * self.group


@dataclass(frozen=True)
class HostState:
    """The search's view of a batch: the physical row behind each of its rows.

    The search's rows come in sentence blocks of ``group``; a block's rows all lie in one physical block
    (they share its cross keys/values), in any order within it.
    """

    batch: Batch
    rows: np.ndarray  # (rows,) physical row of each of the search's rows
    version: int
    identity: bool  # rows == arange(batch.rows): every physical row, in order


@functools.cache
def earlier_than(g: int) -> np.ndarray:
    """(g, g) column j < row i: made once per group size (NumPy's ``tri`` costs more than the step's comparisons)."""
    earlier = np.tri(g, g, -1, dtype=bool)
    earlier.flags.writeable = False
    return earlier


def state_of(batch: Batch, rows: np.ndarray) -> HostState:
    identity = rows.size == batch.rows and bool((rows == np.arange(rows.size)).all())
    return HostState(batch, rows, batch.version, identity)


def keeps_every_block(batch: Batch, slots: np.ndarray) -> bool:
    """``slots`` are the batch's blocks as they lie: a selection of them moves nothing."""
    return slots.size == batch.sentences and bool((slots == np.arange(slots.size)).all())


class HostBuffers:
    """The decoder state of the CPU serving graphs in NumPy buffers: encode, step and select over two sessions whose
    every run has a multiple of ``row_multiple`` rows (tokens in the encoder, physical rows in the decoder)."""

    def __init__(
        self, config: ModelConfig, encoder: ort.InferenceSession, decoder: ort.InferenceSession, row_multiple: int
    ) -> None:
        self.config, self.encoder, self.decoder, self.row_multiple = config, encoder, decoder, row_multiple
        tokens = config.special_tokens
        self.eos_id, self.pad_id = tokens.eos, tokens.pad
        self.n_kv = 2 * config.n_decoder_layers
        self.cross_names, self.cache_names, self.present_names = (
            contract.kv_names(config, prefix) for prefix in ("cross", "cache", "present")
        )

    # -- encoder -----------------------------------------------------------------------------------------

    def start(self, src_ids: np.ndarray) -> HostState:
        batch, src_len = src_ids.shape
        # Unread copies of the first sentence make up the rows: the encoder's (sentences · src_len tokens), then the
        # decoder's (sentences), each a multiple of ``row_multiple``, with the fewest copies the encoder can run.
        step = self.row_multiple // math.gcd(self.row_multiple, src_len)
        encoded, decoded = -(-batch // step) * step, -(-batch // self.row_multiple) * self.row_multiple
        if encoded > batch:
            src_ids = np.concatenate([src_ids, np.repeat(src_ids[:1], encoded - batch, axis=0)])
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)  # (encoded, src_len)
        src_mask = (src_ids != self.pad_id).astype(np.int32)
        cross = np.empty((self.n_kv, encoded, self.config.n_heads, src_len, self.config.d_head), np.float32)
        binding = self.encoder.io_binding()
        values = [ortvalue(src_ids), ortvalue(src_mask), ortvalue(cross)]
        binding.bind_ortvalue_input(contract.SRC_IDS, values[0])
        binding.bind_ortvalue_input(contract.SRC_MASK, values[1])
        binding.bind_ortvalue_output(spec.CROSS_KV, values[2])
        self.encoder.run_with_iobinding(binding)
        if decoded > encoded:
            cross = np.concatenate([cross, np.repeat(cross[:, :1], decoded - encoded, axis=1)], axis=1)
            src_mask = np.concatenate([src_mask, np.repeat(src_mask[:1], decoded - encoded, axis=0)])
        return state_of(Batch(cross, src_mask), np.arange(batch))

    # -- decoder -----------------------------------------------------------------------------------------

    def capacity_for(self, batch: Batch) -> int:
        """Cache positions to allocate: the search's default limit, source length + 50 (it grows if exceeded)."""
        return batch.cross.shape[3] + EXTRA_LEN + 1

    def bind(self, batch: Batch) -> None:
        """Bind every decoder input and the cache outputs of ``batch`` (once per batch, again after compaction)."""
        rows, cfg = batch.rows, self.config
        if batch.cache is None:
            shape = (self.n_kv, rows, cfg.n_heads, self.capacity_for(batch), cfg.d_head)
            batch.cache = np.zeros(shape, np.float32)
        if batch.ids.shape[0] != rows:
            batch.ids = np.full(rows, self.eos_id, np.int64)
            batch.seqlens = np.zeros(rows, np.int32)
        binding = self.decoder.io_binding()
        keep = []

        def bind_input(name: str, array: np.ndarray) -> ort.OrtValue:
            value = ortvalue(array)
            binding.bind_ortvalue_input(name, value)
            keep.append(value)
            return value

        bind_input(contract.TGT_IDS, batch.ids)
        bind_input(spec.SEQLENS_K, batch.seqlens)
        bind_input(spec.TOTAL_LEN, batch.total_len)
        bind_input(spec.GROUP_SHAPE, np.array([batch.sentences, batch.group, cfg.d_model], np.int64))
        bind_input(contract.SRC_MASK, batch.src_mask)
        for name, cross in zip(self.cross_names, batch.cross, strict=True):
            bind_input(name, cross)
        for name, present, cache in zip(self.cache_names, self.present_names, batch.cache, strict=True):
            binding.bind_ortvalue_output(present, bind_input(name, cache))  # the same memory: appended in place
        batch.binding, batch.keep_alive, batch.bound_k = binding, keep, 0

    def bind_outputs(self, batch: Batch, k: int) -> None:
        """(Re)bind the head's outputs for ``k`` best tokens per row."""
        assert batch.binding is not None
        batch.outputs = bind_head(batch.binding, batch.rows, k, batch.keep_alive)
        batch.bound_k = k

    def grow(self, batch: Batch) -> None:
        """Double the cache capacity (a search whose limit exceeds source length + 50), keeping what is cached."""
        assert batch.cache is not None
        old = batch.cache
        shape = list(old.shape)
        shape[3] *= 2
        batch.cache = np.zeros(shape, np.float32)
        batch.cache[:, :, :, : batch.past_len] = old[:, :, :, : batch.past_len]
        self.bind(batch)

    def run_step(self, state: HostState, tgt_ids: np.ndarray, k: int) -> tuple[tuple[np.ndarray, ...], HostState]:
        """Feed ``tgt_ids`` (rows, new_len), one token at a time; the head's outputs for the search's rows."""
        if tgt_ids.ndim != 2 or tgt_ids.shape[0] != state.rows.size:
            raise ValueError(f"tgt_ids must be (rows, new_len) with {state.rows.size} rows, got {tgt_ids.shape}")
        batch = consume(state)
        if batch.binding is None or batch.cache is None:
            self.bind(batch)
        if batch.bound_k != k:
            self.bind_outputs(batch, k)
        for column in range(tgt_ids.shape[1]):
            assert batch.cache is not None and batch.binding is not None
            if batch.past_len + 1 > batch.cache.shape[3]:
                self.grow(batch)
                self.bind_outputs(batch, k)
            if state.identity:
                batch.ids[:] = tgt_ids[:, column]
            else:
                batch.ids[state.rows] = tgt_ids[:, column]  # other rows (finished sentences) run on, unread
            batch.seqlens.fill(batch.past_len)
            batch.total_len.fill(batch.past_len + 1)
            self.decoder.run_with_iobinding(batch.binding)
            batch.past_len += 1
        values, ids = batch.outputs
        outputs = (values.copy(), ids.copy()) if state.identity else (values[state.rows], ids[state.rows])
        return outputs, HostState(batch, state.rows, batch.version, state.identity)

    # -- row selection -----------------------------------------------------------------------------------

    def select(self, state: HostState, rows: np.ndarray) -> HostState:
        rows = np.asarray(rows, dtype=np.int64)
        batch, g = state.batch, state.batch.group
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= state.rows.size)):
            raise ValueError(f"rows must be indices below {state.rows.size}")
        if g == 1 and (group := run_length(rows)) and (group > 1 or batch.cache is None) and distinct(rows[::group]):
            # The beam's k copies of each sentence (after its first step, or before any): regroup.
            consume(state)
            return self.regroup(batch, state.rows[rows[::group]], group)
        sentence = rows // g  # (new rows,) the search's old sentence of each new row
        blocks = sentence.reshape(-1, g) if rows.size % g == 0 else None  # (new sentences, g)
        if blocks is None or not (blocks == blocks[:, :1]).all() or not distinct(blocks[:, 0]):
            return self.gather(state, rows)
        consume(state)
        parents = state.rows[rows]  # (new rows,) physical row holding each new row's past
        if g > 1:
            parents = self.adopt(batch, parents.reshape(-1, g)).reshape(-1)
        slots = parents[::g] // g  # (new sentences,) physical blocks still read
        if 0 < slots.size <= COMPACT_BELOW * batch.sentences:
            return self.compact(batch, self.with_spare_blocks(batch, slots), parents % g)
        return state_of(batch, parents)

    def with_spare_blocks(self, batch: Batch, slots: np.ndarray) -> np.ndarray:
        """``slots`` (physical blocks), then as many others as make the rows a multiple of ``row_multiple`` (they
        run on, unread)."""
        missing = -slots.size % (self.row_multiple // math.gcd(self.row_multiple, batch.group))
        if missing == 0:
            return slots
        spare = np.setdiff1d(np.arange(batch.sentences), slots)[:missing]
        return np.concatenate([slots, spare])

    def adopt(self, batch: Batch, parents: np.ndarray) -> np.ndarray:
        """The beam's reordering within each sentence block, (sentences, g) physical parents → physical rows.

        A parent's first child takes over the parent's row as it is; each further child gets a row whose
        beam left no child, and a copy of its parent's filled cache. No row is read after it is written,
        so the copies need no temporary beyond NumPy's own.
        """
        n, g = parents.shape
        first = ~((parents[:, :, None] == parents[:, None, :]) & earlier_than(g)).any(axis=2)  # (n, g) first child
        if first.all() or batch.cache is None:
            return parents
        base = parents[:, :1] // g * g  # (n, 1) the block's first row
        taken = np.zeros((n, g), dtype=bool)
        taken[np.nonzero(first)[0], (parents - base)[first]] = True
        # Free rows of each block, in order, go to the block's later children, in order (as many of each).
        free = base + np.argsort(taken, axis=1, kind="stable")  # (n, g) free offsets first
        later = ~first
        rank = np.cumsum(later, axis=1) - 1  # (n, g) index of each later child among its block's
        target = parents.copy()
        target[later] = free[later.nonzero()[0], rank[later]]
        t = batch.past_len
        batch.cache[:, target[later], :, :t] = batch.cache[:, parents[later], :, :t]
        return target

    def regroup(self, batch: Batch, physical: np.ndarray, group: int) -> HostState:
        """A batch of one row per sentence → ``group`` rows for each of the rows ``physical``, each a copy of its
        row's filled cache, and rebind."""
        cache = batch.cache
        batch.group, batch.binding = group, None
        slots = self.with_spare_blocks(batch, physical)
        if cache is None:
            return self.compact(batch, slots, np.arange(physical.size * group) % group)
        copies = np.repeat(slots, group)  # (new rows,) the row each copies
        if not keeps_every_block(batch, slots):
            batch.cross = np.ascontiguousarray(batch.cross[:, slots])
            batch.src_mask = np.ascontiguousarray(batch.src_mask[slots])
        batch.cache = np.empty((cache.shape[0], copies.size, *cache.shape[2:]), np.float32)
        batch.cache[:, :, :, : batch.past_len] = cache[:, copies, :, : batch.past_len]
        batch.ids = batch.ids[copies]
        batch.seqlens = np.zeros(copies.size, np.int32)
        self.bind(batch)
        return state_of(batch, np.arange(physical.size * group))

    def compact(self, batch: Batch, slots: np.ndarray, offsets: np.ndarray) -> HostState:
        """Keep the physical blocks ``slots`` only, moved to the front (filled cache only), and rebind.

        ``offsets`` (rows,) is each of the search's rows' place within its block, kept as it is; they are the rows
        of the first ``offsets.size / group`` blocks (any further ones are spares, ``with_spare_blocks``).
        """
        n, g, t = slots.size, batch.group, batch.past_len
        live = offsets.size // g
        rows = (np.arange(live)[:, None] * g + offsets.reshape(live, g)).reshape(-1)
        if keeps_every_block(batch, slots):
            return state_of(batch, rows)  # nothing to move
        batch.cross = np.ascontiguousarray(batch.cross[:, slots])
        batch.src_mask = np.ascontiguousarray(batch.src_mask[slots])
        if batch.cache is not None:
            kept = (slots[:, None] * g + np.arange(g)).reshape(-1)  # whole blocks, in the order of ``slots``
            cache = np.empty((batch.cache.shape[0], n * g, *batch.cache.shape[2:]), np.float32)
            cache[:, :, :, :t] = batch.cache[:, kept, :, :t]
            batch.cache = cache
            batch.ids = batch.ids[kept]
            batch.seqlens = np.zeros(n * g, np.int32)
            self.bind(batch)
        return state_of(batch, rows)

    def gather(self, state: HostState, rows: np.ndarray) -> HostState:
        """Any selection: a fresh batch with one row per sentence (the source side gathered per row)."""
        batch = consume(state)
        physical = state.rows[rows]  # (new rows,)
        if physical.size % self.row_multiple:  # unread copies of the first row make up the rows
            physical = np.concatenate([physical, np.repeat(physical[:1], -physical.size % self.row_multiple)])
        blocks = physical // batch.group
        fresh = Batch(np.ascontiguousarray(batch.cross[:, blocks]), np.ascontiguousarray(batch.src_mask[blocks]))
        fresh.past_len = batch.past_len
        if batch.cache is not None:
            fresh.cache = np.zeros((batch.cache.shape[0], physical.size, *batch.cache.shape[2:]), np.float32)
            fresh.cache[:, :, :, : batch.past_len] = batch.cache[:, physical, :, : batch.past_len]
        return state_of(fresh, np.arange(rows.size))
