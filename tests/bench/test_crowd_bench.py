"""`aiayn bench --serve`: a small crowd on a real `aiayn serve` process, read back as the bench's table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import aiayn.bench.crowd
from aiayn.bench.crowd import (
    completed_data,
    cpu_seconds,
    json_route_lines,
    measure_crowds,
    measure_json_route,
    serve_report,
)


def test_a_process_cpu_is_read_from_proc() -> None:
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds(os.getpid()) > before


def test_an_event_stream_gives_its_answer_or_its_error() -> None:
    stream = b'event: generating\ndata: null\n\nevent: complete\ndata: ["Zwei Hunde.", "1 sentence(s)"]\n\n'
    assert completed_data(stream) == ["Zwei Hunde.", "1 sentence(s)"]
    with pytest.raises(RuntimeError, match="greater than maximum value 8"):
        completed_data(b'event: error\ndata: "Value 9 is greater than maximum value 8."\n\n')


def test_a_small_crowd_is_measured_and_reported(bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Its time (about 30 s idle) is the servers `aiayn bench --serve` starts, each proven here once: the page under a
    # crowd, Gradio's floor, the metrics and access log on and off, and the CLI on the same lines.
    monkeypatch.setattr(aiayn.bench.crowd, "JSON_BATCHES", 2)
    monkeypatch.setattr(aiayn.bench.crowd, "OPERATIONS_ROUNDS", 2)
    sentences = ["Two dogs play in the snow.", "A girl jumps into the pool.", "A black cat sleeps on the sofa."]
    bench = measure_crowds("en-de", sentences, visitors=(4,))
    (row,) = bench.rows
    assert (row.requests, row.answered, row.refused, row.failed) == (20, 20, 0, 0) and row.identical
    assert row.p50_s <= row.p90_s and row.server_cpu_ms > 0 and row.rss_mb > bench.rss_ready_mb / 2
    assert bench.json_row.sentences == 64 and bench.json_row.identical
    floor = bench.floor  # Gradio's own floor under the same crowd: it answers each text with itself
    assert (floor.visitors, floor.answered, floor.refused, floor.failed) == (4, 20, 0, 0) and floor.identical
    assert floor.server_cpu_ms > 0
    assert bench.cli.sentences == 64 and bench.cli.identical and bench.cli.seconds > 0  # the CLI on the same lines
    report = serve_report(bench)
    assert "| 4 | " in report and "| 0 of 20 |" in report and "sentences/s" in report
    assert "| 4, Gradio's floor |" in report and "its server CPU per answer (goal ≤ 2.5×)" in report
    assert "the JSON route at" in report and "(goal ≥ 0.8×)" in report
    cost = bench.operations  # the same crowd with the metrics and access log and without, in turns
    assert cost.visitors == 4 and len(cost.on) == len(cost.off) == 2 and all(r > 0 for r in cost.ratios)
    assert all(r.answered == 20 and r.identical for r in cost.on + cost.off)
    assert "metrics and access log on against off (--no-metrics --no-access-log), 4 visitors, 2 rounds" in report
    assert all(r > 0 for r in cost.cpu_ratios) and "server CPU per answer on/off median" in report


def test_the_json_route_alone_is_measured_against_the_cli(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`aiayn bench --serve --quick`: the lanes' goal alone, the JSON route's one client against the CLI."""
    monkeypatch.setattr(aiayn.bench.crowd, "JSON_BATCHES", 1)
    json_row, cli = measure_json_route("en-de", ["Two dogs play in the snow.", "A girl jumps into the pool."])
    assert json_row.sentences == cli.sentences == 32 and json_row.identical and cli.identical
    lines = json_route_lines(json_row, cli)
    assert "1 batches of 32 sentences, beam 4" in lines[0] and "the JSON route at" in lines[1]
