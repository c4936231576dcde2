"""`aiayn export`: write the ONNX graphs into a model folder, then prove them against PyTorch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.model.folder import TOKENIZER_FILE, resolve_model

FALLBACK_SENTENCES = [  # used for the parity check when the Multi30k test split is not available
    "A dog runs across the green grass.",
    "Two children are playing with a red ball on the beach.",
    "A woman in a blue coat is waiting for the bus.",
    "The old man sits on a bench and reads a newspaper.",
    "People walk down a busy street at night.",
    "A cyclist rides past a small shop.",
    "Three musicians perform on a stage in front of a crowd.",
    "A girl jumps into the swimming pool.",
]


def parity_sentences(folder: Path, count: int, data: str | None) -> list[str]:
    """The first ``count`` test_2016_flickr source sentences, or a few built-in ones without the corpus."""
    from aiayn.model.evaluate import load_split_for

    try:
        return load_split_for(folder, "test_2016_flickr", data).src[:count]
    except (FileNotFoundError, ValueError):
        print("Multi30k not found: checking parity on built-in sentences", file=sys.stderr)
        return FALLBACK_SENTENCES


def cmd_export(args: argparse.Namespace) -> None:
    from aiayn.export.onnx_export import export_onnx
    from aiayn.export.parity import TOLERANCE, check_logits, count_identical
    from aiayn.model.config import load_config
    from aiayn.model.engine import TorchEngine
    from aiayn.model.tokenizer import SubwordTokenizer
    from aiayn.model.weights import load_model
    from aiayn.search.translator import SearchSettings, Translator
    from aiayn.serve.engine import OnnxEngine

    folder = resolve_model(args.model)
    model = load_model(folder)
    variants = ("fp32", "int8") if args.quantize == "int8" else ("fp32",)
    export_onnx(model, folder, variants)
    for file in sorted(folder.glob("*.onnx")):
        print(f"wrote {file} ({file.stat().st_size / 1e6:.1f} MB)")

    tokenizer = SubwordTokenizer.load(folder / TOKENIZER_FILE)
    torch_engine = TorchEngine(model)
    onnx_engine = OnnxEngine.load(folder, device="cpu")
    max_len = load_config(folder).max_len
    torch_translator = Translator(torch_engine, tokenizer, max_len)
    onnx_translator = Translator(onnx_engine, tokenizer, max_len)
    sentences = parity_sentences(folder, max(args.check_sentences, 100), args.data)
    src_ids = [torch_translator.source_ids(s) for s in sentences]
    report = check_logits(torch_engine, onnx_engine, src_ids[:100])
    print(
        f"parity: max |log-prob difference| ONNX Runtime (CPU) vs PyTorch = {report.max_abs_diff:.2e} "
        f"over {report.steps} decoding steps of {report.sentences} sentences (tolerance {TOLERANCE:.0e})"
    )
    checked = src_ids[: args.check_sentences]
    for name, settings in (("greedy", SearchSettings(beam_size=1)), ("beam-4", SearchSettings(beam_size=4))):
        if checked:
            same = count_identical(torch_translator, onnx_translator, checked, settings)
            print(f"{name}: {same}/{len(checked)} translations token-identical between ONNX and PyTorch")
            if same != len(checked):
                raise ValueError(f"{len(checked) - same} {name} translations differ between ONNX and PyTorch")


def add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write encoder/decoder ONNX graphs into a model folder and check them")
    p.add_argument("model", help="bundled model name (en-de, de-en) or model folder")
    p.add_argument("--quantize", choices=("int8",), default=None, help="also write int8 graphs (dynamic quantization)")
    p.add_argument(
        "--check-sentences",
        type=int,
        default=1000,
        help="test sentences whose greedy and beam-4 translations must be identical (0: skip; default 1000)",
    )
    p.add_argument("--data", default=None, help="Multi30k folder (default: AIAYN_DATA, ../shared, or download)")
    p.set_defaults(func=cmd_export)
