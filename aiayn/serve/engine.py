"""The ONNX Runtime engine: the exported graphs seen through the search's step interface. NumPy only.

It checks the folder before it runs anything: every file there, the graphs
made from these very weights and this config (hashes in their metadata), and
the inputs and outputs the contract declares.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from aiayn.export.contract import DECODER_FILE, ENCODER_FILE, GraphSpec, decoder_spec, encoder_spec, variant_file
from aiayn.model.config import CONFIG_FILE, ModelConfig, load_config
from aiayn.model.folder import TOKENIZER_FILE, WEIGHTS_FILE, require_files

DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
REEXPORT = "re-export the folder with `aiayn export {folder}`"


@dataclass(frozen=True)
class OnnxState:
    src_mask: np.ndarray  # (rows, src_len) bool
    cross: list[np.ndarray]  # per layer key, value: (rows, heads, src_len, d_head)
    past: list[np.ndarray]  # per layer key, value: (rows, heads, past_len, d_head)

    @property
    def past_len(self) -> int:
        return self.past[0].shape[2]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def session_options(threads: int, quiet: bool) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if quiet:  # a failed CUDA attempt is reported by us in one line, not by ORT's logger
        options.log_severity_level = 4
    return options


def open_session(path: Path, device: str, threads: int) -> ort.InferenceSession:
    """A session on the asked device; ``auto`` keeps CUDA only if the session really runs on it."""
    if device == "cpu":
        return ort.InferenceSession(str(path), session_options(threads, False), providers=[CPU])
    ort.set_default_logger_severity(4)  # the provider bridge logs its load failure through the default logger
    try:
        session = ort.InferenceSession(str(path), session_options(threads, True), providers=[CUDA, CPU])
        running = session.get_providers()[0]
    except Exception:  # ORT raises plain RuntimeErrors/Fail when the CUDA libraries do not load
        session, running = None, CPU
    finally:
        ort.set_default_logger_severity(2)
    if running == CUDA:
        return session
    if device == "cuda":
        raise RuntimeError(
            "--device cuda: ONNX Runtime could not run on a GPU here (no GPU, or CUDA/cuDNN libraries missing); "
            "use --device cpu or auto"
        )
    return ort.InferenceSession(str(path), session_options(threads, False), providers=[CPU])


def check_graph(session: ort.InferenceSession, spec: GraphSpec, path: Path, folder: Path) -> None:
    """The graph's input and output names must be the contract's."""
    names = ([i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()])
    wanted = ([t.name for t in spec.inputs], [t.name for t in spec.outputs])
    if names != wanted:
        raise ValueError(f"{path} does not follow this aiayn's ONNX contract; {REEXPORT.format(folder=folder)}")


class OnnxEngine:
    """Encoder and decoder sessions of a model folder; implements ``aiayn.search.StepModel``."""

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
        self.cross_names = [t.name for t in decoder_spec(config).inputs[3 : 3 + self.n_kv]]
        self.past_names = [t.name for t in decoder_spec(config).inputs[3 + self.n_kv :]]

    @classmethod
    def load(
        cls, folder: str | Path, device: str = "auto", variant: str = "fp32", threads: int | None = None
    ) -> OnnxEngine:
        """Open and check a model folder's graphs; ``variant`` picks fp32 or int8 files."""
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
        folder = Path(folder)
        files = [variant_file(ENCODER_FILE, variant), variant_file(DECODER_FILE, variant)]
        require_files(folder, [CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, *files], REEXPORT.format(folder=folder))
        config = load_config(folder)
        threads = threads or min(4, os.cpu_count() or 1)
        sessions = []
        for file, spec in zip(files, (encoder_spec(config), decoder_spec(config)), strict=True):
            session = open_session(folder / file, device, threads)
            check_graph(session, spec, folder / file, folder)
            meta = session.get_modelmeta().custom_metadata_map
            if meta.get("aiayn.config_fingerprint") != config.fingerprint():
                raise ValueError(
                    f"{folder / file} was exported from another config.json; {REEXPORT.format(folder=folder)}"
                )
            if meta.get("aiayn.weights_sha256") != file_sha256(folder / WEIGHTS_FILE):
                raise ValueError(f"{folder / file} was exported from other weights; {REEXPORT.format(folder=folder)}")
            sessions.append(session)
        provider = sessions[0].get_providers()[0]
        return cls(config, sessions[0], sessions[1], provider)

    def start(self, src_ids: np.ndarray) -> OnnxState:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        outputs = self.encoder.run(None, {"src_ids": src_ids})  # memory, then cross key/value per layer
        rows, heads, d_head = src_ids.shape[0], self.config.n_heads, self.config.d_head
        empty = np.zeros((rows, heads, 0, d_head), dtype=np.float32)
        return OnnxState(src_ids != self.pad_id, outputs[1:], [empty] * self.n_kv)

    def run_decoder(self, state: OnnxState, tgt_ids: np.ndarray) -> list[np.ndarray]:
        feeds = {
            "tgt_ids": np.ascontiguousarray(tgt_ids, dtype=np.int64),
            "position_offset": np.array(state.past_len, dtype=np.int64),
            "src_mask": state.src_mask,
            **dict(zip(self.cross_names, state.cross, strict=True)),
            **dict(zip(self.past_names, state.past, strict=True)),
        }
        return self.decoder.run(None, feeds)  # log_probs, present key/value per layer, cross_attention

    def step(self, state: OnnxState, tgt_ids: np.ndarray) -> tuple[np.ndarray, OnnxState]:
        outputs = self.run_decoder(state, tgt_ids)
        log_probs = outputs[0][:, -1]  # (rows, vocab)
        return log_probs, OnnxState(state.src_mask, state.cross, outputs[1 : 1 + self.n_kv])

    def select(self, state: OnnxState, rows: np.ndarray) -> OnnxState:
        return OnnxState(state.src_mask[rows], [t[rows] for t in state.cross], [t[rows] for t in state.past])

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output: (batch, heads, out_len, src_len)."""
        return self.run_decoder(self.start(src_ids), out_ids)[-1]
