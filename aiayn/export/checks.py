"""`aiayn export` as a library: write the ONNX graphs (or a CTranslate2 model) into a folder, then prove them.

Every check that can fail raises (``ParityError``, a ValueError): the exported
model must compute what PyTorch computes. Each function returns the lines of
its report; the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE
from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines import ONNX, ONNX_PORTABLE, TORCH, Engine
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.evaluation.evaluate import evaluate
from aiayn.evaluation.metrics import Scores
from aiayn.export.ctranslate2 import ctranslate2_greedy, ctranslate2_outputs, export_ctranslate2
from aiayn.export.onnx_export import export_onnx
from aiayn.export.parity import TOLERANCE, ParityError, check_logits, count_identical, max_log_prob_diff
from aiayn.model.transformer import Transformer
from aiayn.search.translator import SearchSettings, Translator

PARITY_SENTENCES = 100  # the fp32 log-prob check; the identical-translation check takes --check-sentences
INT8_BLEU_GOAL = 0.3  # largest BLEU drop we accept from int8 without saying so


def torch_engine(folder: ModelFolder, model: Transformer) -> Engine[object]:
    """The torch engine over the model just exported, as it is in memory."""
    return load_engine(folder, EngineOptions(TORCH, "cpu", lanes=1), model)


def portable(folder: ModelFolder, variant: str = "fp32", device: str = "cpu") -> Translator:
    """The exported graphs of ``variant``, as the portable engine runs them."""
    return translator_for(folder, load_engine(folder, EngineOptions(ONNX_PORTABLE, device, variant)))


FP16_SANITY = 1.0  # fp16 log-probs further than this from fp32 mean a broken graph, not rounding
FALLBACK_SENTENCES = [  # used when no sentences of the folder's pair are at hand
    "A dog runs across the green grass.",
    "Two children are playing with a red ball on the beach.",
    "A woman in a blue coat is waiting for the bus.",
    "The old man sits on a bench and reads a newspaper.",
    "People walk down a busy street at night.",
    "A cyclist rides past a small shop.",
    "Three musicians perform on a stage in front of a crowd.",
    "A girl jumps into the swimming pool.",
]


@dataclass(frozen=True)
class VariantGap:
    """How far a variant's graphs are from the fp32 ones."""

    provider: str
    max_abs_diff: float  # an error figure, not a parity bound
    identical: int  # greedy translations equal to fp32's among the checked ones


def megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def export_and_prove_onnx(
    model: Transformer, folder: ModelFolder, sentences: list[str], variants: Sequence[str], check_sentences: int
) -> list[str]:
    """Write the graphs, then check fp32 log-probs and translations against PyTorch; raise on any gap."""
    export_onnx(model, folder, variants)
    lines = []
    for variant in ("fp32", *variants):
        files = [folder.onnx_file(graph, variant) for graph in (ENCODER_FILE, DECODER_FILE)]
        lines.append(f"wrote {variant}: " + ", ".join(f"{f.name} {megabytes(f.stat().st_size)}" for f in files))
    bundle = [folder.weights_file, folder.onnx_file(ENCODER_FILE), folder.onnx_file(DECODER_FILE)]
    lines.append(f"model.safetensors + fp32 graphs: {megabytes(sum(f.stat().st_size for f in bundle))}")

    torch_translator = translator_for(folder, torch_engine(folder, model))
    onnx_translator = portable(folder)
    src_ids = [torch_translator.source_ids(s) for s in sentences]
    report = check_logits(torch_translator.engine, onnx_translator.engine, src_ids[:PARITY_SENTENCES])
    lines.append(
        f"parity: max |log-prob difference| ONNX Runtime (CPU, all graph optimizations) vs PyTorch "
        f"= {report.max_abs_diff:.2e} over {report.steps} steps of {report.sentences} sentences in batches "
        f"{', '.join(f'{b}x{s}' for b, s in report.batch_shapes)} (tolerance {TOLERANCE:.0e})"
    )
    checked = src_ids[:check_sentences]
    if not checked:
        return lines
    counts = [
        (name, count_identical(torch_translator, onnx_translator, checked, settings))
        for name, settings in (("greedy", SearchSettings(beam_size=1)), ("beam-4", SearchSettings(beam_size=4)))
    ]
    lines.append(", ".join(f"{name} {same}/{len(checked)} identical" for name, same in counts) + " (ONNX vs PyTorch)")
    for name, same in counts:
        if same != len(checked):
            raise ParityError(f"{len(checked) - same} {name} translations differ between ONNX and PyTorch")
    return lines + prove_serving_graphs(folder, onnx_translator, src_ids, check_sentences)


def prove_serving_graphs(
    folder: ModelFolder, reference: Translator, src_ids: list[list[int]], check_sentences: int
) -> list[str]:
    """The CPU serving graphs (built from the same weights when an engine loads) against the contract's
    graphs just proven: the same tolerance and identical translations, or the export fails."""
    fused = translator_for(folder, load_engine(folder, EngineOptions(ONNX, "cpu")))
    report = check_logits(reference.engine, fused.engine, src_ids[:PARITY_SENTENCES])
    lines = [f"serving graphs: max |log-prob difference| vs decoder.onnx = {report.max_abs_diff:.2e}"]
    checked = src_ids[:check_sentences]
    if not checked:
        return lines
    for name, beam in (("greedy", 1), ("beam-4", 4)):
        same = count_identical(reference, fused, checked, SearchSettings(beam_size=beam))
        if same != len(checked):
            raise ParityError(
                f"{len(checked) - same} {name} translations differ between the serving graphs and decoder.onnx"
            )
        lines.append(f"serving graphs: {name} {same}/{len(checked)} identical to decoder.onnx")
    return lines


def against_fp32(
    folder: ModelFolder, variant: str, device: str, sentences: list[str], check_sentences: int
) -> VariantGap:
    """A variant's provider, its max |log-prob difference| from the fp32 graphs and how many of the first
    ``check_sentences`` greedy translations stay the same."""
    reference, candidate = portable(folder), portable(folder, variant, device)
    src_ids = [reference.source_ids(s) for s in sentences]
    gap = max_log_prob_diff(reference.engine, candidate.engine, src_ids[:PARITY_SENTENCES]).max_abs_diff
    same = count_identical(reference, candidate, src_ids[:check_sentences], SearchSettings(beam_size=1))
    return VariantGap(candidate.engine.provider, gap, same)


def bleu_by_variant(
    folder: ModelFolder, corpus: ParallelCorpus, variants: Sequence[str], beam_size: int = 4
) -> dict[str, Scores]:
    """sacreBLEU of each ONNX variant's translations of ``corpus`` (ONNX Runtime on the CPU)."""
    settings = SearchSettings(beam_size=beam_size)
    return {
        variant: evaluate(
            portable(folder, variant),
            corpus,
            settings,
            progress=False,
        ).scores
        for variant in variants
    }


def report_int8(
    folder: ModelFolder, sentences: list[str], corpus: ParallelCorpus | None, check_sentences: int
) -> list[str]:
    """How far int8 moves the log-probs, and what it costs in BLEU on the test set."""
    gap = against_fp32(folder, "int8", "cpu", sentences, check_sentences)
    lines = [
        f"int8: max |log-prob difference| vs fp32 = {gap.max_abs_diff:.3f}, "
        f"greedy {gap.identical}/{check_sentences} identical to fp32"
    ]
    if corpus is None:
        return [*lines, "int8: BLEU not measured (no references at hand, or --check-sentences 0)"]
    scores = bleu_by_variant(folder, corpus, ("fp32", "int8"))
    drop = scores["fp32"].bleu - scores["int8"].bleu
    verdict = "within" if drop <= INT8_BLEU_GOAL else "ABOVE"
    return [
        *lines,
        f"BLEU {corpus.split} ({len(corpus)} sentences, beam 4, ONNX Runtime CPU): fp32 {scores['fp32'].bleu:.2f}, "
        f"int8 {scores['int8'].bleu:.2f}, drop {drop:.2f} ({verdict} the {INT8_BLEU_GOAL} goal)",
    ]


def report_fp16(folder: ModelFolder, sentences: list[str], check_sentences: int) -> list[str]:
    """The fp16 graphs are meant for CUDA: run them on it where there is one, else on the CPU, and say which."""
    gap = against_fp32(folder, "fp16", "auto", sentences, check_sentences)
    if not gap.max_abs_diff < FP16_SANITY:  # NaN, or fp16 overflowed somewhere
        raise ValueError(f"the fp16 graphs are broken: max |log-prob difference| vs fp32 = {gap.max_abs_diff:.3g}")
    where = "CUDA" if gap.provider == "CUDAExecutionProvider" else "ONNX Runtime CPU; CUDA was not run"
    return [
        f"fp16 ({where}): max |log-prob difference| vs fp32 = {gap.max_abs_diff:.3f}, "
        f"greedy {gap.identical}/{check_sentences} identical"
    ]


def export_to_ctranslate2(
    model: Transformer, folder: ModelFolder, sentences: list[str], overwrite: bool = False
) -> list[str]:
    """Write folder/ctranslate2 and show that its greedy output equals ours, token for token; and say how many of
    its beam outputs at the folder's defaults do (``translate_batch_options``: exact where the folder's
    normalisation is |Y|^α, CTranslate2's own, but for equal scores computed in another order)."""
    target = export_ctranslate2(model, folder.tokenizer, folder.path, overwrite)
    translator = translator_for(folder, torch_engine(folder, model))
    sources = [translator.source_ids(s) for s in sentences]
    ours = translator.translate_ids(sources, SearchSettings(beam_size=1))
    theirs = ctranslate2_greedy(folder.path, folder.tokenizer, sentences)
    same = sum(a == b for a, b in zip(theirs, ours, strict=True))
    if same != len(sentences):
        raise ValueError(f"{len(sentences) - same} CTranslate2 translations differ from ours")
    report = [f"wrote {target}", f"greedy {same}/{len(sentences)} identical (CTranslate2 vs PyTorch)"]
    beam = SearchSettings.of(folder)
    if beam.beam_size > 1:
        ours = translator.translate_ids(sources, beam)
        theirs = ctranslate2_outputs(folder.path, folder.tokenizer, sentences, beam)
        same = sum(a == b for a, b in zip(theirs, ours, strict=True))
        report.append(
            f"beam {beam.beam_size} at translate_batch(beam_size={beam.beam_size}, length_penalty="
            f"{beam.length_penalty}, min_decoding_length={beam.min_len}): {same}/{len(sentences)} identical"
            + ("" if beam.length_normalization == "power" else " (CTranslate2 has |Y|^α, the folder GNMT's lp)")
        )
    return report


def export_folder(
    model: Transformer,
    folder: ModelFolder,
    sentences: list[str],
    corpus: ParallelCorpus | None = None,
    to: str = "onnx",
    variants: Sequence[str] = (),
    check_sentences: int = 1000,
    overwrite: bool = False,
) -> list[str]:
    """Everything `aiayn export` does: ONNX graphs (and ``variants``) or a CTranslate2 model (``overwrite``: in place
    of a ctranslate2/ folder it did not write), proven on ``sentences``; ``corpus``, where the sentences have
    references, also scores int8 in BLEU."""
    if check_sentences < 0:
        raise ValueError(f"--check-sentences must be 0 or more, got {check_sentences}")
    if to == "ctranslate2" and variants:
        raise ValueError("--variant int8 and fp16 are ONNX graphs; leave --variant out with --to ctranslate2")
    sentences = sentences[: max(check_sentences, PARITY_SENTENCES)]
    if to == "ctranslate2":
        return export_to_ctranslate2(model, folder, sentences[: max(check_sentences, 1)], overwrite)
    lines = export_and_prove_onnx(model, folder, sentences, variants, check_sentences)
    if folder.tidy_tokenizer():
        lines.append(f"{folder.tokenizer_file}: its normalizer now does all the text tidying (docs/onnx.md)")
    check = min(check_sentences, len(sentences))
    if "int8" in variants:
        lines += report_int8(folder, sentences, corpus.head(check) if corpus is not None and check else None, check)
    if "fp16" in variants:
        lines += report_fp16(folder, sentences, check)
    return lines
