"""The suite's guard (tests/time_limit.py): a test over the limit fails the run unless it is listed with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from time_limit import SLOW_TESTS, Timing, over_limit

SPIN = '''
import time


def test_quick():
    pass


def test_spins():
    end = time.process_time() + 0.8  # over 0.2 s alone on any number of cores up to 4
    while time.process_time() < end:
        pass
'''


def test_a_test_over_the_limit_alone_is_named_unless_listed() -> None:
    timings = {
        "a::cpu_bound": Timing(wall_s=200.0, cpu_s=130.0, slowdown=4.0),  # 50 s by the load, 65 s by its CPU
        "a::waits": Timing(wall_s=130.0, cpu_s=2.0, slowdown=2.0),  # 65 s alone
        "a::loaded": Timing(wall_s=150.0, cpu_s=100.0, slowdown=3.0),  # 50 s alone: the machine's, not the test's
        "a::threads": Timing(wall_s=40.0, cpu_s=70.0, slowdown=1.0),  # 70 s of CPU on 2 cores in 40 s
        "a::listed": Timing(wall_s=90.0, cpu_s=80.0, slowdown=1.0),
    }
    over = over_limit(timings, {"a::listed": "proves something heavy"}, 60.0)
    assert [line.split(":")[2] for line in over] == ["cpu_bound", "waits"]
    assert over[1] == "a::waits: 65 s alone (130 s wall at a slowdown of 2.0; 2 s CPU on 2 cores)"
    assert all(reason.strip() for reason in SLOW_TESTS.values())  # each listed test says why


def test_the_guard_fails_a_run_whose_test_took_longer_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "test_spin.py").write_text(SPIN)
    tests = Path(__file__).parent
    # Only the guard's plugin: the installed ones (hypothesis', schemathesis') take seconds to import.
    path = f"{tests}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "time_limit", "-p", "no:cacheprovider", str(tmp_path)]
    limited = {**env, "AIAYN_TEST_LIMIT_S": "0.2"}
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=limited)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "2 passed" in run.stdout and "tests over 0.2 s and not in tests/time_limit.py's SLOW_TESTS" in run.stdout
    assert "test_spin.py::test_spins: " in run.stdout and "test_quick:" not in run.stdout
    relaxed = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)  # the 60 s limit
    assert relaxed.returncode == 0, relaxed.stdout[-2000:]
