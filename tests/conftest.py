"""Shared fixtures: the real corpus (or a clear skip), the bundled models, and a tiny random model folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from aiayn.core.config import ModelConfig, SpecialTokens
from aiayn.core.folder import bundled_models
from aiayn.data.multi30k import find_data_dir
from aiayn.engines.onnx.serving.device_buffers import GRAPH_ID
from aiayn.engines.onnx.serving.spec import HOST_READ, SEQLENS_K, TOTAL_LEN, ServingOps
from aiayn.engines.onnx.tiny_graphs import INDICES

pytest_plugins = ["time_limit"]  # the guard: no test over 60 s unless listed with its reason (tests/time_limit.py)

INVENTED = [
    "the red cat sleeps on the old chair.",
    "a small dog runs after two blue birds!",
    "three children play near the green river.",
    "das rote Haus steht am Fluss.",
    "ein kleiner Hund spielt im Garten.",
]


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    path = find_data_dir()
    if path is None:
        pytest.skip("Multi30k not found: set AIAYN_DATA or put it at ../shared/data/multi30k")
    return path


@pytest.fixture(scope="session")
def bundled() -> dict[str, Path]:
    models = bundled_models()
    if not {"en-de", "de-en"} <= set(models):
        pytest.skip("the bundled models (pretrained/en-de, pretrained/de-en) are missing from this checkout")
    return models


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny model folder with its tokenizer, weights and exported ONNX graphs."""
    import torch

    from aiayn.core.config import ModelConfig
    from aiayn.core.folder import ModelFolder
    from aiayn.core.tokenizer import train_tokenizer
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.transformer import Transformer
    from aiayn.model.weights import load_model, save_weights

    folder = tmp_path_factory.mktemp("tiny-model")
    config = ModelConfig(
        vocab_size=120, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0
    )
    tokenizer = train_tokenizer(INVENTED * 3, config.vocab_size, config.special_tokens)
    config = config.replace(vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    save_weights(Transformer(config), ModelFolder.create(folder, config, tokenizer))
    export_onnx(load_model(folder), folder, ("fp32", "int8"))
    return folder


def marian_like_config(vocab_size: int) -> ModelConfig:
    """A tiny config with every choice an imported Marian (OPUS-MT) checkpoint makes where ours differ: SiLU,
    sin | cos halves, a logits bias, </s> at 0 and <pad> last, doubling as the decoder's start, never generated."""
    pad = vocab_size - 1
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        layer_norm_eps=1e-5,
        max_len=512,
        special_tokens=SpecialTokens(pad=pad, unk=1, bos=pad, eos=0),
        activation="swish",
        positions="halves",
        logits_bias=True,
        never_generate=(pad,),
    )


@pytest.fixture(scope="session")
def marian_like_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny folder of ``marian_like_config``, with its exported ONNX graphs."""
    return make_marian_like_folder(tmp_path_factory.mktemp("marian-like-model"))


@pytest.fixture(scope="session")
def marian_gelu_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``marian_like_folder`` with the other choices where ours differ: the erf GELU, embeddings left unscaled, and
    the paper's interleaved positions (to tell them from the halves)."""
    changes = {"activation": "gelu", "scale_embedding": False, "positions": "interleaved"}
    return make_marian_like_folder(tmp_path_factory.mktemp("marian-gelu-model"), **changes)


def make_marian_like_folder(folder: Path, **changes: Any) -> Path:
    """A randomly initialised tiny folder of ``marian_like_config`` with ``changes`` (a word-level tokenizer of the
    invented sentences stands in for SentencePiece), with its exported ONNX graphs; its logits bias is not zero."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    from aiayn.core.folder import ModelFolder
    from aiayn.core.tokenizer import SubwordTokenizer
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.transformer import Transformer
    from aiayn.model.weights import load_model, save_weights

    words = sorted({word for sentence in INVENTED for word in sentence.split()})
    vocab = {"</s>": 0, "<unk>": 1, **{word: i + 2 for i, word in enumerate(words)}}
    vocab["<pad>"] = len(vocab)
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens(["</s>", "<unk>", "<pad>"])
    config = marian_like_config(len(vocab)).replace(**changes)
    torch.manual_seed(0)
    model = Transformer(config)
    if model.embedding.bias is not None:
        with torch.no_grad():
            model.embedding.bias.normal_(0.0, 0.2)
    save_weights(model, ModelFolder.create(folder, config, SubwordTokenizer(raw)))
    export_onnx(load_model(folder), folder)
    return folder


@dataclass(frozen=True)
class Page:
    """`aiayn serve` running as a process on loopback."""

    url: str
    pid: int
    log: Path


def blocker_source(module: str) -> str:
    """Python source (a ``sitecustomize.py``, or a script's head) after which importing ``module`` or any of its
    submodules raises ImportError, as an install without it would."""
    return f"""
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} or name.startswith({module + "."!r}):
            raise ImportError("{module} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
"""


@pytest.fixture(scope="session")
def import_blocker() -> Callable[[str], str]:
    """``blocker_source``: the module a test's subprocess must run without."""
    return blocker_source


def folder_bytes_of(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder`` by its relative path, with the sha256 of its bytes (a link: of its
    target's name): the folder byte for byte, to compare before and after a command."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(
            os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        ).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() or path.is_symlink()
    }


@pytest.fixture(scope="session")
def folder_bytes() -> Callable[[Path], dict[str, str]]:
    """``folder_bytes(folder)``: its files and their sha256, which a refused command must leave as they were."""
    return folder_bytes_of


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served_page(flags: list[str], log: Path, timeout_s: float = 120) -> Iterator[Page]:
    """`aiayn serve FLAGS` until the page answers and the server has said so ("serving", printed once it serves);
    stopped on leaving."""
    port = free_port()
    command = [sys.executable, "-m", "aiayn.cli", "serve", "--port", str(port), *flags]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while not ("serving" in log.read_text() and answers(url)):
            if process.poll() is not None:
                pytest.fail(f"`aiayn serve` exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"`aiayn serve` did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Page(url, process.pid, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def read_models_info(url: str) -> list[dict[str, str]]:
    """A page server's operators' routes at ``url`` (ending in /): /healthz and /readyz answer 200, and /metrics,
    read by prometheus_client's parser, labels each served model (``aiayn_model_info``)."""
    from prometheus_client.parser import text_string_to_metric_families

    for path in ("healthz", "readyz"):
        with urllib.request.urlopen(f"{url}{path}", timeout=10) as answer:
            assert answer.status == 200
    with urllib.request.urlopen(f"{url}metrics", timeout=10) as answer:
        families = list(text_string_to_metric_families(answer.read().decode()))
    return [sample.labels for family in families for sample in family.samples if sample.name == "aiayn_model_info"]


@pytest.fixture(scope="session")
def models_info() -> Callable[[str], list[dict[str, str]]]:
    """``models_info(url)`` — a page server's operators' routes checked, its served models' info labels."""
    return read_models_info


@pytest.fixture(scope="session")
def serve_page() -> Callable[..., AbstractContextManager[Page]]:
    """``with serve_page(flags, log) as page:`` — `aiayn serve` as a process, for tests through HTTP."""
    return served_page


PYTHON_CACHE = Path.home() / ".cache" / "aiayn" / "python"


def cached_venv(name: str, stamp: dict[str, Any], install: Callable[[Path], None]) -> Path:
    """The Python of the virtual environment ``name`` in aiayn's cache, made once by ``install(python)`` over a
    fresh venv and kept while its ``stamp`` (what was installed, from what) is the same: a rerun skips pip and its
    resolver. Built beside it and moved in whole, so a run that stops halfway leaves none; ``install`` may skip."""
    venv = PYTHON_CACHE / name

    def ready() -> bool:
        made = venv / "aiayn-ready.json"
        return made.is_file() and json.loads(made.read_text()) == stamp

    if ready():
        return venv / "bin" / "python"
    PYTHON_CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{venv.name}-", dir=PYTHON_CACHE))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(build)], check=True)
        install(build / "bin" / "python")
        (build / "aiayn-ready.json").write_text(json.dumps(stamp))
        if not ready():  # else another run has put its own there meanwhile, which it may be running
            shutil.rmtree(venv, ignore_errors=True)
            build.rename(venv)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def venv_cache() -> Callable[[str, dict[str, Any], Callable[[Path], None]], Path]:
    """``venv_cache(name, stamp, install)``: ``cached_venv``, a virtual environment made once per stamp."""
    return cached_venv


@pytest.fixture(scope="session")
def space_python(tmp_path_factory: pytest.TempPathFactory, bundled: dict[str, Path]) -> Path:
    """The Python of a virtual environment holding only what a Gradio Space installs: the requirements.txt of
    an exported Space (an MCP server, ``--mcp``: its requirements a superset) and of the repository's own Space (one
    venv for both, to keep the suite short: the root's adds only numpy and tqdm, which Gradio installs anyway), and
    the Gradio of their front matter's ``sdk_version``. Made once per content of those files (and Gradio's and
    Python's versions) in aiayn's cache, as a Space's build would make it from them (nothing else is installed
    there; a dependency's newer release reaches it once ~/.cache/aiayn/python is cleared).
    Skipped, saying why, where pip cannot reach the package registry."""
    import gradio

    space = tmp_path_factory.mktemp("space-requirements") / "space"
    subprocess.run(
        [sys.executable, "-m", "aiayn.cli", "export", "en-de", "--to", "space", "--out", str(space), "--mcp"],
        check=True,
    )
    root = Path(__file__).resolve().parents[1]
    files = (space / "requirements.txt", root / "requirements.txt")
    stamp = {
        "requirements": [path.read_text() for path in files],
        "gradio": gradio.__version__,
        "python": sys.version,
    }

    def install(python: Path) -> None:
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        probe = subprocess.run([*pip, "index", "versions", "gradio"], capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            pytest.skip(f"pip cannot reach the package registry: {probe.stderr.strip().splitlines()[-1:]}")
        requirements = [arg for path in files for arg in ("-r", str(path))]
        install = [*pip, "install", "-q", *requirements, f"gradio=={gradio.__version__}"]
        result = subprocess.run(install, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, result.stderr[-3000:]

    digest = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    return cached_venv(f"space-{digest}", stamp, install)


@contextmanager
def served_space(python: Path, space: Path, log: Path, timeout_s: float = 180) -> Iterator[str]:
    """``python space/app.py`` as a Space runs it (its own folder only: no PYTHONPATH, another working directory),
    on a free port until the page answers; its URL. Stopped on leaving."""
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(log.parent), "GRADIO_SERVER_PORT": str(port)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(python), str(space / "app.py")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "GRADIO_ANALYTICS_ENABLED": "False"},
            cwd=log.parent,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{space}/app.py did not serve (exit {process.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def serve_space() -> Callable[..., AbstractContextManager[str]]:
    """``with serve_space(python, space_dir, log) as url:`` — an exported Space's app.py as a Space runs it."""
    return served_space


def mcp_translated(url: str, text: str, direction: str, beam_size: int) -> tuple[list[str], list[str]]:
    """The MCP tools a page server lists, and its translate tool's answer (translation, status), through the `mcp`
    package's Streamable HTTP client."""
    import ast
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def asked() -> tuple[list[str], list[str]]:
        async with streamable_http_client(f"{url}gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = [tool.name for tool in (await session.list_tools()).tools]
                arguments = {"text": text, "direction": direction, "beam_size": beam_size}
                called = await session.call_tool("translate", arguments)
                return tools, ast.literal_eval(called.content[0].text)  # type: ignore[union-attr]

    return asyncio.run(asked())


@pytest.fixture(scope="session")
def mcp_translate() -> Callable[[str, str, str, int], tuple[list[str], list[str]]]:
    """``mcp_translate(url, text, direction, beam_size)`` — (the tools listed, the translate tool's answer)."""
    return mcp_translated


def on_the_gpu(session: ort.InferenceSession) -> bool:
    """A session that the serving engine runs on a GPU with its state in the device's memory: the CUDA serving decoder
    (positions per row, no GroupQueryAttention's total length) and the reordering gather beside it."""
    names = {i.name for i in session.get_inputs()}
    return (SEQLENS_K in names and TOTAL_LEN not in names) or INDICES in names


def graph_id(run_options: ort.RunOptions | None) -> int:
    """The run's ``gpu_graph_id``; -1 (an ordinary run) where it names none."""
    try:
        return int(run_options.get_run_config_entry(GRAPH_ID)) if run_options is not None else -1
    except RuntimeError:
        return -1


@contextmanager
def cuda_binding_rules() -> Iterator[None]:
    """CUDA's I/O binding and graph capture rules on the CPU provider, for the sessions the serving engine runs on a
    GPU (``on_the_gpu``). Without it the CPU provider aliases every host array and replays nothing, and hides what a
    GPU would do:

    - a host array bound to an input that the kernel reads from device memory is copied when it is bound
      (``IOBinding.cc``, ``CopyOneInputAcrossDevices``), so a later NumPy write to it is never seen; the inputs of
      ``HOST_READ`` stay aliased, as on a GPU. Memory that ONNX Runtime allocated for the device (``device``
      OrtValues, which are host memory here) is bound by reference, as on a GPU;
    - a run with a ``gpu_graph_id`` replays, from its second time, the kernels captured the first time: over the same
      addresses, with the values its host-read inputs had then. So every run of an id must bind what its first run
      bound, at the same addresses, the host-read values unchanged; and a capture must follow an ordinary run of the
      same bindings (ONNX Runtime's arena may not grow while a graph is captured)."""
    host_arrays: weakref.WeakSet[ort.OrtValue] = weakref.WeakSet()
    from_numpy, io_binding = ort.OrtValue.ortvalue_from_numpy, ort.InferenceSession.io_binding
    bind_cpu_input, bind_ortvalue_input = ort.IOBinding.bind_cpu_input, ort.IOBinding.bind_ortvalue_input
    bind_input, bind_output = ort.IOBinding.bind_input, ort.IOBinding.bind_output
    bind_ortvalue_output, run_with_iobinding = (
        ort.IOBinding.bind_ortvalue_output,
        ort.InferenceSession.run_with_iobinding,
    )
    on_gpu: weakref.WeakSet[ort.IOBinding] = weakref.WeakSet()
    bound: weakref.WeakKeyDictionary[ort.IOBinding, dict[str, Any]] = weakref.WeakKeyDictionary()
    # Keyed by the session itself, not its id(): a later test's session may get a freed one's id, and with it that
    # one's captures (a replay "over other bindings" that never happened).
    captured: weakref.WeakKeyDictionary[ort.InferenceSession, dict[int, tuple[Any, ...]]] = weakref.WeakKeyDictionary()
    warmed: weakref.WeakKeyDictionary[ort.InferenceSession, set[tuple[Any, ...]]] = weakref.WeakKeyDictionary()

    def wrap(array: np.ndarray, *args: Any, **kwargs: Any) -> ort.OrtValue:
        value = from_numpy(array, *args, **kwargs)
        host_arrays.add(value)
        return value

    def new_binding(session: ort.InferenceSession) -> ort.IOBinding:
        binding = io_binding(session)
        bound[binding] = {}
        if on_the_gpu(session):
            on_gpu.add(binding)
        return binding

    def copied(binding: ort.IOBinding, name: str) -> bool:
        return binding in on_gpu and name not in HOST_READ

    def bind_array(binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        array = np.array(array, copy=True) if copied(binding, name) else array
        bound[binding][name] = ("host", array)  # host-read: its value at a capture is what replays see
        bind_cpu_input(binding, name, array)

    def bind_value(binding: ort.IOBinding, name: str, value: ort.OrtValue) -> None:
        if copied(binding, name) and value in host_arrays:
            value = from_numpy(value.numpy().copy())
        bound[binding][name] = ("value", value.data_ptr(), tuple(value.shape()))
        bind_ortvalue_input(binding, name, value)

    def bind_address(binding: ort.IOBinding, name: str, device: str, i: int, dtype: Any, shape: Any, ptr: int) -> None:
        bound[binding][name] = ("address", ptr, tuple(shape))
        bind_input(binding, name, device, i, dtype, shape, ptr)

    def bind_out(binding: ort.IOBinding, name: str, device: str = "cpu", *args: Any) -> None:
        bound[binding]["out " + name] = ("address", args[-1], tuple(args[-2])) if args else ("allocated",)
        bind_output(binding, name, device, *args)

    def bind_value_out(binding: ort.IOBinding, name: str, value: ort.OrtValue) -> None:
        bound[binding]["out " + name] = ("value", value.data_ptr(), tuple(value.shape()))
        bind_ortvalue_output(binding, name, value)

    def signature(binding: ort.IOBinding) -> tuple[Any, ...]:
        def frozen(entry: tuple[Any, ...]) -> tuple[Any, ...]:
            return ("host", entry[1].tobytes()) if entry[0] == "host" else entry

        return tuple(sorted((name, frozen(entry)) for name, entry in bound.get(binding, {}).items()))

    def run(session: ort.InferenceSession, binding: ort.IOBinding, run_options: Any = None) -> None:
        graph = graph_id(run_options)
        if binding in on_gpu and graph == -1:
            warmed.setdefault(session, set()).add(signature(binding))
        elif binding in on_gpu:  # pytest.fail: no ``except Exception`` of the engine's can take it for ONNX Runtime's
            graphs = captured.setdefault(session, {})
            if graph not in graphs:
                if signature(binding) not in warmed.get(session, set()):
                    pytest.fail(f"graph {graph} captured without a warm-up run")
                graphs[graph] = signature(binding)
            if signature(binding) != graphs[graph]:
                pytest.fail(f"graph {graph} replayed over other bindings or host-read values than it was captured with")
        run_with_iobinding(session, binding, run_options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort.OrtValue, "ortvalue_from_numpy", wrap)
        patch.setattr(ort.InferenceSession, "io_binding", new_binding)
        patch.setattr(ort.InferenceSession, "run_with_iobinding", run)
        patch.setattr(ort.IOBinding, "bind_cpu_input", bind_array)
        patch.setattr(ort.IOBinding, "bind_ortvalue_input", bind_value)
        patch.setattr(ort.IOBinding, "bind_input", bind_address)
        patch.setattr(ort.IOBinding, "bind_output", bind_out)
        patch.setattr(ort.IOBinding, "bind_ortvalue_output", bind_value_out)
        yield


@pytest.fixture(scope="session", autouse=True)
def under_cuda_rules() -> Iterator[None]:
    """Every test runs the CUDA serving graphs under CUDA's binding rules (other sessions are untouched; on a GPU the
    rules are ONNX Runtime's own)."""
    with cuda_binding_rules():
        yield


WRONG_WEIGHT = "decoder_layers.0.self_attn.w_v.weight"  # a weight the self-check at load must notice


@pytest.fixture
def broken_gpu_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's serving graphs built with one weight wrong; the CPU's, the self-check's reference, stay true."""
    from aiayn.engines.onnx.serving import engine as serving_engine

    build = serving_engine.build_serving_graphs

    def broken(config: ModelConfig, weights: dict[str, np.ndarray], *args: Any) -> Any:
        ops = next(arg for arg in args if isinstance(arg, ServingOps))  # positional, after the block scheme
        wrong = dict(weights, **{WRONG_WEIGHT: weights[WRONG_WEIGHT] * 1.5}) if ops.device == "cuda" else weights
        return build(config, wrong, *args)

    monkeypatch.setattr(serving_engine, "build_serving_graphs", broken)
