"""The suite's guard (a pytest plugin, loaded by tests/conftest.py): the run fails when a test took more than
``LIMIT_S``, unless ``SLOW_TESTS`` names it with why it needs its time.

A test's time is its setup, call and teardown together (a session fixture's setup counts in the first test that
asks for it, as in pytest's ``--durations``). On a loaded machine wall time stretches, so the limit applies to the
time the test would have taken alone, the larger of:

- its wall time divided by the machine's slowdown, ``max(1, load average / cores)`` as the test ended (the tests
  that mostly wait: on a server, a browser, a timeout);
- its CPU time over the cores: this process's and its waited-for children's (the servers and workers it started
  and stopped), which others' work does not stretch; on all the cores at once, a test takes at least that long.

``AIAYN_TEST_LIMIT_S`` sets another limit (the guard's own test uses it).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

LIMIT_S = 60.0
# The tests allowed past LIMIT_S, each with why it needs its time: the one list (node id → reason).
SLOW_TESTS: dict[str, str] = {}


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float
    slowdown: float  # max(1, load average / cores) as the test ended
    cores: int = 2

    @property
    def alone_s(self) -> float:
        """The time the test would have taken on the machine alone (at least its CPU time over the cores)."""
        return max(self.wall_s / self.slowdown, self.cpu_s / self.cores)


def over_limit(timings: dict[str, Timing], allowed: dict[str, str], limit_s: float) -> list[str]:
    """One line for each test over ``limit_s`` alone (``Timing.alone_s``) that ``allowed`` lacks."""
    return [
        f"{name}: {t.alone_s:.0f} s alone ({t.wall_s:.0f} s wall at a slowdown of {t.slowdown:.1f}; "
        f"{t.cpu_s:.0f} s CPU on {t.cores} cores)"
        for name, t in timings.items()
        if t.alone_s > limit_s and name not in allowed
    ]


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def slowdown() -> float:
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


TIMINGS = pytest.StashKey[dict[str, Timing]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[TIMINGS] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    wall, cpu = time.monotonic(), cpu_s()
    yield
    timing = Timing(time.monotonic() - wall, cpu_s() - cpu, slowdown(), os.cpu_count() or 1)
    item.config.stash[TIMINGS][item.nodeid] = timing


def limit_s() -> float:
    return float(os.environ.get("AIAYN_TEST_LIMIT_S", LIMIT_S))


SHOWN = 15  # the tests by CPU time in the summary, beside pytest's --durations (wall time, which load stretches)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    timings = config.stash[TIMINGS]
    if timings:
        terminalreporter.section(f"slowest {SHOWN} by CPU time (setup + call + teardown; children waited for)")
        for name, t in sorted(timings.items(), key=lambda item: -item[1].cpu_s)[:SHOWN]:
            terminalreporter.line(f"{t.cpu_s:7.1f} s CPU {t.wall_s:7.1f} s wall (slowdown {t.slowdown:.1f})  {name}")
    over = over_limit(timings, SLOW_TESTS, limit_s())
    if over:
        terminalreporter.section(f"tests over {limit_s():g} s and not in tests/time_limit.py's SLOW_TESTS", red=True)
        for line in over:
            terminalreporter.line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.OK and over_limit(session.config.stash[TIMINGS], SLOW_TESTS, limit_s()):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
