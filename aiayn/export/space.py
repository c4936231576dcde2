"""`aiayn export MODEL --to space --out DIR`: a folder that is a whole Gradio Space serving that one model.

The folder holds ``app.py`` (the page, its API and ``POST /v1/translate`` over the model, as the repository's own
``app.py`` serves the bundled ones), the model folder as ``model/`` (what serving reads, and the record of what the
model knows), the modules of this package that ``app.py`` reaches (found by following its imports, so that the list
follows the code; a module that needs PyTorch where it is imported is left out, as a Space without torch never
runs it), ``requirements.txt`` (the third-party packages those modules import, pinned at the versions this export
runs with; Gradio comes from the front matter's ``sdk_version``), ``README.md`` with the Space's front matter,
and ``.gitattributes`` sending the binary files to the Hub's large-file storage. The Space serves one variant of
the weights (``SPACE_VARIANTS``: on a CPU fp32 or the weight-only blocks built at load, on a GPU fp32 or fp16), which
``app.py`` passes to the server and the page names. Torch-free.
"""

from __future__ import annotations

import ast
import html
import importlib.metadata
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE
from aiayn.core.folder import (
    CONFIG_FILE,
    IMPORTED_SECTION,
    TRAINING_RECORD_FILE,
    VALIDATION_SAMPLE_FILE,
    WEIGHTS_FILE,
    ModelFolder,
)
from aiayn.core.outputs import Command, claim, written_whole
from aiayn.core.public import public_record, public_sections, yaml_quoted
from aiayn.core.tokenizer import TARGET_TOKENIZER_FILE, TOKENIZER_FILE
from aiayn.engines import BLOCK_VARIANTS, ONNX_PORTABLE, SERVING_VARIANTS
from aiayn.engines.load import load_engine
from aiayn.engines.options import EngineOptions

PACKAGE = "aiayn"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the package
MODEL_DIR = "model"  # the model folder inside the Space
SPACE = Command("aiayn export --to space", "choose another --out, or pass --overwrite to replace the folder whole")
# The variants a Space serves on each device: what the serving engine builds from the weights there.
SPACE_VARIANTS = {"cpu": ("fp32", *BLOCK_VARIANTS), "cuda": SERVING_VARIANTS["cuda"]}
# What the serving engines read (they build their graphs from the weights, and so does the page's attention view,
# ``engines/onnx/serving/attention_view.py``), and where the folder has them, the target side's tokenizer, the record of
# what the model knows and the validation pairs the page takes examples from; a GPU Space carries the contract's
# exported graphs (``GPU_GRAPHS``) beside them.
MODEL_FILES = (
    CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    TARGET_TOKENIZER_FILE,
    TRAINING_RECORD_FILE,
    VALIDATION_SAMPLE_FILE,
)
GPU_GRAPHS = (ENCODER_FILE, DECODER_FILE)
GPU_GRAPHS_VARIANT = "fp32"
NEEDS_TORCH = "torch"
GRADIO = "gradio"
# ONNX Runtime is one module in two distributions; on a GPU its extras bring the CUDA and cuDNN libraries.
ONNXRUNTIME = {"cpu": "onnxruntime", "cuda": "onnxruntime-gpu[cuda,cudnn]"}
MCP_EXTRA = ("mcp", "pydantic")  # gradio[mcp]'s requirements: the MCP SDK, and the pydantic it bounds
GPU_FLAVOR = "t4-small"  # the Space hardware `hf repos create --flavor` asks for with --device cuda
LARGE_TEXT_BYTES = 10 * 1024 * 1024  # Spaces refuse larger files outside large-file storage, text too
LFS = "filter=lfs diff=lfs merge=lfs -text"

APP = '''"""A Hugging Face Space: {label}, {provenance}. Served by aiayn with ONNX Runtime and NumPy (no torch).

Written by `aiayn export MODEL --to space`. A Space runs `python app.py` and sends its visitors to port 7860
(GRADIO_SERVER_PORT elsewhere); it listens on every interface only where Spaces runs it (`space_host`), elsewhere
on 127.0.0.1. The page's API, POST /v1/translate and LibreTranslate's POST /translate answer as
`aiayn translate --model model --variant {variant}` does, with {variant} weights.
"""

import os
from pathlib import Path

from aiayn.engines.options import EngineOptions
from aiayn.serve.server import serve, space_host

MODEL = Path(__file__).resolve().parent / "{model_dir}"

if __name__ == "__main__":
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    options = EngineOptions(device="{device}", variant="{variant}")
    serve([str(MODEL)], host=space_host(), port=port, options=options, mcp={mcp})
'''


def module_file(name: str) -> Path | None:
    """The source file of one of our modules by its dotted name (a package's ``__init__.py``), or None."""
    base = SOURCE_ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def imports(source: str) -> Iterator[tuple[str, bool]]:
    """(absolute module name, imported where the module loads) for every import in ``source``; an import inside a
    function runs only when that function does. ``from a import b`` names ``a.b`` too where that is a module."""

    def visit(node: ast.AST, at_load: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                yield from ((alias.name, at_load) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):  # absolute, as every import of the package is written
                base = child.module or ""
                yield base, at_load
                yield from (
                    (f"{base}.{alias.name}", at_load) for alias in child.names if module_file(f"{base}.{alias.name}")
                )
            else:
                inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from visit(child, at_load and not inside)

    yield from visit(ast.parse(source), True)


def with_packages(name: str) -> list[str]:
    """``a.b.c`` → ``a``, ``a.b``, ``a.b.c``: importing a module runs its packages' ``__init__`` first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


class ImportWalk:
    """Our modules that a script reaches, and the third-party modules they import where they load."""

    def __init__(self) -> None:
        self.at_load: dict[str, set[str]] = {}  # our module → the modules it imports where it loads

    def imports_of(self, name: str) -> list[tuple[str, bool]]:
        path = module_file(name)
        assert path is not None, name
        return list(imports(path.read_text(encoding="utf-8")))

    def loads(self, name: str) -> set[str]:
        """Every module that importing ``name`` imports, ours and third-party (the roots of their names)."""
        seen: set[str] = set()
        todo = with_packages(name)
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            if module.split(".")[0] == PACKAGE:
                if module not in self.at_load:
                    found = (n for n, at_load in self.imports_of(module) if at_load)
                    self.at_load[module] = {m for n in found for m in with_packages(n)}
                todo.extend(self.at_load[module])
        return {m if m.split(".")[0] == PACKAGE else m.split(".")[0] for m in seen}

    def reached(self, script: str) -> tuple[list[str], set[str]]:
        """(our modules the script reaches, sorted; the third-party top-level modules they import where they load).
        A module that needs torch where it loads is not followed: it runs only on an install with torch."""
        ours: set[str] = set()
        todo = [n for n, _ in imports(script)]
        while todo:
            name = todo.pop()
            if name.split(".")[0] != PACKAGE or name in ours or NEEDS_TORCH in self.loads(name):
                continue
            for module in with_packages(name):
                if module not in ours and module_file(module):
                    ours.add(module)
                    todo.extend(n for n, _ in self.imports_of(module))
        third_party = {m for name in ours for m in self.loads(name) if m.split(".")[0] != PACKAGE}
        return sorted(ours), {m for m in third_party if m not in sys.stdlib_module_names}


def distribution_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_with(distribution: str) -> set[str]:
    """``distribution`` and every distribution its requirements install (without extras), by normalised name."""
    found: set[str] = set()
    todo = [distribution]
    while todo:
        name = distribution_name(todo.pop())
        if name in found:
            continue
        found.add(name)
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requirements if "extra ==" not in r)
    return found


def requirements(modules: set[str], device: str, mcp: bool = False) -> list[str]:
    """requirements.txt's lines: the distribution of each third-party module, pinned at its installed version,
    less Gradio and what Gradio installs (the Space installs the ``sdk_version`` Gradio and its own choices); with
    ``mcp``, what Gradio's ``mcp`` extra installs (``MCP_EXTRA``), pinned too."""
    providers = importlib.metadata.packages_distributions()
    from_gradio = installed_with(GRADIO)
    lines = []
    for module in sorted(modules):
        distribution = providers.get(module, [module])[0]
        if distribution_name(distribution) in from_gradio:
            continue
        version = importlib.metadata.version(distribution)
        name = ONNXRUNTIME[device] if module == "onnxruntime" else distribution_name(distribution)
        lines.append(f"{name}=={version}")
    return lines + ([f"{name}=={importlib.metadata.version(name)}" for name in MCP_EXTRA] if mcp else [])


def space_readme(folder: ModelFolder, device: str, variant: str) -> str:
    """README.md: the front matter that makes the folder a Gradio Space, and what the model knows."""
    config, imported = folder.config, folder.section(IMPORTED_SECTION)
    pair = f"{config.src_lang}-{config.tgt_lang}"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    licence, hub_id = str(imported.get("license") or ""), str(imported.get("from"))
    front = [  # every value from the folder or a model card quoted: read back as text, never as YAML
        f"title: {yaml_quoted(f'aiayn {pair}')}",
        "emoji: 🔤",
        "colorFrom: blue",
        "colorTo: indigo",
        "sdk: gradio",
        f"sdk_version: {yaml_quoted(importlib.metadata.version(GRADIO))}",
        f"python_version: {yaml_quoted(python)}",
        "app_file: app.py",
        "pinned: false",
        *([f"license: {yaml_quoted(licence)}"] if licence else []),
        *([f"models:\n  - {yaml_quoted(hub_id)}"] if imported.get("hub") else []),  # the Hub links the two
        *([f"suggested_hardware: {GPU_FLAVOR}"] if device == "cuda" else []),
    ]
    return (
        "---\n" + "\n".join(front) + "\n---\n\n"
        f"# {config.src_lang} → {config.tgt_lang}\n\n"
        f"A Transformer (*Attention Is All You Need*) {html.escape(folder.provenance())}, served with ONNX Runtime on "
        f"the {'GPU' if device == 'cuda' else 'CPU'} ({variant} weights). It translates what resembles what it learnt "
        "from; other text comes out poorly.\n\n"
        f'The page\'s API: `gradio_client.Client(URL).predict(text, "{pair}", 4, api_name="/translate")`; for apps, '
        f'`POST /v1/translate` with `{{"sentences": [...], "direction": "{pair}", "beam": 4}}`, or LibreTranslate\'s '
        f'`POST /translate` with `{{"q": ..., "source": "{config.src_lang}", "target": "{config.tgt_lang}"}}`.\n\n'
        f"Written by aiayn's `aiayn export MODEL --to space`: `{MODEL_DIR}/` is the model folder, `{PACKAGE}/` the "
        "part of aiayn that serves it, `requirements.txt` what that part imports.\n"
    )


def write_public_records(folder: ModelFolder, model_dir: Path) -> None:
    """The folder's config.json and training.json (where it has one) as an export publishes them."""
    published = {CONFIG_FILE: public_sections(folder.sections, IMPORTED_SECTION)}
    if folder.record_file.is_file():
        published[TRAINING_RECORD_FILE] = public_record(folder.training_record())
    for name, data in published.items():
        (model_dir / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def docstring_text(text: str) -> str:
    """``text`` inside app.py's docstring: no backslash or quote in it can end the string and start code."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def gitattributes(out_dir: Path) -> str:
    """Large-file storage for every binary file (by its extension) and every text file over the Hub's limit."""
    patterns: set[str] = set()
    for path in out_dir.rglob("*"):
        if not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head and path.suffix:
            patterns.add(f"*{path.suffix}")
        elif path.stat().st_size > LARGE_TEXT_BYTES or b"\0" in head:
            patterns.add(path.relative_to(out_dir).as_posix())
    return "".join(f"{pattern} {LFS}\n" for pattern in sorted(patterns))


def export_space(
    folder: ModelFolder,
    out_dir: Path,
    device: str = "cpu",
    variant: str = "fp32",
    overwrite: bool = False,
    mcp: bool = False,
) -> list[str]:
    """Write the Space's folder serving ``variant`` on ``device`` (``mcp``: an MCP server too); the report lines
    say what it holds, how to try it and how to publish it. ``out_dir`` is replaced whole (``core/outputs.py``): one
    that holds anything but an earlier Space of `aiayn export --to space` is refused, unless ``overwrite``."""
    if device not in SPACE_VARIANTS:
        raise ValueError(f"--device must be one of {', '.join(SPACE_VARIANTS)} for a Space, got {device!r}")
    if variant not in SPACE_VARIANTS[device]:
        choices = ", ".join(SPACE_VARIANTS[device])
        raise ValueError(f"a Space on the {device.upper()} serves --variant {choices}, not {variant!r}")
    claim(out_dir, SPACE, overwrite, [folder.path])
    folder.require([folder.weights_file, folder.tokenizer_file], "a Space serves a trained or imported folder")
    folder.check_weights()
    # The records go as an export publishes them (core/public.py): nothing of this machine.
    files = [folder.path / name for name in MODEL_FILES if name not in (CONFIG_FILE, TRAINING_RECORD_FILE)]
    if device == "cuda":  # what serves where the serving engine fails its check at load: checked here, as it will be
        load_engine(folder, EngineOptions(ONNX_PORTABLE, "cpu", GPU_GRAPHS_VARIANT, lanes=1))
        files += [folder.onnx_file(graph, GPU_GRAPHS_VARIANT) for graph in GPU_GRAPHS]
    with written_whole(out_dir, SPACE, overwrite, [folder.path]) as staging:
        modules = write_space_files(folder, staging, files, device, variant, mcp)
    size = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    config = folder.config
    label = f"{config.src_lang} → {config.tgt_lang}"
    space = f"USER/aiayn-{config.src_lang}-{config.tgt_lang}"
    flavor = f" --flavor {GPU_FLAVOR}" if device == "cuda" else ""
    return [
        f"wrote {out_dir}: {size / 1e6:.1f} MB, a Gradio Space serving {label} ({variant}) on the {device.upper()} "
        f"({len(modules)} modules of {PACKAGE}; {folder.provenance()})",
        f"try it: pip install -r {out_dir}/requirements.txt gradio=={importlib.metadata.version(GRADIO)} "
        f"&& python {out_dir}/app.py, then open http://127.0.0.1:7860/",
        f"publish it: hf repos create {space} --repo-type space --space-sdk gradio{flavor}",
        f"            hf upload {space} {out_dir} . --repo-type space",
    ]


def write_space_files(
    folder: ModelFolder, out_dir: Path, files: list[Path], device: str, variant: str, mcp: bool = False
) -> list[str]:
    """Every file of the Space into ``out_dir``, a new folder; returns the modules of the package it holds."""
    model_dir = out_dir / MODEL_DIR
    model_dir.mkdir(parents=True)
    for path in files:
        if path.is_file():
            shutil.copyfile(path, model_dir / path.name)
    write_public_records(folder, model_dir)
    config = folder.config
    label, provenance = docstring_text(f"{config.src_lang} → {config.tgt_lang}"), docstring_text(folder.provenance())
    app = APP.format(label=label, provenance=provenance, model_dir=MODEL_DIR, device=device, variant=variant, mcp=mcp)
    (out_dir / "app.py").write_text(app, encoding="utf-8")
    modules, third_party = ImportWalk().reached(app)
    for name in modules:
        source = module_file(name)
        assert source is not None
        target = out_dir / source.relative_to(SOURCE_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    lines = requirements(third_party, device, mcp)
    (out_dir / "requirements.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / "README.md").write_text(space_readme(folder, device, variant), encoding="utf-8")
    (out_dir / ".gitattributes").write_text(gitattributes(out_dir), encoding="utf-8")
    return modules
