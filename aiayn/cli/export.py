"""`aiayn export`: flags → ``aiayn.export.checks.export_folder``, and its report printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.args import UserError, add_data_flag, add_overwrite_flag
from aiayn.core.contract import VARIANTS as EXPORTED_VARIANTS
from aiayn.core.folder import ModelFolder
from aiayn.core.normalizer import normalize_text
from aiayn.data.multi30k import TEST_SPLIT, ParallelCorpus, is_multi30k_pair
from aiayn.engines import BLOCK_VARIANTS


def check_set(
    folder: ModelFolder, check_files: str | None, data: str | None
) -> tuple[list[str], ParallelCorpus | None]:
    """The source sentences the graphs are proven on, with their references where known: --check-files, else the
    validation sample training kept in the folder (the user's own data), else Multi30k's test split when the
    folder's pair is there, else a few built-in English sentences (a numeric check, whatever the language)."""
    from aiayn.data.text_files import read_lines
    from aiayn.evaluation.evaluate import load_split_for, validation_sample
    from aiayn.export.checks import FALLBACK_SENTENCES

    if check_files is not None:
        sentences = [normalize_text(line) for line in read_lines(Path(check_files)) if line.strip()]
        if not sentences:
            raise ValueError(f"--check-files {check_files} holds no sentences")
        return sentences, None
    sample = validation_sample(folder)
    if sample is not None:
        return sample.src, sample
    config = folder.config
    if is_multi30k_pair(config.src_lang, config.tgt_lang):
        try:
            corpus = load_split_for(folder, TEST_SPLIT, data)
            return corpus.src, corpus
        except FileNotFoundError:
            if data is not None:
                raise
            note = "Multi30k not found"
    else:
        note = f"{folder.name} keeps no validation sample"
    print(
        f"{note}: checking on {len(FALLBACK_SENTENCES)} built-in sentences (--check-files SRC checks on yours)",
        file=sys.stderr,
    )
    return FALLBACK_SENTENCES, None


def cmd_export(args: argparse.Namespace) -> None:
    folder = ModelFolder.open(args.model)
    folders = ("web", "space", "transformers")  # what --out names
    if (args.to in folders) != (args.out is not None):
        raise UserError("--out DIR goes with --to web, --to space or --to transformers, and they need it")
    if args.device is not None and args.to != "space":
        raise UserError("--device goes with --to space (the Space's hardware); graphs serve on any device")
    variants = [v for v in (args.variant or "").split(",") if v]
    if args.to in ("web", "space") and len(variants) > 1:
        raise UserError(f"--to {args.to} serves one variant: --variant fp32, w8 or w4 (not {args.variant})")
    if args.overwrite and args.to == "onnx":
        raise UserError(
            "--overwrite goes with --to web, space, transformers or ctranslate2 (the graphs of --to onnx "
            "are the model folder's own, replaced whenever it is exported again)"
        )
    if args.transformers_js and args.to != "transformers":
        raise UserError("--transformers-js goes with --to transformers")
    if args.to in ("ctranslate2", "transformers") and variants:
        raise UserError(f"--variant goes with --to onnx, web or space; --to {args.to} writes the fp32 weights")
    if args.mcp and args.to != "space":
        raise UserError("--mcp goes with --to space (the Space's page as an MCP server)")
    if args.to == "web":
        from aiayn.export.web import export_web

        for line in export_web(folder, Path(args.out), args.variant or "fp32", overwrite=args.overwrite):
            print(line)
        return
    if args.to == "space":
        from aiayn.export.space import export_space

        device, variant = args.device or "cpu", args.variant or "fp32"
        for line in export_space(folder, Path(args.out), device, variant, args.overwrite, args.mcp):
            print(line)
        return
    if args.to == "transformers":
        from aiayn.export.transformers_folder import export_transformers

        for line in export_transformers(folder, Path(args.out), args.transformers_js, args.overwrite):
            print(line)
        return

    from aiayn.export.checks import export_folder
    from aiayn.model.weights import load_model

    unknown = [v for v in variants if v not in EXPORTED_VARIANTS]
    if unknown:
        choices = ", ".join(EXPORTED_VARIANTS)
        raise UserError(f"--variant {','.join(unknown)} is no ONNX graph variant; --to onnx writes {choices}")
    variants = [v for v in variants if v != "fp32"]  # fp32 is always written
    if args.check_sentences < 0:  # before the slow part
        raise ValueError(f"--check-sentences must be 0 or more, got {args.check_sentences}")
    model = load_model(folder)
    sentences, references = check_set(folder, args.check_files, args.data)
    for line in export_folder(
        model, folder, sentences, references, args.to, variants, args.check_sentences, args.overwrite
    ):
        print(line)


def add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write encoder/decoder ONNX graphs into a model folder and check them")
    p.add_argument("model", help="bundled model name (en-de, de-en) or model folder")
    p.add_argument(
        "--to",
        choices=("onnx", "ctranslate2", "web", "space", "transformers"),
        default="onnx",
        help="ONNX graphs, a CTranslate2 model, a static folder that translates in the browser, a folder that is "
        "a whole Gradio Space serving the model, or a transformers folder for the Hub (Pegasus if pre-LN, Marian if "
        "post-LN; web, space and "
        "transformers need --out; no PyTorch, but transformers measures its one difference with it)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="the folder --to web, space or transformers writes: new, empty or that export's earlier output "
        "(replaced whole once the new one is done)",
    )
    add_overwrite_flag(p, "--out (or the model folder's ctranslate2/)")
    p.add_argument(
        "--transformers-js",
        action="store_true",
        help="--to transformers: write onnx/ too, the ONNX graphs transformers.js loads (exported with PyTorch; "
        "a post-LN folder: transformers.js has no Pegasus)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="--to space: the Space's hardware (default cpu; cuda installs onnxruntime-gpu and serves the exported "
        "graphs, which `aiayn export MODEL` writes)",
    )
    p.add_argument(
        "--variant",
        default=None,
        help="--to onnx: the graphs written beside fp32, comma-separated: int8 (ONNX Runtime's dynamic int8, "
        "for other runtimes), fp16 (CUDA); "
        "--to web, the browser folder's graphs, and --to space, the weights the Space serves: fp32 (default: the "
        f"CLI's very answers) or a weight-only block-quantized variant, {' or '.join(BLOCK_VARIANTS)}, as "
        "`aiayn translate --variant` runs them; a GPU Space (--device cuda) serves fp32 or fp16",
    )
    p.add_argument(
        "--mcp",
        action="store_true",
        help="--to space: the Space is an MCP server too, its translate a tool (as `aiayn serve --mcp`)",
    )
    p.add_argument(
        "--check-sentences",
        type=int,
        default=1000,
        help="sentences whose greedy and beam-4 translations must be identical to PyTorch's (0: skip)",
    )
    p.add_argument(
        "--check-files",
        metavar="SRC",
        default=None,
        help="check on this file's lines (default: the validation sample training kept in the folder, else "
        "Multi30k's test split where the folder's pair is in Multi30k)",
    )
    add_data_flag(p)
    p.set_defaults(func=cmd_export)
