"""`aiayn bench --profile`: ONNX Runtime's node times of the serving decoder, summed by op type."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.bench.profile import op_split, profile_decoder, profile_report
from aiayn.core.folder import ModelFolder

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "three children play."]


def test_the_split_names_the_decoders_ops_and_sums_to_the_whole(tiny_folder: Path) -> None:
    split = profile_decoder(ModelFolder.open(tiny_folder), SENTENCES, beam=4, batch=2)
    ops = {op.op for op in split.ops}
    assert {"MatMul", "LogSoftmax", "TopK", "GroupQueryAttention", "MultiHeadAttention"} <= ops
    assert sum(op.share for op in split.ops) == pytest.approx(100.0)
    assert split.runs > 0 and 0 < split.node_ms <= split.run_ms
    assert all(op.calls > 0 and op.ms >= 0 for op in split.ops)
    text = profile_report([split], "tiny", top=3)
    assert "tiny, beam 4, batch 2" in text and f"| {split.ops[0].op} |" in text
    assert f"| {len(split.ops) - 3} others |" in text


def test_the_split_is_of_the_variant_asked_for(tiny_folder: Path) -> None:
    split = profile_decoder(ModelFolder.open(tiny_folder), SENTENCES, beam=1, batch=2, variant="w8")
    ops = {op.op for op in split.ops}
    assert "MatMulNBits" in ops and "MatMul" not in ops and "Gemm" not in ops


def test_fences_and_session_events_are_not_node_time() -> None:
    trace = [
        {"cat": "Session", "name": "session_initialization", "dur": 900},
        {"cat": "Session", "name": "model_run", "dur": 10_000},
        {"cat": "Node", "name": "mm_fence_before", "dur": 1, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "mm_kernel_time", "dur": 3_000, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "ls_kernel_time", "dur": 1_000, "args": {"op_name": "LogSoftmax"}},
    ]
    split = op_split(trace)
    assert [(op.op, op.ms, op.share, op.calls) for op in split.ops] == [
        ("MatMul", 3.0, 75.0, 1),
        ("LogSoftmax", 1.0, 25.0, 1),
    ]
    assert split.runs == 1 and split.run_ms == 10.0
