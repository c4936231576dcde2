"""`aiayn bench --search`: the search's host work on a stub step model, and the serving engine's apart from its runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from aiayn.bench import search_cost
from aiayn.bench.process import RUN_FILE, Worker
from aiayn.bench.search_cost import STUB_LENGTH, EngineHost, Row, StubStep, search_report, stub_ms
from aiayn.core.folder import ModelFolder
from aiayn.search import beam_search

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "three children play."]


def test_the_stub_answers_as_the_engines_head_does_and_never_ends() -> None:
    stub = StubStep(vocab=50, bos=2, eos=3, pad=0, never_generate=(), rows=8)
    rows = stub.start(np.zeros((2, 5), np.int64))
    values, ids, rows = stub.step_top(rows, np.zeros((2, 1), np.int64), 9)
    assert values.shape == ids.shape == (2, 9) and values.dtype == np.float32 and ids.dtype == np.int64
    assert (np.diff(values, axis=1) <= 0).all()  # best first
    assert all(len(set(row)) == 9 for row in ids.tolist()) and not (ids == 3).any()
    outputs = beam_search(stub, np.zeros((2, 5), np.int64), 4, max_len=STUB_LENGTH)
    assert [len(o.tokens) for o in outputs] == [STUB_LENGTH, STUB_LENGTH] and stub.calls == 1 + STUB_LENGTH


def test_each_measurement_is_a_time_per_step(tiny_folder: Path) -> None:
    folder = ModelFolder.open(tiny_folder)
    assert 0 < stub_ms(folder, 4, 2) < 50
    host = EngineHost(str(tiny_folder))
    assert 0 < host.ms(SENTENCES, 4, 2, None) < 50
    assert host.steps.steps > 0 and 0 < host.session.spent < host.steps.spent  # the runs are inside the steps


def test_a_baseline_checkouts_worker_runs_this_file_over_its_own_aiayn(tmp_path: Path, tiny_folder: Path) -> None:
    # A checkout whose aiayn says where it is: the worker must import that one, not ours.
    fake = tmp_path / "checkout" / "aiayn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    probe = tmp_path / "probe.py"
    probe.write_text("import sys, aiayn\nprint(aiayn.__file__, sys.argv[1:])\n")
    run = subprocess.run(
        [sys.executable, "-c", RUN_FILE, str(probe), "x"],
        cwd=fake.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == f"{fake / '__init__.py'} ['x']"
    worker = Worker("ours", "", str(tiny_folder), str(tiny_folder), script=Path(search_cost.__file__))
    try:
        assert worker.ready == {"ready": True}
        assert worker.ask({"part": "stub", "beam": 1, "sentences": 2})["ms"] > 0
        assert worker.ask({"part": "engine", "beam": 1, "batch": 2, "sentences": SENTENCES})["ms"] > 0
    finally:
        worker.close()


def test_the_report_gives_medians_ranges_and_ratios() -> None:
    rows = [Row("stub", 4, 4, [0.1, 0.3, 0.2], [0.4, 0.3, 0.6]), Row("base", 1, 32, [1.0], [2.0])]
    text = search_report(rows, baseline=True)
    assert "| beam 4 | 4 | 0.200 (0.100–0.300) | 0.400 (0.300–0.600) | 3.00 (1.00–4.00)× |" in text
    assert "| greedy | 32 | 1.000 (1.000–1.000) | 2.000 (2.000–2.000) | 2.00 (2.00–2.00)× |" in text
    assert "baseline" not in search_report(rows, baseline=False)
