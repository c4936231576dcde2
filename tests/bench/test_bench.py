"""The bench runs engines in their own processes, round by round, and reports ratios with their range."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import aiayn
from aiayn.bench.engines import Framing, Setup, with_baseline
from aiayn.bench.run import Plan, measure_rounds, report, run_bench
from aiayn.core.folder import ModelFolder

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus", "three children play."]


def test_interleaved_rounds_give_ratios_with_their_range_and_a_serving_row(tiny_folder: Path, tmp_path: Path) -> None:
    plan = Plan(rounds=2, sentences=4, tutorial_sentences=2, serving_rounds=1)
    one = Framing(
        "1 thread each",
        (Setup("onnx fp32"), Setup("ctranslate2 fp32")),
        (("onnx fp32 1×1", ("ctranslate2 fp32 1×1",)),),
    )
    two = Framing(
        "2 cores",
        (Setup("onnx fp32", lanes=2), Setup("ctranslate2 fp32", lanes=2), Setup("ctranslate2 fp32", threads=2)),
        (("onnx fp32 2×1", ("ctranslate2 fp32 2×1", "ctranslate2 fp32 1×2")),),
    )
    # Greedy at batch 1 and beam 4 at batch 32 (the bench's four configurations are these two's crossings): each
    # search and each batch size once, half the rounds' work of all four (the test took 100 s of CPU with them).
    configs = ((1, 1), (4, 32))
    result = run_bench(ModelFolder.open(tiny_folder), SENTENCES * 4, SENTENCES * 4, plan, (one, two), configs)
    labels = ("onnx fp32 1×1", "ctranslate2 fp32 1×1", "onnx fp32 2×1", "ctranslate2 fp32 2×1", "ctranslate2 fp32 1×2")
    assert {(r.engine, r.search, r.batch) for r in result.rows} == {
        (e, s, b) for e in labels for s, b in (("greedy", 1), ("beam 4", 32))
    }
    assert len(result.ratios) == 4 and all(r.low <= r.median <= r.high for r in result.ratios)
    # Against the faster of CTranslate2's two ways of using two cores, configuration by configuration.
    assert {r.peer for r in result.ratios if r.framing == "2 cores"} <= {"ctranslate2 fp32 2×1", "ctranslate2 fp32 1×2"}
    # Lanes take whole batches: the outputs, and so the BLEU, are those of one lane.
    bleu = {(r.engine, r.search, r.batch): r.bleu for r in result.rows}
    assert all(bleu["onnx fp32 2×1", s, b] == bleu["onnx fp32 1×1", s, b] for s, b in (("greedy", 1), ("beam 4", 32)))
    serving = result.serving
    assert serving is not None and serving.requests == 16 and serving.errors == 0 and serving.identical
    assert len(result.watched) == plan.rounds  # each round's load and share of the CPU (tests/bench/test_conditions.py)
    text = report(result, tmp_path / "bench.json")
    assert "2 cores: onnx fp32 2×1 / ctranslate2 fp32" in text and "range" in text and "Serving" in text
    assert text.startswith("Machine: ")
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert len(figures["conditions"]["rounds"]) == 2 and figures["machine"]["cores"] >= 1
    ratio = next(r for r in figures["ratios"] if r["framing"] == "1 thread each" and r["search"] == "beam 4")
    assert ratio["ctranslate2"] == "ctranslate2 fp32 1×1" and ratio["ratio"] > 0
    assert figures["serving"]["identical"] is True and figures["rounds"] == 2


def test_bench_on_cuda_says_why_not_where_no_gpu_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from aiayn.cli import main
    from aiayn.engines.onnx.sessions import gpu_unavailable

    reason = gpu_unavailable(1)
    if not reason:
        pytest.skip("a GPU runs ONNX Runtime here: `aiayn bench --device cuda` runs in full (scripts/gpu_session.sh)")
    assert main(["bench", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: ONNX Runtime cannot run on a GPU here" in err and reason in err and "Traceback" not in err


def test_a_baseline_checkout_runs_in_the_same_rounds_from_its_own_code(tiny_folder: Path, tmp_path: Path) -> None:
    """`aiayn bench --baseline DIR`: our setups again from another checkout (here a copy of this one whose worker
    says where it came from), held against the same peers, and ours against them."""
    framing = with_baseline(
        Framing(
            "1 thread each",
            (Setup("onnx fp32"), Setup("onnx w8"), Setup("ctranslate2 fp32")),
            (("onnx fp32 1×1", ("ctranslate2 fp32 1×1",)), ("onnx w8 1×1", ("onnx fp32 1×1",))),
        ),
        tmp_path,
    )
    twin = "onnx fp32 1×1 (baseline)"
    assert [s.label for s in framing.setups] == ["onnx fp32 1×1", "onnx w8 1×1", "ctranslate2 fp32 1×1", twin]
    assert framing.comparisons[2:] == ((twin, ("ctranslate2 fp32 1×1",)), ("onnx fp32 1×1", (twin,)))
    source = Path(aiayn.__file__).parent
    shutil.copytree(source, tmp_path / "aiayn", ignore=shutil.ignore_patterns("__pycache__"))
    worker = tmp_path / "aiayn" / "bench" / "worker.py"
    worker.write_text(worker.read_text().replace('answer({"ready": True,', 'answer({"ready": True, "from": "copy",'))
    ours, baseline = framing.setups[0], framing.setups[-1]
    _, ready = measure_rounds(tiny_folder, [ours, baseline], 1, ((1, 1),), lambda *_: None)
    assert ready[twin].get("from") == "copy" and "from" not in ready[ours.label]
