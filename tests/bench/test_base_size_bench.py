"""The base-size rows: a random model at a preset's size, every engine decoding outputs of one fixed length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from aiayn.bench.base_size import (
    BasePlan,
    base_appended,
    base_folder,
    base_json,
    base_report,
    check_lengths,
    run_base_bench,
)
from aiayn.bench.engines import CUDA_CONFIGS, device_framing
from aiayn.core.config import PRESETS
from aiayn.core.folder import ModelFolder

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus", "three children play."]
TINY = PRESETS["tiny"].replace(n_encoder_layers=1, n_decoder_layers=2, d_model=32, d_ff=64)


def test_the_base_folder_is_the_presets_size_with_the_benchs_tokenizer(tiny_folder: Path, tmp_path: Path) -> None:
    folder = ModelFolder.open(tiny_folder)
    base = base_folder(folder, tmp_path / "base", PRESETS["base"].replace(n_encoder_layers=1, n_decoder_layers=1))
    config = base.config
    assert (config.d_model, config.d_ff, config.n_heads) == (512, 2048, 8)
    assert (
        config.vocab_size == 37000 == base.tokenizer.vocab_size
        and config.special_tokens == folder.config.special_tokens
    )
    sentence = "the red cat sleeps."
    assert base.tokenizer.encode_source(sentence) == folder.tokenizer.encode_source(sentence)
    assert base.weights_file.is_file() and base.ctranslate2_dir.is_dir()
    again = base_folder(folder, tmp_path / "again", PRESETS["base"].replace(n_encoder_layers=1, n_decoder_layers=1))
    first, second = (load_file(str(f.weights_file)) for f in (base, again))
    assert all(np.array_equal(first[name], second[name]) for name in first)  # seeded


def test_every_engine_decodes_the_fixed_length_and_says_its_memory(tiny_folder: Path) -> None:
    # Its time (about 30 s idle, most of it processes starting) is the bench's own framings, all 14 setups, each in
    # a process of its own: what proves their comparisons and each engine's memory as `aiayn bench` runs them.
    plan = BasePlan(rounds=2, length=7, sentences=2, batch_sentences=4)
    result = run_base_bench(ModelFolder.open(tiny_folder), SENTENCES, plan, TINY)
    one, two = "onnx fp32 1×1", "onnx fp32 2×1"
    rows = {(r.engine, r.search, r.batch) for r in result.rows}
    assert (one, "greedy", 1) in rows and (two, "beam 4", 32) in rows and (two, "greedy", 1) not in rows
    assert all(r.tokens_per_s > 0 for r in result.rows)
    assert {r.framing for r in result.ratios} == {"base size, 1 thread each", "base size, 2 cores on one batch"}
    # 1 thread: ours against CTranslate2, w8 and w4 against fp32, w4 against w8, w8 and int8 against CTranslate2's
    # int8 (3 configurations each); 2 cores: ours and int8 against CTranslate2, w8 and w4 against fp32 (batch 32 only).
    assert len(result.ratios) == 6 * 3 + 4 * 2 and all(r.low <= r.median <= r.high for r in result.ratios)
    pairs = {(r.ours, r.peer.rpartition(" ")[0]) for r in result.ratios}
    assert {("onnx w8 1×1", "onnx fp32"), ("onnx w4 2×1", "onnx fp32"), ("onnx int8 2×1", "ctranslate2 int8")} <= pairs
    for f in result.footprints:
        assert 30 < f.loaded_mb <= f.load_peak_mb <= f.peak_mb
    text = base_report(result)
    assert "every output 7 tokens" in text and "peak while loading" in text and "onnx fp32 1×1 / ctranslate2" in text
    assert base_json(result)["plan"]["length"] == 7
    appended = base_appended(result)  # what the speed table's report appends: its rounds join the table's
    assert appended.text == text and len(appended.watched) == 2 and appended.ratios == result.ratios


def test_the_gpu_rows_up_to_batches_of_128_with_each_engines_gpu_memory(tiny_folder: Path) -> None:
    """`aiayn bench --device cuda`'s framing and configurations, here on the CPU (fp32): the code a lent GPU runs,
    proven before its minutes are spent (``scripts/gpu_session.sh``'s dry run runs this test)."""
    framing = device_framing("cpu", ("fp32",))
    plan = BasePlan(rounds=1, length=5, sentences=2, batch_sentences=4)
    result = run_base_bench(ModelFolder.open(tiny_folder), SENTENCES * 32, plan, TINY, (framing,), CUDA_CONFIGS)
    assert {(r.engine, r.search, r.batch) for r in result.rows} == {
        (engine, search, batch)
        for engine in ("onnx fp32 1×1", "ctranslate2 fp32 1×1")
        for search, batch in (("greedy", 1), ("greedy", 32), ("greedy", 128), ("beam 4", 32), ("beam 4", 128))
    }
    assert len(result.ratios) == len(CUDA_CONFIGS) and {r.peer for r in result.ratios} == {"ctranslate2 fp32 1×1"}
    assert all(f.gpu_mb == 0 for f in result.footprints)  # no GPU here: nvidia-smi lists no process of theirs
    assert "| GPU MiB |" in base_report(result)


def test_an_engine_that_ends_early_voids_the_comparison() -> None:
    runs = [{"outputs": [[5, 6, 7], [5, 6]]}]
    with pytest.raises(RuntimeError, match="output lengths"):
        check_lengths({("onnx fp32 1×1", 1, 32): runs}, 3)
