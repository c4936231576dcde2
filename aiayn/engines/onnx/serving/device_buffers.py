"""The serving engine's state in the device's memory: what ``--engine onnx`` keeps on a GPU, where each decoding step
is one CUDA graph that ONNX Runtime captured once and replays.

A step of a small model is some hundred kernels of a few microseconds each: launched one by one from the host, their
launches cost more than their arithmetic. ONNX Runtime's CUDA provider can capture a run as a CUDA graph and replay it
in one launch (``enable_cuda_graph``, one graph per ``gpu_graph_id``), if every input and output stays at the address it
had when captured and no kernel reads a changing value from host memory. So:

- a batch's shapes are padded to a bucket (``Shapes``: sentences to a power of two, source length to a multiple of
  16, the cache to 16 positions, doubled each time it fills), so that a few graphs serve a whole file;
- the large tensors (every decoder layer's cross keys/values, the self-attention cache in one of two buffers) live in
  a ``Workspace`` of device buffers, kept at the largest size asked so far, every batch's tensors starting at their
  first byte; the small ones (token ids, positions, the source mask, the parents of the beam's rows, the head's
  outputs) in OrtValues of each bucket (``Step``), written between runs through ONNX Runtime (``update_inplace``);
- the positions are on the device (``seqlens_k``; the graphs scatter the new key/value there and mask the rest:
  ``graphs.scattered_attention``), and the only inputs a kernel reads from host memory, the sentence groups'
  shape and the head's k, are fixed per graph (``spec.HOST_READ``);
- the beam's reordering gathers the cache's rows by their parents from one cache buffer into the other, in a graph of
  its own, captured too; a cache that fills is padded on the device from one buffer into the other (a Pad node); a
  sentence that finishes is just no longer read (``DeviceState.blocks``). Both move only the positions the batch has
  reached, at most twice as many: the cache costs what CTranslate2's growing cache costs, not the search's limit.

A bucket's first run is an ordinary one (ONNX Runtime's arena grows to its shapes: nothing may be allocated while a
graph is captured), its second captures its graph, every later one replays it. A workspace that grows moves its
buffers: the graphs captured over the old ones are never replayed again (``Workspace.generation``).

Selections the searches never make (rows of several sentences mixed, sentences in a new order before the first step)
go by way of the host: rare, and the graphs of the new shapes are captured anew.

It runs wherever ONNX Runtime has kernels for the device's ops: the CUDA graphs also run on the CPU provider, which is
how they are proven without a GPU, under CUDA's binding and capture rules (``tests/conftest.py``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnxruntime as ort

from aiayn.core import contract
from aiayn.core.config import ModelConfig
from aiayn.engines.onnx.serving import spec
from aiayn.engines.onnx.serving.graph_builder import positions_length
from aiayn.engines.onnx.serving.rows import consume, distinct, run_length
from aiayn.engines.onnx.tiny_graphs import INDICES, PADS

SRC_LEN_MULTIPLE = 16
CROSS, CACHES = "cross", ("cache_a", "cache_b")  # the workspace's buffers; a batch's cache is in one of the two
FIRST_CAPACITY = 16  # cache positions of a batch's first step: doubled, on the device, each time it fills
GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run option: which captured graph a run captures or replays
ORDINARY = "-1"  # ... none: an ordinary run


@dataclass(frozen=True)
class Shapes:
    """A bucket: the padded shapes of a batch's decoder inputs and outputs, one captured graph each (per cache buffer
    and head's k)."""

    sentences: int
    group: int  # rows per sentence
    src_len: int
    capacity: int  # cache positions: what the steps so far needed, doubled each time it filled

    @property
    def rows(self) -> int:
        return self.sentences * self.group

    def cross(self, config: ModelConfig) -> list[int]:
        return [2 * config.n_decoder_layers, self.sentences, config.n_heads, self.src_len, config.d_head]

    def cache(self, config: ModelConfig) -> list[int]:
        return [2 * config.n_decoder_layers, self.rows, config.n_heads, self.capacity, config.d_head]

    def regrouped(self, sentences: int, group: int) -> Shapes:
        return Shapes(bucket_of(sentences), group, self.src_len, self.capacity)


def bucket_of(sentences: int) -> int:
    """Sentences padded to a power of two."""
    return 1 << max(sentences - 1, 0).bit_length()


def shapes_for(config: ModelConfig, sentences: int, src_len: int) -> Shapes:
    """A new batch's bucket."""
    padded = -(-src_len // SRC_LEN_MULTIPLE) * SRC_LEN_MULTIPLE
    return Shapes(bucket_of(sentences), 1, padded, min(FIRST_CAPACITY, positions_length(config)))


def numel(shape: list[int]) -> int:
    return math.prod(shape)


class Workspace:
    """Device buffers kept at the largest size asked so far; every batch's tensor starts at its buffer's first byte,
    so a graph captured over one batch finds its inputs there for every later batch of its shapes."""

    def __init__(self, device: str, dtype: np.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.buffers: dict[str, ort.OrtValue] = {}
        self.generation = 0  # bumped whenever a buffer moves: graphs captured before are never replayed

    def fit(self, sizes: dict[str, int]) -> None:
        """Each buffer of ``sizes`` (elements) at least that large, its content kept, a new one zeroed: a cache
        position is never NaN, so that a masked one weighs exactly 0."""
        for role, size in sizes.items():
            buffer = self.buffers.get(role)
            if buffer is not None and buffer.shape()[0] >= size:
                continue
            content = np.zeros(size, self.dtype)
            if buffer is not None:
                old = buffer.numpy()
                content[: old.size] = old
            self.buffers[role] = ort.OrtValue.ortvalue_from_shape_and_type([size], self.dtype.type, self.device, 0)
            self.buffers[role].update_inplace(content)
            self.generation += 1

    def address(self, role: str) -> int:
        return int(self.buffers[role].data_ptr())

    def read(self, role: str, shape: list[int]) -> np.ndarray:
        """A copy of the tensor of ``shape`` at the start of ``role``'s buffer, by way of the host."""
        return np.array(self.buffers[role].numpy()[: numel(shape)].reshape(shape))

    def write(self, role: str, array: np.ndarray) -> None:
        """``array`` to the start of ``role``'s buffer (fitted first), by way of the host."""
        self.fit({role: array.size})
        content = np.array(self.buffers[role].numpy())
        content[: array.size] = array.reshape(-1)
        self.buffers[role].update_inplace(content)

    def sizes(self, config: ModelConfig, shapes: Shapes, caches: tuple[str, ...] = ()) -> dict[str, int]:
        """What a batch of ``shapes`` needs: its cross keys/values, and the cache buffers ``caches``."""
        return {CROSS: numel(shapes.cross(config)), **{role: numel(shapes.cache(config)) for role in caches}}


@dataclass(eq=False)
class Step:
    """One bucket's small device inputs and outputs, and its IOBindings: bound once, written between runs."""

    ids: ort.OrtValue  # (rows,) int64 the step's tokens
    seqlens: ort.OrtValue  # (rows,) int32 each row's position
    src_mask: ort.OrtValue  # (sentences, src_len) int32
    parents: ort.OrtValue  # (rows,) int64 the beam's reordering: each row's parent row
    group_shape: np.ndarray  # [sentences, rows per sentence, d_model], read from host memory
    mask_of: DeviceBatch | None = None  # the batch whose source mask ``src_mask`` holds
    outputs: dict[int, tuple[ort.OrtValue, ort.OrtValue]] = field(default_factory=dict)  # by k: (rows, k) each
    top_k: dict[int, np.ndarray] = field(default_factory=dict)  # by k, read from host memory: kept alive
    bindings: dict[tuple[str, int, int], ort.IOBinding] = field(default_factory=dict)  # (graph, cache buffer, k)


@dataclass(eq=False)
class DeviceBatch:
    """One encoded batch in the workspace: ``shapes.sentences`` blocks of ``shapes.group`` rows (the padding ones
    never read); its row r is the search's row r until sentences leave."""

    shapes: Shapes
    src_mask: np.ndarray  # (sentences, src_len) int32, 1 = real token, padded as ``shapes``
    ids: np.ndarray  # (rows,) int64 the step's tokens, on the host
    cache: int = 0  # which of ``CACHES`` holds its cache
    cached: bool = False  # from its first step
    past_len: int = 0
    version: int = 0  # bumped by every step: a state of an older version is consumed

    @property
    def group(self) -> int:
        return self.shapes.group


@dataclass(frozen=True)
class DeviceState:
    """The search's view of a batch: its sentence s is the batch's block ``blocks[s]``."""

    batch: DeviceBatch
    version: int
    blocks: np.ndarray  # (search sentences,) physical block of each

    @cached_property
    def rows(self) -> np.ndarray:
        """(search rows,) the physical row of each."""
        g = self.batch.group
        return (self.blocks[:, None] * g + np.arange(g)).reshape(-1)


def fresh_state(batch: DeviceBatch, sentences: int) -> DeviceState:
    return DeviceState(batch, batch.version, np.arange(sentences))


class DeviceBuffers:
    """The decoder state of the CUDA serving graphs in the device's memory, each step (and each reordering of the
    beam's rows) a captured graph's replay where the sessions capture (``sessions.open_on_device``)."""

    def __init__(
        self,
        config: ModelConfig,
        ops: spec.ServingOps,
        device: str,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        reorder: ort.InferenceSession,
        widening: ort.InferenceSession,
    ) -> None:
        self.config = config
        self.encoder, self.decoder, self.reorder, self.widening = encoder, decoder, reorder, widening
        self.device = device  # where the sessions run: the OrtValues' device
        self.dtype = np.dtype(ops.dtype)
        tokens = config.special_tokens
        self.eos_id, self.pad_id = tokens.eos, tokens.pad
        self.cross_names, self.cache_names, self.present_names = (
            contract.kv_names(config, prefix) for prefix in ("cross", "cache", "present")
        )
        self.workspace = Workspace(self.device, self.dtype)
        self.steps: dict[tuple[int, Shapes], Step] = {}  # by (workspace generation, bucket)
        self.graphs: dict[tuple[object, ...], ort.RunOptions] = {}  # by run: its gpu_graph_id, once it has run
        self.runs: dict[tuple[object, ...], int] = {}
        self.last_graph_id = 0  # ids from 1: 0 is ONNX Runtime's default
        self.ordinary = run_options(ORDINARY)
        self.owner: DeviceBatch | None = None  # the batch whose tensors the workspace holds
        self.uncaptured = ""  # why a run is an ordinary one, where the device refused to capture its graph

    # -- runs ----------------------------------------------------------------------------------------------

    def run(self, session: ort.InferenceSession, binding: ort.IOBinding, key: tuple[object, ...]) -> None:
        """``binding``'s run of ``session``: ordinary the first time ``key`` runs, then its own captured graph (an
        ordinary run again, from then on, where the device refused to capture it: said once, in one line)."""
        options = self.graphs.get(key)
        if options is None:
            self.last_graph_id += 1
            self.graphs[key] = run_options(str(self.last_graph_id))
            options = self.ordinary
        try:
            session.run_with_iobinding(binding, options)
        except Exception as err:  # ORT's pybind errors derive from Exception only
            if options is self.ordinary:
                raise
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            if not self.uncaptured:
                print(f"the serving engine runs a step without its CUDA graph: {reason}", file=sys.stderr)
            self.uncaptured, self.graphs[key] = reason, self.ordinary
            session.run_with_iobinding(binding, self.ordinary)
        self.runs[key] = self.runs.get(key, 0) + 1

    def release_stale_graphs(self) -> None:
        """The graphs captured over buffers the workspace has since moved, released with what ONNX Runtime keeps for
        them: they are never replayed again."""
        sessions = {"decode": self.decoder, "reorder": self.reorder}
        for key in [key for key in self.graphs if key[1] != self.workspace.generation]:
            options = self.graphs.pop(key)
            if self.runs.pop(key, 0) > 1 and options is not self.ordinary:
                sessions[str(key[0])].release_captured_graph(int(options.get_run_config_entry(GRAPH_ID)))

    @property
    def captured(self) -> int:
        """The graphs held captured: a run's second time captures its graph."""
        return sum(1 for key, runs in self.runs.items() if runs > 1 and self.graphs[key] is not self.ordinary)

    # -- encoder -------------------------------------------------------------------------------------------

    def start(self, src_ids: np.ndarray) -> DeviceState:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)  # (batch, src_len)
        n, length = src_ids.shape
        shapes = shapes_for(self.config, n, length)
        padded = np.full((shapes.sentences, shapes.src_len), self.pad_id, np.int64)
        padded[:n, :length] = src_ids
        padded[n:, 0] = self.eos_id  # a padding sentence is an empty one: never a row with nothing to attend to
        src_mask = (padded != self.pad_id).astype(np.int32)
        batch = DeviceBatch(shapes, src_mask, np.full(shapes.rows, self.eos_id, np.int64))
        self.workspace.fit(self.workspace.sizes(self.config, shapes))
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(contract.SRC_IDS, padded)
        binding.bind_cpu_input(contract.SRC_MASK, src_mask)
        self.bind_at(binding.bind_output, spec.CROSS_KV, CROSS, shapes.cross(self.config))
        self.encoder.run_with_iobinding(binding)
        self.owner = batch
        return fresh_state(batch, n)

    def owned(self, batch: DeviceBatch) -> DeviceBatch:
        if batch is not self.owner:
            raise ValueError(
                "this decoder state's batch has left the device: a newer batch was started on this engine, "
                "and one engine on a GPU decodes one batch at a time"
            )
        return batch

    # -- decoder -------------------------------------------------------------------------------------------

    def step_of(self, batch: DeviceBatch, caches: tuple[str, ...] = ()) -> Step:
        """The bucket's inputs, outputs and bindings (made on its first use in this workspace), holding the batch's
        source mask; the workspace fitted to its cross keys/values, its cache and ``caches``."""
        own = (CACHES[batch.cache],) if batch.cached else ()
        self.workspace.fit(self.workspace.sizes(self.config, batch.shapes, own + caches))
        key = (self.workspace.generation, batch.shapes)
        if key not in self.steps:
            shapes, device = batch.shapes, self.device
            self.steps = {k: v for k, v in self.steps.items() if k[0] == self.workspace.generation}
            self.release_stale_graphs()
            self.steps[key] = Step(
                ids=ort.OrtValue.ortvalue_from_shape_and_type([shapes.rows], np.int64, device, 0),
                seqlens=ort.OrtValue.ortvalue_from_shape_and_type([shapes.rows], np.int32, device, 0),
                src_mask=ort.OrtValue.ortvalue_from_shape_and_type(
                    [shapes.sentences, shapes.src_len], np.int32, device, 0
                ),
                parents=ort.OrtValue.ortvalue_from_shape_and_type([shapes.rows], np.int64, device, 0),
                group_shape=np.array([shapes.sentences, shapes.group, self.config.d_model], np.int64),
            )
        step = self.steps[key]
        if step.mask_of is not batch:
            step.src_mask.update_inplace(batch.src_mask)
            step.mask_of = batch
        return step

    def bind_at(self, bind: Any, name: str, role: str, shape: list[int], offset: int = 0) -> None:
        """``bind`` (an IOBinding's ``bind_input`` or ``bind_output``) ``name`` to the tensor of ``shape`` at
        ``offset`` bytes into ``role``'s buffer."""
        bind(name, self.device, 0, self.dtype.type, shape, self.workspace.address(role) + offset)

    def bind_slices(
        self, binding: ort.IOBinding, role: str, shape: list[int], names: list[str], out: list[str]
    ) -> None:
        """Bind slice i (along the first axis) of the tensor of ``shape`` at ``role``'s buffer as input ``names[i]``
        and, where ``out`` names one, as that output too (the same memory: written in place)."""
        part = shape[1:]
        part_bytes = numel(part) * self.dtype.itemsize
        for i, name in enumerate(names):
            self.bind_at(binding.bind_input, name, role, part, i * part_bytes)
            if out:
                self.bind_at(binding.bind_output, out[i], role, part, i * part_bytes)

    def decoding(self, step: Step, shapes: Shapes, cache: int, k: int) -> ort.IOBinding:
        """The decoder's binding for a bucket, over cache buffer ``cache``, with the head's ``k``."""
        key = ("decode", cache, k)
        if key in step.bindings:
            return step.bindings[key]
        binding = self.decoder.io_binding()
        for name, value in (
            (contract.TGT_IDS, step.ids),
            (spec.SEQLENS_K, step.seqlens),
            (contract.SRC_MASK, step.src_mask),
        ):
            binding.bind_ortvalue_input(name, value)
        binding.bind_cpu_input(spec.GROUP_SHAPE, step.group_shape)
        step.top_k[k] = np.array([k], np.int64)
        binding.bind_cpu_input(contract.TOP_K, step.top_k[k])
        self.bind_slices(binding, CROSS, shapes.cross(self.config), self.cross_names, [])
        self.bind_slices(binding, CACHES[cache], shapes.cache(self.config), self.cache_names, self.present_names)
        if k not in step.outputs:
            step.outputs[k] = (
                ort.OrtValue.ortvalue_from_shape_and_type([shapes.rows, k], np.float32, self.device, 0),
                ort.OrtValue.ortvalue_from_shape_and_type([shapes.rows, k], np.int64, self.device, 0),
            )
        for name, value in zip((contract.TOP_LOG_PROBS, contract.TOP_IDS), step.outputs[k], strict=True):
            binding.bind_ortvalue_output(name, value)
        step.bindings[key] = binding
        return binding

    def run_step(self, state: DeviceState, tgt_ids: np.ndarray, k: int) -> tuple[tuple[np.ndarray, ...], DeviceState]:
        """Feed ``tgt_ids`` (rows, new_len), one token at a time; the head's outputs for the search's rows."""
        batch = self.owned(consume(state))
        rows = state.rows
        if tgt_ids.ndim != 2 or tgt_ids.shape[0] != rows.size:
            raise ValueError(f"tgt_ids must be (rows, new_len) with {rows.size} rows, got {tgt_ids.shape}")
        if tgt_ids.shape[1] < 1:
            raise ValueError("tgt_ids must hold at least one token per row")
        for column in range(tgt_ids.shape[1]):
            if batch.past_len + 1 > batch.shapes.capacity:
                self.widen(batch)
            batch.cached = True
            step = self.step_of(batch)
            batch.ids[rows] = tgt_ids[:, column]  # other rows (padding, finished sentences) run on, unread
            step.ids.update_inplace(batch.ids)
            step.seqlens.update_inplace(np.full(batch.shapes.rows, batch.past_len, np.int32))
            binding = self.decoding(step, batch.shapes, batch.cache, k)
            self.run(self.decoder, binding, ("decode", self.workspace.generation, batch.shapes, batch.cache, k))
            batch.past_len += 1
        # numpy() copies from a GPU but is a view of host memory the next step overwrites: a copy either way
        outputs = tuple(out.numpy()[rows] for out in step.outputs[k])
        return outputs, DeviceState(batch, batch.version, state.blocks)

    def widen(self, batch: DeviceBatch) -> None:
        """Twice the cache positions, the cache moved on the device from its buffer into the other by one Pad: an
        ordinary run, a few times a batch."""
        old, limit = batch.shapes, positions_length(self.config)
        if old.capacity >= limit:
            raise ValueError(f"a translation cannot run past {limit} tokens, the positions this model has")
        new = Shapes(old.sentences, old.group, old.src_len, min(2 * old.capacity, limit))
        source, target = CACHES[batch.cache], CACHES[1 - batch.cache]
        self.workspace.fit(self.workspace.sizes(self.config, new, (source, target)))
        pads = np.zeros(10, np.int64)
        pads[5 + 3] = new.capacity - old.capacity  # after the positions (axis 3) of the old cache
        binding = self.widening.io_binding()
        self.bind_at(binding.bind_input, "data", source, old.cache(self.config))
        self.bind_at(binding.bind_output, "out", target, new.cache(self.config))
        binding.bind_cpu_input(PADS, pads)
        self.widening.run_with_iobinding(binding)
        batch.shapes, batch.cache = new, 1 - batch.cache

    # -- row selection -------------------------------------------------------------------------------------

    def select(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        """The search's new rows, ``rows`` of the old ones: within sentence blocks, by one captured gather of the
        cache's rows; sentences that leave, by the state's map of blocks alone; anything else by way of the host."""
        rows = np.asarray(rows, dtype=np.int64)
        batch = self.owned(consume(state))
        g = batch.group
        n = state.blocks.size * g
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= n)):
            raise ValueError(f"rows must be indices below {n}")
        if g == 1 and (k := run_length(rows)) and (k > 1 or not batch.cached) and distinct(rows[::k]):
            # The beam's k copies of each sentence, after its first step (each copying its row's history) or before.
            return self.regrouped(batch, state.blocks[rows[::k]], k, state.rows[rows] if batch.cached else None)
        of = (rows // g).reshape(-1, g) if rows.size % g == 0 else None  # (new sentences, g) each row's old sentence
        if of is None or not (of == of[:, :1]).all() or not distinct(of[:, 0]):
            return self.regrouped(batch, state.rows[rows] // g, 1, state.rows[rows])
        read = state.blocks[of[:, 0]]  # (new sentences,) the physical blocks still read
        if batch.cached:
            parents = np.arange(batch.shapes.rows)
            parents[(read[:, None] * g + np.arange(g)).reshape(-1)] = state.rows[rows]
            if not (parents == np.arange(parents.size)).all():
                self.reordered(batch, parents)
        return DeviceState(batch, batch.version, read)

    def reordered(self, batch: DeviceBatch, parents: np.ndarray) -> None:
        """Each row of the cache takes its parent's history: one Gather from the batch's cache buffer into the other,
        which holds the batch from then on."""
        source, target = batch.cache, 1 - batch.cache
        step = self.step_of(batch, (CACHES[target],))
        step.parents.update_inplace(parents)
        key = ("reorder", source, 0)
        if key not in step.bindings:
            binding = self.reorder.io_binding()
            shape = batch.shapes.cache(self.config)
            self.bind_at(binding.bind_input, "data_0", CACHES[source], shape)
            self.bind_at(binding.bind_output, "out_0", CACHES[target], shape)
            binding.bind_ortvalue_input(INDICES, step.parents)
            step.bindings[key] = binding
        self.run(self.reorder, step.bindings[key], ("reorder", self.workspace.generation, batch.shapes, source))
        batch.cache = target

    def regrouped(
        self, batch: DeviceBatch, sentences: np.ndarray, group: int, rows: np.ndarray | None = None
    ) -> DeviceState:
        """A batch of ``group`` rows for each of ``sentences`` (old blocks) over the old ``rows``' histories (a row
        each; none before the first step). Where the blocks keep their places (the beam's start) nothing
        moves; else the cross keys/values and the cache move by way of the host."""
        n = sentences.size
        shapes = batch.shapes.regrouped(n, group)
        in_place = shapes.sentences == batch.shapes.sentences and bool((sentences == np.arange(n)).all())
        picked = np.zeros(shapes.sentences, np.int64)  # padding blocks: copies of the first
        picked[:n] = sentences
        src_mask = batch.src_mask if in_place else np.ascontiguousarray(batch.src_mask[picked])
        fresh = DeviceBatch(shapes, src_mask, np.full(shapes.rows, self.eos_id, np.int64), past_len=batch.past_len)
        if not in_place:
            cross = self.workspace.read(CROSS, batch.shapes.cross(self.config))
            self.workspace.write(CROSS, np.ascontiguousarray(cross[:, picked]))
        if batch.cached:
            assert rows is not None  # a cached batch regroups over each new row's old row
            old_rows = np.zeros(shapes.rows, np.int64)
            old_rows[: rows.size] = rows
            cache = self.workspace.read(CACHES[batch.cache], batch.shapes.cache(self.config))
            self.workspace.write(CACHES[fresh.cache], np.ascontiguousarray(cache[:, old_rows]))
            fresh.cached = True
        self.owner = fresh
        return fresh_state(fresh, n)


def run_options(graph_id: str) -> ort.RunOptions:
    options = ort.RunOptions()
    options.add_run_config_entry(GRAPH_ID, graph_id)
    return options
