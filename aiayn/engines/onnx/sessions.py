"""ONNX Runtime sessions for a model folder's graphs: options, devices, and the checks before a run.

Devices: whether ONNX Runtime really runs a session on a GPU here is probed (``gpu_unavailable``, for the placement,
``aiayn.engines.load.place``), with ONNX Runtime's own load errors captured, not shown; a session is then opened where
the placement says: on the CPU, or on the GPU or not at all (``DeviceUnavailable``). Every graph is checked against the
contract (names, dtypes, fixed sizes) and against the folder it sits in (the
hashes of the config and weights it was exported from).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnxruntime as ort

from aiayn.core.config import ModelConfig
from aiayn.core.contract import CONFIG_FINGERPRINT_KEY, WEIGHTS_SHA256_KEY, GraphSpec
from aiayn.core.folder import WEIGHTS_FILE
from aiayn.engines.onnx.tiny_graphs import gather_model
from aiayn.engines.placement import Placement

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
REEXPORT = "re-export the folder with `aiayn export {folder}`"
ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "bool": "tensor(bool)",
}
ORT_WARNING, ORT_ERROR = 2, 3  # logger severities: 2 is ONNX Runtime's default
# fp32 stays fp32 on a GPU: the CUDA provider would otherwise run fp32 matrix products in TF32 (10-bit
# mantissas) on Ampere and newer GPUs, and the CUDA engine could not give the CPU engine's very outputs. Its memory
# arena grows by what is asked, not to the next power of two (the first GPU run held 4.3× CTranslate2's memory).
CUDA_OPTIONS = {"use_tf32": "0", "arena_extend_strategy": "kSameAsRequested"}
# A session whose runs ONNX Runtime may capture as CUDA graphs and replay (``gpu_graph_id``; device_buffers.py).
CUDA_GRAPHS = {**CUDA_OPTIONS, "enable_cuda_graph": "1"}
Providers = list[str | tuple[str, dict[str, str]]]  # names, or (name, provider options)
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class DeviceUnavailable(ValueError):
    """``--device cuda`` where ONNX Runtime cannot run on a GPU."""


def session_options(threads: int, log_severity: int = ORT_WARNING, profile_prefix: str = "") -> ort.SessionOptions:
    """``profile_prefix``: ONNX Runtime's profiler on, its JSON trace written to a file of that prefix when the
    session's ``end_profiling`` is called (``aiayn bench --profile``)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = log_severity
    # Idle threads sleep instead of spinning: with several requests at once on few cores, spinning threads
    # take the cores from the working ones. One stream of work gains nothing measurable from per-session spinning
    # either; a process-wide spinning pool gains a little but makes ONNX Runtime refuse every other session
    # (docs/speed.md has the figures).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No CPU memory arena: the arena keeps, for the life of the session, room for the largest tensors any batch
    # needed, where malloc hands freed memory back (docs/speed.md, Memory).
    options.enable_cpu_mem_arena = False
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def inference_session(model: Path | bytes, options: ort.SessionOptions, providers: Providers) -> ort.InferenceSession:
    """A session of a graph file, or of a serialized graph by way of a temporary file.

    ONNX Runtime's Python session keeps the bytes it is built from for as long as it lives, only to rebuild itself
    should its providers change, which nothing here asks; built from a file it keeps the path alone. So a
    serialized graph (the contract's decoder with its TopK head, a Gather graph) is written out first.
    """
    if isinstance(model, bytes):
        with tempfile.TemporaryDirectory(prefix="aiayn-graph-") as directory:
            path = Path(directory) / "graph.onnx"
            path.write_bytes(model)
            return inference_session(path, options, providers)
    return ort.InferenceSession(str(model), options, providers=providers)


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
    providers: Providers,
    threads: int,
    log_severity: int = ORT_WARNING,
    path: Path | None = None,
    profile_prefix: str = "",
) -> ort.InferenceSession:
    """A session, with ONNX Runtime's load errors turned into one line that names the file and the fix.

    ``model`` is a file or a serialized graph; ``path`` names the model folder's file it came from, if any (else
    aiayn built it); ``profile_prefix`` turns ONNX Runtime's profiler on (``session_options``).
    """
    try:
        return inference_session(model, session_options(threads, log_severity, profile_prefix), providers)
    except Exception as err:  # ORT's pybind errors (InvalidProtobuf, Fail, ...) derive from Exception only
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if path is None:
            raise ValueError(f"ONNX Runtime cannot load a graph built by aiayn: {reason}") from None
        raise ValueError(f"ONNX Runtime cannot load {path}: {reason}; {REEXPORT.format(folder=path.parent)}") from None


def try_cuda(
    path: Path | None, threads: int, model: Path | bytes, options: dict[str, str] = CUDA_OPTIONS
) -> tuple[ort.InferenceSession | None, str]:
    """A session that really runs on CUDA with the provider's ``options``, or None and why not (from ORT's captured
    log, never shown raw); ``path`` names the file ``model`` came from, if any."""
    ort.set_default_logger_severity(ORT_ERROR)  # the provider bridge logs through the default logger
    try:
        with captured_stderr() as log:
            session = open_session(model, [(CUDA, options), CPU], threads, ORT_ERROR, path)
    except ValueError as err:
        return None, str(err)
    finally:
        ort.set_default_logger_severity(ORT_WARNING)
    if session.get_providers()[0] == CUDA:
        return session, ""
    errors = [line.rsplit("error:", 1)[-1].strip() for line in log if "[E:" in line]
    providers = ", ".join(ort.get_available_providers())  # without CUDA's: the build of onnxruntime without a GPU
    return None, errors[-1] if errors else f"ONNX Runtime fell back to the CPU (this build has {providers})"


def gpu_unavailable(threads: int) -> str:
    """Why ONNX Runtime cannot run a session on a GPU here, or "" if it can: probed with a one-node graph, so that
    ``--device auto`` on a machine without one builds no model session only to throw it away."""
    return try_cuda(None, threads, gather_model([("float32", 1)]))[1]


def open_on_device(
    path: Path | None, model: Path | bytes, placement: Placement, graphs: bool = False, profiled: bool = False
) -> ort.InferenceSession:
    """A session of ``model`` (read from ``path``; None: aiayn built it) where ``placement`` says, on its threads:
    the CPU, or a GPU or a DeviceUnavailable error; with ``graphs``, one whose runs ONNX Runtime captures as CUDA
    graphs where it can (where it cannot, an ordinary session, saying why in one line); ``profiled``, under the
    placement's profiler where it has one."""
    threads = placement.threads
    if not placement.on_gpu:
        prefix = placement.profile_prefix if profiled else ""
        return open_session(model, [CPU], threads, path=path, profile_prefix=prefix)
    session, reason = try_cuda(path, threads, model, CUDA_GRAPHS if graphs else CUDA_OPTIONS)
    if session is None and graphs:
        print(f"{path.name if path else 'a graph aiayn built'}: no CUDA graphs ({reason})", file=sys.stderr)
        session, reason = try_cuda(path, threads, model)
    if session is None:
        name = path.name if path else "a graph aiayn built"
        raise DeviceUnavailable(
            f"--device cuda: ONNX Runtime cannot run {name} on a GPU here ({reason}); "
            "use --device cpu, or auto to take the GPU only where it works"
        )
    return session


def graph_problems(session: ort.InferenceSession, spec: GraphSpec) -> list[str]:
    """Every way the names, dtypes, ranks and fixed sizes of the session's inputs and outputs differ from ``spec``."""
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
    return problems


def check_graph(session: ort.InferenceSession, spec: GraphSpec, path: Path) -> None:
    """A folder's graph must follow the contract; all gaps listed, and the fix: re-export."""
    problems = graph_problems(session, spec)
    if problems:
        raise ValueError(
            f"{path} does not follow this aiayn's ONNX contract: {'; '.join(problems)}; "
            + REEXPORT.format(folder=path.parent)
        )


def check_built_graph(session: ort.InferenceSession, spec: GraphSpec) -> None:
    """A graph built at load time must follow its declaration (else aiayn itself is wrong); all gaps listed."""
    problems = graph_problems(session, spec)
    if problems:
        raise ValueError(f"the {spec.file} that aiayn built does not follow its declaration: {'; '.join(problems)}")


def check_stamp(session: ort.InferenceSession, config: ModelConfig, weights_sha256: str, path: Path) -> None:
    """The graph must come from this folder's config.json and model.safetensors (hashes in its metadata)."""
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get(CONFIG_FINGERPRINT_KEY) != config.fingerprint():
        raise ValueError(f"{path} was exported from another config.json; {REEXPORT.format(folder=path.parent)}")
    if meta.get(WEIGHTS_SHA256_KEY) != weights_sha256:
        raise ValueError(
            f"{path} was exported from other weights than {WEIGHTS_FILE} (hash mismatch); "
            + REEXPORT.format(folder=path.parent)
        )
