"""The bench runs engines in their own processes, round by round, and reports ratios with their range."""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.bench.run import Plan, report, run_bench
from aiayn.core.folder import ModelFolder

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus", "three children play."]


def test_interleaved_rounds_give_ratios_with_their_range_and_a_serving_row(tiny_folder: Path, tmp_path: Path) -> None:
    plan = Plan(rounds=2, sentences=4, tutorial_sentences=2, serving_rounds=1)
    engines = ("onnx fp32", "ctranslate2 fp32")
    result = run_bench(ModelFolder.open(tiny_folder), SENTENCES * 4, SENTENCES * 4, plan, engines)
    assert {(r.engine, r.search, r.batch) for r in result.rows} == {
        (e, s, b) for e in engines for s in ("greedy", "beam 4") for b in (1, 32)
    }
    assert len(result.ratios) == 4 and all(r.low <= r.median <= r.high for r in result.ratios)
    serving = result.serving
    assert serving is not None and serving.requests == 16 and serving.errors == 0 and serving.identical
    text = report(result, tmp_path / "bench.json")
    assert "onnx fp32 / ctranslate2 fp32, greedy, batch 1:" in text and "range" in text and "Serving" in text
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert figures["ratios"]["onnx fp32 / ctranslate2 fp32, beam 4, batch 32"]["ratio"] > 0
    assert figures["serving"]["identical"] is True and figures["rounds"] == 2
