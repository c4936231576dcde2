"""`aiayn export`: write the ONNX graphs (or a CTranslate2 model) into a model folder, then prove them.

Every check that can fail stops the command with a clear message (ValueError,
exit code 2): the exported model must compute what PyTorch computes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.model.folder import TOKENIZER_FILE, resolve_model

SPLIT = "test_2016_flickr"
PARITY_SENTENCES = 100  # the fp32 log-prob check; the identical-translation check takes --check-sentences
INT8_BLEU_GOAL = 0.3  # largest BLEU drop we accept from int8 without saying so
FP16_SANITY = 1.0  # fp16 log-probs further than this from fp32 mean a broken graph, not rounding
FALLBACK_SENTENCES = [  # used when the Multi30k test split is not available
    "A dog runs across the green grass.",
    "Two children are playing with a red ball on the beach.",
    "A woman in a blue coat is waiting for the bus.",
    "The old man sits on a bench and reads a newspaper.",
    "People walk down a busy street at night.",
    "A cyclist rides past a small shop.",
    "Three musicians perform on a stage in front of a crowd.",
    "A girl jumps into the swimming pool.",
]


def load_test_split(folder: Path, data: str | None) -> Any:
    """The folder's language pair of test_2016_flickr, or None (with a note) when no corpus is at hand.

    A folder named with --data must hold it; only the automatic search may come up empty.
    """
    from aiayn.model.evaluate import load_split_for

    try:
        return load_split_for(folder, SPLIT, data)
    except FileNotFoundError:
        if data is not None:
            raise
        print(f"Multi30k not found: checking on {len(FALLBACK_SENTENCES)} built-in sentences", file=sys.stderr)
        return None


def megabytes(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.2f} MB"


def cmd_export(args: argparse.Namespace) -> None:
    from aiayn.model.tokenizer import SubwordTokenizer
    from aiayn.model.weights import load_model

    if args.check_sentences < 0:
        raise ValueError(f"--check-sentences must be 0 or more, got {args.check_sentences}")
    if args.to == "ctranslate2" and (args.quantize or args.fp16):
        raise ValueError("--quantize and --fp16 apply to ONNX graphs; leave them out with --to ctranslate2")
    folder = resolve_model(args.model)
    model = load_model(folder)
    tokenizer = SubwordTokenizer.load(folder / TOKENIZER_FILE)
    corpus = load_test_split(folder, args.data)
    if corpus is not None:
        corpus = corpus.head(max(args.check_sentences, PARITY_SENTENCES))
    sentences = corpus.src if corpus is not None else FALLBACK_SENTENCES
    if args.to == "ctranslate2":
        export_to_ctranslate2(model, tokenizer, folder, sentences[: max(args.check_sentences, 1)])
        return
    export_and_prove_onnx(model, tokenizer, folder, sentences, args)
    check = min(args.check_sentences, len(sentences))
    if args.quantize == "int8":
        report_int8(folder, sentences, corpus.head(check) if corpus is not None and check else None, tokenizer, check)
    if args.fp16:
        report_fp16(folder, sentences, tokenizer, check)


def export_and_prove_onnx(model: Any, tokenizer: Any, folder: Path, sentences: list[str], args: Any) -> None:
    """Write the graphs, then check fp32 log-probs and translations against PyTorch; raise on any gap."""
    from aiayn.export.contract import DECODER_FILE, ENCODER_FILE, variant_file
    from aiayn.export.onnx_export import export_onnx
    from aiayn.export.parity import TOLERANCE, ParityError, check_logits, count_identical
    from aiayn.model.engine import TorchEngine
    from aiayn.search.translator import SearchSettings, Translator
    from aiayn.serve.engine import OnnxEngine

    variants = ["fp32", *(["int8"] if args.quantize == "int8" else []), *(["fp16"] if args.fp16 else [])]
    export_onnx(model, folder, variants)
    for variant in variants:
        files = [folder / variant_file(base, variant) for base in (ENCODER_FILE, DECODER_FILE)]
        print(f"wrote {variant}: " + ", ".join(f"{f.name} {megabytes(f)}" for f in files))
    bundle = [folder / name for name in ("model.safetensors", ENCODER_FILE, DECODER_FILE)]
    print(f"model.safetensors + fp32 graphs: {sum(f.stat().st_size for f in bundle) / 1e6:.2f} MB")

    torch_engine, onnx_engine = TorchEngine(model), OnnxEngine.load(folder, device="cpu")
    torch_translator = Translator(torch_engine, tokenizer, model.config.max_len)
    onnx_translator = Translator(onnx_engine, tokenizer, model.config.max_len)
    src_ids = [torch_translator.source_ids(s) for s in sentences]
    report = check_logits(torch_engine, onnx_engine, src_ids[:PARITY_SENTENCES])
    print(
        f"parity: max |log-prob difference| ONNX Runtime (CPU, all graph optimizations) vs PyTorch "
        f"= {report.max_abs_diff:.2e} over {report.steps} steps of {report.sentences} sentences in batches "
        f"{', '.join(f'{b}x{s}' for b, s in report.batch_shapes)} (tolerance {TOLERANCE:.0e})"
    )
    checked = src_ids[: args.check_sentences]
    if not checked:
        return
    counts = []
    for name, settings in (("greedy", SearchSettings(beam_size=1)), ("beam-4", SearchSettings(beam_size=4))):
        same = count_identical(torch_translator, onnx_translator, checked, settings)
        counts.append((name, same))
    print(", ".join(f"{name} {same}/{len(checked)} identical" for name, same in counts) + " (ONNX vs PyTorch)")
    for name, same in counts:
        if same != len(checked):
            raise ParityError(f"{len(checked) - same} {name} translations differ between ONNX and PyTorch")


def against_fp32(
    folder: Path, variant: str, device: str, tokenizer: Any, sentences: list[str], check_sentences: int
) -> tuple[str, float, int]:
    """A variant's provider, its max |log-prob difference| from the fp32 graphs (an error figure, not a
    parity bound) and how many of the first ``check_sentences`` greedy translations stay the same."""
    from aiayn.export.parity import count_identical, max_log_prob_diff
    from aiayn.search.translator import SearchSettings, Translator
    from aiayn.serve.engine import OnnxEngine

    reference = OnnxEngine.load(folder, device="cpu")
    engine = OnnxEngine.load(folder, device=device, variant=variant)
    ref_translator = Translator(reference, tokenizer, reference.config.max_len)
    translator = Translator(engine, tokenizer, reference.config.max_len)
    src_ids = [ref_translator.source_ids(s) for s in sentences]
    gap = max_log_prob_diff(reference, engine, src_ids[:PARITY_SENTENCES]).max_abs_diff
    same = count_identical(ref_translator, translator, src_ids[:check_sentences], SearchSettings(beam_size=1))
    return engine.provider, gap, same


def report_int8(folder: Path, sentences: list[str], corpus: Any, tokenizer: Any, check_sentences: int) -> None:
    """How far int8 moves the log-probs, and what it costs in BLEU on the test set."""
    from aiayn.export.quantize import bleu_by_variant

    _, gap, same = against_fp32(folder, "int8", "cpu", tokenizer, sentences, check_sentences)
    print(f"int8: max |log-prob difference| vs fp32 = {gap:.3f}, greedy {same}/{check_sentences} identical to fp32")
    if corpus is None:
        print("int8: BLEU not measured (no Multi30k test set, or --check-sentences 0)")
        return
    scores = bleu_by_variant(folder, corpus, ("fp32", "int8"))
    drop = scores["fp32"].bleu - scores["int8"].bleu
    verdict = "within" if drop <= INT8_BLEU_GOAL else "ABOVE"
    print(
        f"BLEU {SPLIT} ({len(corpus)} sentences, beam 4, ONNX Runtime CPU): fp32 {scores['fp32'].bleu:.2f}, "
        f"int8 {scores['int8'].bleu:.2f}, drop {drop:.2f} ({verdict} the {INT8_BLEU_GOAL} goal)"
    )


def report_fp16(folder: Path, sentences: list[str], tokenizer: Any, check_sentences: int) -> None:
    """The fp16 graphs are meant for CUDA: run them on it where there is one, else on the CPU, and say which."""
    provider, gap, same = against_fp32(folder, "fp16", "auto", tokenizer, sentences, check_sentences)
    if not gap < FP16_SANITY:  # NaN, or fp16 overflowed somewhere
        raise ValueError(f"the fp16 graphs are broken: max |log-prob difference| vs fp32 = {gap:.3g}")
    where = "CUDA" if provider == "CUDAExecutionProvider" else "ONNX Runtime CPU; CUDA was not run"
    print(f"fp16 ({where}): max |log-prob difference| vs fp32 = {gap:.3f}, greedy {same}/{check_sentences} identical")


def export_to_ctranslate2(model: Any, tokenizer: Any, folder: Path, sentences: list[str]) -> None:
    """Write folder/ctranslate2 and show that its greedy output equals ours, token for token."""
    from aiayn.export.ctranslate2 import ctranslate2_greedy, export_ctranslate2
    from aiayn.model.engine import TorchEngine
    from aiayn.search.translator import SearchSettings, Translator

    target = export_ctranslate2(model, tokenizer, folder)
    print(f"wrote {target}")
    translator = Translator(TorchEngine(model), tokenizer, model.config.max_len)
    ours = translator.translate_ids([translator.source_ids(s) for s in sentences], SearchSettings(beam_size=1))
    same = sum(a == b for a, b in zip(ctranslate2_greedy(folder, tokenizer, sentences), ours, strict=True))
    print(f"greedy {same}/{len(sentences)} identical (CTranslate2 vs PyTorch)")
    if same != len(sentences):
        raise ValueError(f"{len(sentences) - same} CTranslate2 translations differ from ours")


def add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write encoder/decoder ONNX graphs into a model folder and check them")
    p.add_argument("model", help="bundled model name (en-de, de-en) or model folder")
    p.add_argument("--quantize", choices=("int8",), default=None, help="also write int8 graphs (dynamic quantization)")
    p.add_argument("--fp16", action="store_true", help="also write fp16 graphs (for CUDA)")
    p.add_argument("--to", choices=("onnx", "ctranslate2"), default="onnx", help="ONNX graphs or a CTranslate2 model")
    p.add_argument(
        "--check-sentences",
        type=int,
        default=1000,
        help=f"{SPLIT} sentences whose greedy and beam-4 translations must be identical (0: skip; default 1000)",
    )
    p.add_argument("--data", default=None, help="Multi30k folder (default: AIAYN_DATA, ../shared, or download)")
    p.set_defaults(func=cmd_export)
