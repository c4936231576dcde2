"""`aiayn bench --train`: each variant in its own process on the same batches; medians, ranges and ratios."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aiayn.bench.training import TrainPlan, run_train_bench, train_report, write_batches
from aiayn.core.config import ModelConfig
from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import train_tokenizer
from aiayn.data.multi30k import ParallelCorpus

WORDS = "red blue green cat dog bird runs sleeps jumps big small old".split()


def tiny(tmp_path: Path) -> tuple[ModelFolder, ParallelCorpus]:
    rng = np.random.default_rng(0)
    src = [" ".join(rng.choice(WORDS, rng.integers(2, 7))) for _ in range(400)]
    corpus = ParallelCorpus(src, [s.upper() for s in src], "en", "de", "train")
    config = ModelConfig(vocab_size=80, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
    tokenizer = train_tokenizer(corpus.src + corpus.tgt, config.vocab_size, config.special_tokens)
    return ModelFolder.create(tmp_path / "model", config.replace(vocab_size=tokenizer.vocab_size), tokenizer), corpus


def test_the_batches_are_the_trainers_first_of_epoch_0(tmp_path: Path) -> None:
    folder, corpus = tiny(tmp_path)
    saved = np.load(write_batches(folder, corpus, 2, tmp_path / "b.npz"))
    assert sorted(saved.files) == sorted(f"{n}_{i}" for n in ("src", "tgt_in", "tgt_out") for i in range(2))
    assert (saved["tgt_in_0"][:, 0] == folder.config.special_tokens.bos).all()
    assert saved["src_0"].size <= 4096 and saved["tgt_out_1"].dtype == np.int64


def test_variants_take_turns_and_the_ratios_have_their_range(tmp_path: Path) -> None:
    folder, corpus = tiny(tmp_path)
    variants = ("today fp32", "ours fp32")
    result = run_train_bench(folder, corpus, TrainPlan(rounds=2, warmup=1, steps=1), variants)
    assert set(result["tokens_per_s"]) == set(variants) and len(result["per_round"]) == 2
    assert all(s["min"] <= s["median"] <= s["max"] for s in result["ratio"].values())
    assert set(result["ratio"]) == {"ours fp32 / today fp32", "best (ours fp32) / today fp32"}
    text = train_report(result, tmp_path / "train.json")
    assert "ours fp32 / today fp32:" in text and "range" in text and text.startswith("Machine: ")
    assert len(result["conditions"]["rounds"]) == 2  # each round's load and share of the CPU
    assert json.loads((tmp_path / "train.json").read_text())["ratio"] == result["ratio"]


def test_marian_is_built_with_our_sizes_and_tied_embeddings(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers (the dev extra) is not installed")
    from aiayn.bench.training_worker import load_batches, make_step, marian_config

    folder, corpus = tiny(tmp_path)
    config = folder.config
    marian = marian_config(config)
    assert (marian.d_model, marian.encoder_layers, marian.decoder_attention_heads, marian.decoder_ffn_dim) == (
        config.d_model,
        config.n_encoder_layers,
        config.n_heads,
        config.d_ff,
    )
    assert marian.vocab_size == config.vocab_size and marian.tie_word_embeddings
    step = make_step("marian fp32", config)  # asserts the three-way tie
    step(load_batches(str(write_batches(folder, corpus, 1, tmp_path / "b.npz")))[0])
