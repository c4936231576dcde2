# READY: contract-complete OnnxEngine
"""The ONNX Runtime engine: the exported graphs seen through the search's step interface. NumPy only.

It checks the folder before it runs anything: every file there, the graphs
made from these very weights and this config (hashes in their metadata), and
the names, dtypes and fixed sizes the contract declares (``aiayn.export.contract``).

Devices: ``cpu``; ``cuda`` (an error if no GPU runs the session); ``auto``
(CUDA only where a session really runs on it, else CPU, with ONNX Runtime's
own load errors captured, not shown). On CPU the state is NumPy arrays. On a
GPU it stays on the device between steps: inputs and outputs are bound as
OrtValues (I/O binding), only each row's k best next tokens come back to the host, and
``select`` reorders the cache with a Gather graph on the device (``gather.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from aiayn.export.contract import (
    DECODER_FILE,
    ENCODER_FILE,
    TOP_K_INPUT,
    TOP_K_OUTPUTS,
    GraphSpec,
    decoder_spec,
    encoder_spec,
    serving_decoder_spec,
    variant_file,
)
from aiayn.model.config import CONFIG_FILE, ModelConfig, load_config
from aiayn.model.folder import TOKENIZER_FILE, WEIGHTS_FILE, require_files
from aiayn.serve.gather import gather_model
from aiayn.serve.top_k import with_top_k_head

DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
REEXPORT = "re-export the folder with `aiayn export {folder}`"
ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)", "bool": "tensor(bool)"}
ORT_WARNING, ORT_ERROR = 2, 3  # logger severities: 2 is ONNX Runtime's default
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class DeviceUnavailable(ValueError):
    """``--device cuda`` where ONNX Runtime cannot run on a GPU."""


@dataclass(frozen=True)
class OnnxState:
    """The decoder state on the host (CPU)."""

    src_mask: np.ndarray  # (rows, src_len) bool
    cross: list[np.ndarray]  # per layer key, value: (rows, heads, src_len, d_head)
    past: list[np.ndarray]  # per layer key, value: (rows, heads, past_len, d_head)
    sources: np.ndarray  # (rows,) the encoded sentence behind each row's src_mask and cross

    @property
    def past_len(self) -> int:
        return self.past[0].shape[2]


@dataclass(frozen=True)
class DeviceState:
    """The decoder state as OrtValues on the execution provider's device."""

    src_mask: ort.OrtValue  # (rows, src_len) bool
    cross: list[ort.OrtValue]  # per layer key, value: (rows, heads, src_len, d_head)
    past: list[ort.OrtValue] | None  # per layer key, value: (rows, heads, past_len, d_head); None before step 1
    rows: int
    past_len: int
    sources: np.ndarray  # (rows,) the encoded sentence behind each row's src_mask and cross


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def session_options(threads: int, log_severity: int = ORT_WARNING) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = log_severity
    # Idle threads sleep instead of spinning: with several requests at once on few cores, spinning threads
    # take the cores from the working ones (about half the throughput with 4 concurrent requests on 2 cores).
    # One stream of work gains nothing measurable from per-session spinning either (aiayn bench, 2 cores); a
    # process-wide spinning pool gains a little but makes ONNX Runtime refuse every other session (README, Speed).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


@contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 (ONNX Runtime's logger) instead of showing it."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += ANSI_COLOUR.sub("", sink.read().decode(errors="replace")).splitlines()


def open_session(
    model: Path | bytes,
    providers: list[str],
    threads: int,
    log_severity: int = ORT_WARNING,
    path: Path | None = None,
) -> ort.InferenceSession:
    """A session, with ONNX Runtime's load errors turned into one line that names the file and the fix.

    ``model`` is a file or a serialized graph; ``path`` names the file a serialized graph came from.
    """
    source = model if isinstance(model, bytes) else str(model)
    path = model if isinstance(model, Path) else path
    try:
        return ort.InferenceSession(source, session_options(threads, log_severity), providers=providers)
    except Exception as err:  # ORT's pybind errors (InvalidProtobuf, Fail, ...) derive from Exception only
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if path is None:
            raise ValueError(f"ONNX Runtime cannot load a graph built by aiayn: {reason}") from None
        raise ValueError(f"ONNX Runtime cannot load {path}: {reason}; {REEXPORT.format(folder=path.parent)}") from None


def try_cuda(path: Path, threads: int, model: bytes) -> tuple[ort.InferenceSession | None, str]:
    """A session that really runs on CUDA, or None and why not (from ORT's captured log, never shown raw)."""
    if CUDA not in ort.get_available_providers():
        return None, f"this onnxruntime build has no {CUDA} (install onnxruntime-gpu)"
    ort.set_default_logger_severity(ORT_ERROR)  # the provider bridge logs through the default logger
    try:
        with captured_stderr() as log:
            session = open_session(model, [CUDA, CPU], threads, ORT_ERROR, path)
    except ValueError as err:
        return None, str(err)
    finally:
        ort.set_default_logger_severity(ORT_WARNING)
    if session.get_providers()[0] == CUDA:
        return session, ""
    errors = [line.rsplit("error:", 1)[-1].strip() for line in log if "[E:" in line]
    return None, errors[-1] if errors else "ONNX Runtime fell back to the CPU"


def open_on_device(path: Path, model: bytes, device: str, threads: int) -> ort.InferenceSession:
    """A session of ``model`` (read from ``path``) on ``device``: cpu, cuda (or a DeviceUnavailable error),
    or auto (CUDA if it really runs)."""
    if device != "cpu":
        session, reason = try_cuda(path, threads, model)
        if session is not None:
            return session
        if device == "cuda":
            raise DeviceUnavailable(
                f"--device cuda: ONNX Runtime cannot run {path.name} on a GPU here ({reason}); "
                "use --device cpu, or auto to take the GPU only where it works"
            )
    return open_session(model, [CPU], threads, path=path)


def check_graph(session: ort.InferenceSession, spec: GraphSpec, path: Path) -> None:
    """Names, dtypes, ranks and fixed sizes of every input and output must be the contract's; all gaps listed."""
    problems = []
    for role, actual, wanted in (
        ("input", session.get_inputs(), spec.inputs),
        ("output", session.get_outputs(), spec.outputs),
    ):
        if [a.name for a in actual] != [w.name for w in wanted]:
            problems.append(f"{role}s are {[a.name for a in actual]}, the contract says {[w.name for w in wanted]}")
            continue
        for a, w in zip(actual, wanted, strict=True):
            if a.type != ORT_TYPES[w.dtype]:
                problems.append(f"{role} {a.name} is {a.type}, the contract says {ORT_TYPES[w.dtype]}")
            fixed_ok = all(isinstance(want, str) or got == want for got, want in zip(a.shape, w.shape, strict=False))
            if len(a.shape) != len(w.shape) or not fixed_ok:
                problems.append(f"{role} {a.name} has shape {a.shape}, the contract says {list(w.shape)}")
    if problems:
        raise ValueError(
            f"{path} does not follow this aiayn's ONNX contract: {'; '.join(problems)}; "
            + REEXPORT.format(folder=path.parent)
        )


def check_stamp(session: ort.InferenceSession, config: ModelConfig, weights_sha256: str, path: Path) -> None:
    """The graph must come from this folder's config.json and model.safetensors (hashes in its metadata)."""
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get("aiayn.config_fingerprint") != config.fingerprint():
        raise ValueError(f"{path} was exported from another config.json; {REEXPORT.format(folder=path.parent)}")
    if meta.get("aiayn.weights_sha256") != weights_sha256:
        raise ValueError(
            f"{path} was exported from other weights than {WEIGHTS_FILE} (hash mismatch); "
            + REEXPORT.format(folder=path.parent)
        )


class OnnxEngine:
    """Encoder and decoder sessions of a model folder; implements ``aiayn.search.StepModel`` on host arrays.

    The decoder session runs decoder.onnx with the search's selection head (``top_k.py``).
    """

    name = "onnx"

    def __init__(
        self, config: ModelConfig, encoder: ort.InferenceSession, decoder: ort.InferenceSession, provider: str
    ) -> None:
        self.config = config
        self.encoder, self.decoder = encoder, decoder
        self.provider = provider
        tokens = config.special_tokens
        self.bos_id, self.eos_id, self.pad_id = tokens.bos, tokens.eos, tokens.pad
        self.n_kv = 2 * config.n_decoder_layers
        spec = decoder_spec(config)
        self.cross_names = [t.name for t in spec.inputs[3 : 3 + self.n_kv]]
        self.past_names = [t.name for t in spec.inputs[3 + self.n_kv :]]
        self.present_names = [t.name for t in spec.outputs[1 : 1 + self.n_kv]]
        self.top_names = [t.name for t in TOP_K_OUTPUTS]
        self.vocab_size = config.vocab_size

    @classmethod
    def load(
        cls,
        folder: str | Path,
        device: str = "auto",
        variant: str = "fp32",
        threads: int | None = None,
        io_binding: bool | None = None,
    ) -> OnnxEngine:
        """Open and check a model folder's graphs; ``variant`` picks the fp32, int8 or fp16 files.

        ``threads`` is ONNX Runtime's intra-op thread count per graph (default: the cores, at most 4).
        ``io_binding`` keeps the state on the device (default: on a GPU only; True on CPU runs the same
        code path with host OrtValues, which is how it is tested without a GPU).
        """
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
        folder = Path(folder)
        files = [folder / variant_file(ENCODER_FILE, variant), folder / variant_file(DECODER_FILE, variant)]
        flag = {"fp32": "", "int8": " --quantize int8", "fp16": " --fp16"}[variant]
        fix = REEXPORT.format(folder=folder) + flag
        require_files(folder, [CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, *(f.name for f in files)], fix)
        config = load_config(folder)
        threads = threads or min(4, os.cpu_count() or 1)
        weights_sha256 = file_sha256(folder / WEIGHTS_FILE)
        encoder = open_on_device(files[0], files[0].read_bytes(), device, threads)
        # The decoder follows the encoder: both on CUDA, or both on the CPU.
        decoder_device = "cuda" if encoder.get_providers()[0] == CUDA else "cpu"
        decoder_graph = with_top_k_head(files[1].read_bytes())
        decoder = open_on_device(files[1], decoder_graph, decoder_device, threads)
        for session, spec, path in (
            (encoder, encoder_spec(config), files[0]),
            (decoder, serving_decoder_spec(config), files[1]),
        ):
            check_graph(session, spec, path)
            check_stamp(session, config, weights_sha256, path)
        provider = encoder.get_providers()[0]
        if io_binding or (io_binding is None and provider != CPU):
            return BoundOnnxEngine(config, encoder, decoder, provider, threads)
        return cls(config, encoder, decoder, provider)

    def start(self, src_ids: np.ndarray) -> OnnxState:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        outputs = self.encoder.run(None, {"src_ids": src_ids})  # memory, then cross key/value per layer
        rows, heads, d_head = src_ids.shape[0], self.config.n_heads, self.config.d_head
        empty = np.zeros((rows, heads, 0, d_head), dtype=np.float32)
        return OnnxState(src_ids != self.pad_id, outputs[1:], [empty] * self.n_kv, np.arange(rows))

    def run_decoder(
        self, state: OnnxState, tgt_ids: np.ndarray, outputs: list[str] | None = None, k: int = 1
    ) -> list[np.ndarray]:
        """The decoder's ``outputs`` (default: all, in the serving spec's order) after feeding ``tgt_ids``;
        ``k`` is the selection head's ``top_k``."""
        feeds = {
            "tgt_ids": np.ascontiguousarray(tgt_ids, dtype=np.int64),
            "position_offset": np.array(state.past_len, dtype=np.int64),
            "src_mask": state.src_mask,
            **dict(zip(self.cross_names, state.cross, strict=True)),
            **dict(zip(self.past_names, state.past, strict=True)),
            TOP_K_INPUT.name: np.array([k], dtype=np.int64),
        }
        return self.decoder.run(outputs, feeds)

    def step(self, state: OnnxState, tgt_ids: np.ndarray) -> tuple[np.ndarray, OnnxState]:
        log_probs, *present = self.run_decoder(state, tgt_ids, ["log_probs", *self.present_names])
        return log_probs[:, -1], OnnxState(state.src_mask, state.cross, present, state.sources)  # (rows, vocab)

    def step_top(self, state: OnnxState, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, OnnxState]:
        k = min(k, self.vocab_size)
        values, ids, *present = self.run_decoder(state, tgt_ids, [*self.top_names, *self.present_names], k)
        return values[:, -1], ids[:, -1], OnnxState(state.src_mask, state.cross, present, state.sources)  # (rows, k)

    def select(self, state: OnnxState, rows: np.ndarray) -> OnnxState:
        sources = state.sources[rows]
        past = [t[rows] for t in state.past]
        if np.array_equal(sources, state.sources):
            # Each row keeps its sentence (a beam reordered within its sentence): the source side is unchanged.
            return OnnxState(state.src_mask, state.cross, past, sources)
        return OnnxState(state.src_mask[rows], [t[rows] for t in state.cross], past, sources)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output: (batch, heads, out_len, src_len)."""
        return self.run_decoder(self.start(src_ids), out_ids, ["cross_attention"])[0]


class BoundOnnxEngine(OnnxEngine):
    """The same engine with its state on the device between steps (ONNX Runtime I/O binding with OrtValues).

    Per step only ``tgt_ids`` and ``position_offset`` go to the device and only the k best tokens come back;
    the cross and self-attention keys/values never leave it, and ``select`` gathers their rows there.
    """

    def __init__(
        self,
        config: ModelConfig,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        provider: str,
        threads: int,
    ) -> None:
        super().__init__(config, encoder, decoder, provider)
        self.device = "cuda" if provider == CUDA else "cpu"  # OrtValue device type of the state
        self.cross_outputs = [o.name for o in encoder.get_outputs()[1:]]  # memory itself is not needed
        # Gather graphs for the source side (mask, cross), the cache (past), and both.
        mask, kv = [("bool", 2)], [("float32", 4)] * self.n_kv
        self.gather = {
            name: open_session(gather_model(tensors), [provider], threads)
            for name, tensors in (("source", mask + kv), ("past", kv), ("both", mask + kv + kv))
        }

    def start(self, src_ids: np.ndarray) -> DeviceState:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src_ids", src_ids)
        for name in self.cross_outputs:
            binding.bind_output(name, self.device)  # ORT allocates them on the device
        self.encoder.run_with_iobinding(binding)
        src_mask = ort.OrtValue.ortvalue_from_numpy(src_ids != self.pad_id, self.device)
        rows = src_ids.shape[0]
        return DeviceState(src_mask, binding.get_outputs(), None, rows, 0, np.arange(rows))

    def bind_decoder(self, state: DeviceState, tgt_ids: np.ndarray, k: int = 1) -> ort.IOBinding:
        binding = self.decoder.io_binding()
        binding.bind_cpu_input("tgt_ids", np.ascontiguousarray(tgt_ids, dtype=np.int64))
        binding.bind_cpu_input("position_offset", np.array(state.past_len, dtype=np.int64))
        binding.bind_cpu_input(TOP_K_INPUT.name, np.array([k], dtype=np.int64))
        binding.bind_ortvalue_input("src_mask", state.src_mask)
        for name, value in zip(self.cross_names, state.cross, strict=True):
            binding.bind_ortvalue_input(name, value)
        if state.past is None:  # nothing cached yet: empty (rows, heads, 0, d_head) arrays
            empty = np.zeros((state.rows, self.config.n_heads, 0, self.config.d_head), dtype=np.float32)
            for name in self.past_names:
                binding.bind_cpu_input(name, empty)
        else:
            for name, value in zip(self.past_names, state.past, strict=True):
                binding.bind_ortvalue_input(name, value)
        return binding

    def run_step(
        self, state: DeviceState, tgt_ids: np.ndarray, host_outputs: list[str], k: int = 1
    ) -> tuple[list[np.ndarray], DeviceState]:
        """Run one step: ``host_outputs`` come back as NumPy arrays, the present keys/values stay on the device."""
        binding = self.bind_decoder(state, tgt_ids, k)
        for name in host_outputs:
            binding.bind_output(name, "cpu")
        for name in self.present_names:
            binding.bind_output(name, self.device)
        self.decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        present = outputs[len(host_outputs) :]
        new_len = tgt_ids.shape[1]
        past_len = state.past_len + new_len
        next_state = DeviceState(state.src_mask, state.cross, present, state.rows, past_len, state.sources)
        return [value.numpy()[:, -1] for value in outputs[: len(host_outputs)]], next_state

    def step(self, state: DeviceState, tgt_ids: np.ndarray) -> tuple[np.ndarray, DeviceState]:
        (log_probs,), next_state = self.run_step(state, tgt_ids, ["log_probs"])
        return log_probs, next_state  # (rows, vocab)

    def step_top(self, state: DeviceState, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, DeviceState]:
        (values, ids), next_state = self.run_step(state, tgt_ids, self.top_names, min(k, self.vocab_size))
        return values, ids, next_state  # (rows, k) each

    def gather_rows(self, graph: str, values: list[ort.OrtValue], rows: np.ndarray) -> list[ort.OrtValue]:
        """``value[rows]`` for each of ``values``, on the device, by one of the Gather graphs."""
        session = self.gather[graph]
        binding = session.io_binding()
        for i, value in enumerate(values):
            binding.bind_ortvalue_input(f"data_{i}", value)
            binding.bind_output(f"out_{i}", self.device)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    def select(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        sources = state.sources[rows]
        if state.past is None:
            src_mask, *cross = self.gather_rows("source", [state.src_mask, *state.cross], rows)
            return DeviceState(src_mask, cross, None, len(rows), state.past_len, sources)
        if np.array_equal(sources, state.sources):
            # Each row keeps its sentence (a beam reordered within its sentence): the source side is unchanged.
            past = self.gather_rows("past", state.past, rows)
            return DeviceState(state.src_mask, state.cross, past, len(rows), state.past_len, sources)
        src_mask, *kv = self.gather_rows("both", [state.src_mask, *state.cross, *state.past], rows)
        return DeviceState(src_mask, kv[: self.n_kv], kv[self.n_kv :], len(rows), state.past_len, sources)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        binding = self.bind_decoder(self.start(src_ids), out_ids)
        binding.bind_output("cross_attention", "cpu")
        self.decoder.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()
