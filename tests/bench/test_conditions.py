"""A bench knows its machine and when it was not alone: the header every report carries, each round's load and
share of the CPU, and the warning that ends a run taken beside other work or whose ratios spread."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from itertools import count
from pathlib import Path

import pytest

from aiayn.bench.conditions import Quiet, Round, Watch, cpu_info, format_header, machine_header, own_cpu_s
from aiayn.bench.run import BenchResult, Ratio, report

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""
WARNING_END = "Consider re-running this benchmark on a quiet system."
HEADER = {"cpu": "AMD EPYC", "cores": 2, "instruction_sets": ["AVX2"], "commit": "0123abcd", "command": "aiayn bench"}


def counter(step: float) -> Callable[[], float]:
    """A CPU-time reading that grows by ``step`` seconds between two reads."""
    ticks: Iterator[int] = count()
    return lambda: step * next(ticks)


def watched(loads: list[float], own_step: float, machine_step: float = 1.0) -> list[Round]:
    """The rounds a Watch records over ``loads``, the bench taking ``own_step`` of each ``machine_step`` of CPU."""
    readings = iter(loads)
    watch = Watch(2, read_load=lambda: next(readings), read_machine=counter(machine_step), read_own=counter(own_step))
    for _ in loads:
        watch.round_done()
    return watch.rounds


def bench_result(rounds: list[Round], low: float = 0.95, high: float = 1.05) -> BenchResult:
    ratio = Ratio("1 thread each", "onnx fp32 1×1", "ctranslate2 fp32 1×1", "greedy", 1, 1.0, low, high)
    return BenchResult([], [ratio], None, len(rounds), rounds)


def test_the_header_names_the_cpu_its_instruction_sets_the_commit_and_the_command() -> None:
    assert cpu_info(CPUINFO) == (
        "Intel(R) Xeon(R) Platinum 8480+",
        ["AVX2", "AVX-512", "AVX-512 VNNI", "AVX-512 BF16", "AMX-INT8", "AMX-BF16"],
    )
    header = machine_header(["bench", "--quick", "--json", "a b.json"])
    assert header["command"] == "aiayn bench --quick --json 'a b.json'" and header["cores"] >= 1
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's clean clone is one): its commit, marked where files differ
        assert header["commit"].split()[0] == head.stdout.strip()
    text = format_header(HEADER)
    assert text == "Machine: AMD EPYC, 2 cores (AVX2); commit 0123abcd; `aiayn bench`"


def test_each_round_records_its_load_and_the_benchs_share_of_the_machines_cpu() -> None:
    assert watched([0.5, 1.25], own_step=0.9) == [Round(0.5, 0.9), Round(1.25, 0.9)]
    assert watched([0.5], own_step=1.2)[0].share == 1.0  # never more than all of it (readings taken apart)


def test_a_quiet_run_ends_without_a_warning_and_says_so_in_its_json(tmp_path: Path) -> None:
    text = report(bench_result(watched([1.8, 2.0], own_step=0.97)), tmp_path / "bench.json", header=HEADER)
    assert text.startswith("Machine: AMD EPYC, 2 cores (AVX2); commit 0123abcd") and WARNING_END not in text
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert figures["machine"] == HEADER
    assert figures["conditions"]["max_load"] == 2.0 and figures["conditions"]["min_share"] == 0.97
    assert abs(figures["conditions"]["spread"] - 0.05) < 1e-9 and figures["conditions"]["warning"] is None


def test_a_run_beside_other_work_or_with_spread_ratios_ends_with_the_warning(tmp_path: Path) -> None:
    loaded = report(bench_result(watched([1.5, 4.2], own_step=0.97)), tmp_path / "loaded.json", header=HEADER)
    assert loaded.splitlines()[-1].endswith(WARNING_END) and "load average up to 4.2 on the 2 cores" in loaded
    figures = json.loads((tmp_path / "loaded.json").read_text())["conditions"]
    assert figures["max_load"] == 4.2 and figures["warning"] == loaded.splitlines()[-1]
    # The load average lags by a minute: a share of the CPU time under SHARE_FLOOR tells at once.
    shared = report(bench_result(watched([1.0, 1.0], own_step=0.5)), None, header=HEADER)
    assert shared.splitlines()[-1].endswith(WARNING_END) and "as little as 50% of the machine's CPU time" in shared
    spread = report(bench_result(watched([1.0], own_step=0.97), low=0.8, high=1.1), None, header=HEADER)
    assert spread.splitlines()[-1].endswith(WARNING_END) and "ratios spread ±20% around their median" in spread


def test_the_benchs_cpu_time_counts_its_workers_while_they_run() -> None:
    """A worker alive (not yet waited for, as the bench's are through its rounds) counts with its CPU time."""
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint(flush=True)"
    before = own_cpu_s()
    worker = subprocess.Popen(
        [sys.executable, "-c", f"{spin}\nimport sys; sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"\n"  # it has spun
        during = own_cpu_s()
    finally:
        worker.communicate(timeout=60)
    assert before is not None and during is not None and during - before >= 0.25


def test_two_busy_processes_beside_a_round_make_it_end_with_the_warning() -> None:
    """Real processes, not this test's children (a shell starts them and exits), keep both cores busy while this
    process works; the round's share of the machine's CPU time falls below the floor at once."""
    spin = "import time; end = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
    launched = subprocess.run(
        ["sh", "-c", f'for i in 1 2; do "{sys.executable}" -c "{spin}" >/dev/null 2>&1 & echo $!; done'],
        capture_output=True,
        text=True,
        check=True,
    )
    hogs = [int(pid) for pid in launched.stdout.split()]
    try:
        time.sleep(0.3)
        watch = Watch(2)
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        watch.round_done()
    finally:
        for pid in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    quiet = Quiet(2, watch.rounds, 0.0)
    assert watch.rounds[0].share is not None and watch.rounds[0].share < 0.6
    assert quiet.warning is not None and quiet.warning.endswith(WARNING_END)


def test_every_other_mode_prints_the_header_and_is_watched_as_one_round(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aiayn bench --sessions N` (or any mode but the speed table and --train): the machine first, the whole run
    as one round after, the warning where it was not alone."""
    import aiayn.bench.conditions
    import aiayn.cli.bench
    from aiayn.cli import main

    monkeypatch.setitem(aiayn.cli.bench.MODES, "sessions", lambda folder, args: "| the mode's table |")
    for load, warned in ((0.5, False), (5.0, True)):
        monkeypatch.setattr(
            aiayn.bench.conditions,
            "Watch",
            partial(Watch, read_load=partial(float, load), read_machine=counter(1.0), read_own=counter(0.95)),
        )
        assert main(["bench", "--sessions", "3"]) in (0, None)
        out = capsys.readouterr().out.strip().splitlines()
        assert out[0].startswith("Machine: ") and out[0].endswith("; `aiayn bench --sessions 3`")
        assert "| the mode's table |" in out
        assert out[-1].endswith(WARNING_END) == warned
