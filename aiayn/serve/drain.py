"""A serving process's life: loading, ready, draining; the work it accepted and has not answered; and the graceful
stop on SIGTERM or the first Ctrl-C. Torch-free.

Draining: readiness turns 503 at once, new requests are refused (``operations.py``), the work already accepted is
answered, and the process stops when none is left or after the grace period, saying how many were cut. A second
signal stops it at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from enum import Enum
from types import FrameType
from typing import Protocol

GRACE_S = 30.0  # --grace's default: Kubernetes' terminationGracePeriodSeconds
RETRY_AFTER_S = 5  # what a refused request is told: another replica, or this one restarted, answers by then
POLL_S = 0.2


class Phase(Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"


READINESS_REASONS = {
    Phase.LOADING: "loading the models (and, on a GPU, checking them)",
    Phase.DRAINING: "draining: answering the requests accepted before the stop, refusing new ones",
}
UNHEALTHY = "unhealthy"  # /readyz's status where the phase is ready but the check given to ``ready`` says why not


class StoppedAtOnce(Exception):
    """A second signal during the drain."""


class Lifecycle:
    """The phase, and the units of work accepted and not yet answered (a JSON request, a page request in Gradio's
    queue), for every thread: the server's event loop counts, the main thread waits."""

    def __init__(self) -> None:
        self.phase = Phase.LOADING
        self.open_work = 0
        self.changed = threading.Condition()
        self.unhealthy_because: Callable[[], str | None] = lambda: None

    def ready(self, unhealthy_because: Callable[[], str | None] | None = None) -> None:
        """Loaded; ``unhealthy_because`` says, each time readiness is asked, why the process cannot serve even so
        (a search worker dead: ``health.unhealthy_because``), or None."""
        with self.changed:
            if unhealthy_because is not None:
                self.unhealthy_because = unhealthy_because
            if self.phase is Phase.LOADING:
                self.phase = Phase.READY

    def drain(self) -> None:
        with self.changed:
            self.phase = Phase.DRAINING
            self.changed.notify_all()

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING

    def not_ready_because(self) -> str | None:
        """Why the process is not ready (None: it is)."""
        return READINESS_REASONS.get(self.phase) or self.unhealthy_because()

    @property
    def status(self) -> str:
        """/readyz's ``status``: the phase, or ``unhealthy`` where ready but the check says why not."""
        if self.phase is Phase.READY and self.unhealthy_because() is not None:
            return UNHEALTHY
        return self.phase.value

    def accepted(self, units: int = 1) -> None:
        with self.changed:
            self.open_work += units

    def answered(self, units: int = 1) -> None:
        with self.changed:
            self.open_work -= units
            self.changed.notify_all()

    def wait_answered(self, seconds: float) -> int:
        """Until every accepted unit of work is answered, for at most ``seconds``: the units left (cut)."""
        deadline = time.monotonic() + seconds
        with self.changed:
            # A short timeout: a second signal's handler runs in this (the main) thread between waits.
            while self.open_work > 0 and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(min(left, POLL_S))
            return self.open_work


class Drained(Protocol):
    """What ``serve_until_stopped`` drains: a ``Lifecycle`` here, or one asked through Ray Serve's handle."""

    @property
    def open_work(self) -> int: ...

    def drain(self) -> None: ...

    def wait_answered(self, seconds: float) -> int: ...


def serve_until_stopped(lifecycle: Drained, grace_s: float, close: Callable[[], None]) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain for at most ``grace_s`` and ``close`` the server: the units of
    work cut (0: every accepted request was answered). Run in the main thread, where Python handles signals."""
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        if stop.is_set():
            raise StoppedAtOnce()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(POLL_S):
            pass
        lifecycle.drain()
        print(
            f"draining: answering the {lifecycle.open_work} request(s) accepted, refusing new ones with 503, for at "
            f"most {grace_s:g} s (a second Ctrl-C or SIGTERM stops at once)",
            file=sys.stderr,
        )
        cut = lifecycle.wait_answered(grace_s)
        said = "stopped after the grace period" if cut else "drained"
    except StoppedAtOnce:
        cut, said = lifecycle.open_work, "stopped at once"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    close()
    print(f"{said}: {cut} request(s) cut" if cut else f"{said}: every accepted request answered", file=sys.stderr)
    return cut
