"""A serving process's life: loading, ready, draining; the work it accepted and has not answered; and the graceful
stop on SIGTERM or the first Ctrl-C. Torch-free.

Draining: readiness turns 503 at once, new requests are refused (``operations.py``), the work already accepted is
answered, and the process stops when none is left or after the grace period, saying how many were cut. A second
signal stops it at once.

The work a drain waits for is the JSON route's requests and the page's requests in Gradio's queue (``PageWork``),
never a client's pace: an upload, a download, a progress or heartbeat stream is not waited for, and a page request
whose answer's stream is not open ``STREAM_OPENS_S`` after its join (its tab closed) is no longer waited for. The
follow-up events of a page request accepted (its marks, its attention) are still admitted while draining, as many
as it has.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from enum import Enum
from types import FrameType
from typing import Protocol

GRACE_S = 30.0  # --grace's default: Kubernetes' terminationGracePeriodSeconds
RETRY_AFTER_S = 5  # what a refused request is told: another replica, or this one restarted, answers by then
POLL_S = 0.2
# While draining, a page request whose answer's stream has not opened this long after its join (or the drain's
# start) is taken as abandoned by its client: a browser opens it at once.
STREAM_OPENS_S = 5.0
# Outside a drain, a key whose stream never opened is forgotten this long after its last join, so that a client
# that only joins cannot grow the table (Gradio answers it all the same). A request accepted waits at most about
# 30 s of work in Gradio's queue (page.MAX_WAITING).
ABANDONED_S = 300.0


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
        self.sweeps: list[Callable[[], None]] = []  # run at each poll of a drain (``PageWork.sweep``)
        self.follow_ups: frozenset[int] = frozenset()  # the page's events that follow an accepted one (its fn ids)

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

    def sweep(self) -> None:
        """Let go of the work no client holds any more (``PageWork.sweep``): before each look at ``open_work``."""
        for sweep in self.sweeps:
            sweep()

    def wait_answered(self, seconds: float) -> int:
        """Until every accepted unit of work is answered, for at most ``seconds``: the units left (cut)."""
        deadline = time.monotonic() + seconds
        while True:
            self.sweep()
            with self.changed:
                if self.open_work <= 0 or (left := deadline - time.monotonic()) <= 0:
                    return self.open_work
                # A short timeout: a second signal's handler runs in this (the main) thread between waits.
                self.changed.wait(min(left, POLL_S))


class PageWork:
    """The page's requests accepted and not yet answered, by their key (``operations.py`` says how Gradio's
    protocol keys them), for the drain: each key's requests open and when it last joined, its answer's streams
    open, and while draining the follow-up events each key may still join. Called from the server's event loop
    and, by ``sweep``, from the drain's thread."""

    def __init__(self, lifecycle: Lifecycle, on_waiting: Callable[[int], None] = lambda _: None) -> None:
        self.lifecycle, self.on_waiting = lifecycle, on_waiting
        self.events: OrderedDict[str, tuple[int, float]] = OrderedDict()  # oldest join first
        self.streams: Counter[str] = Counter()
        self.waiting = 0  # the requests of every key together
        self.follow_ups_left: dict[str, int] | None = None  # taken when the drain starts
        self.drain_started = 0.0
        self.lock = threading.Lock()
        lifecycle.sweeps.append(self.sweep)

    def joined(self, key: str) -> None:
        now = time.monotonic()
        with self.lock:
            while self.events and next(iter(self.events.values()))[1] < now - ABANDONED_S:
                self.forget(next(iter(self.events)))
            count, _ = self.events.pop(key, (0, now))
            self.events[key] = (count + 1, now)
            self.lifecycle.accepted()
            self.waiting += 1
            self.on_waiting(self.waiting)

    def admits_while_draining(self, key: object, fn_index: object) -> bool:
        """A join while draining: one of the page's follow-up events, of a key that had requests accepted when the
        drain started, within the follow-ups those requests have."""
        with self.lock:
            left = self.drain_snapshot()
            if fn_index not in self.lifecycle.follow_ups or not isinstance(key, str) or left.get(key, 0) <= 0:
                return False
            left[key] -= 1
            return True

    def drain_snapshot(self) -> dict[str, int]:
        if self.follow_ups_left is None:
            self.drain_started = time.monotonic()
            each = len(self.lifecycle.follow_ups)
            self.follow_ups_left = {key: count * each for key, (count, _) in self.events.items()}
        return self.follow_ups_left

    def stream_opened(self, key: str | None) -> None:
        if key is not None:
            with self.lock:
                self.streams[key] += 1

    def stream_closed(self, key: str | None) -> None:
        """A key's stream closed: its requests answered (or abandoned by their client: Gradio drops them then)."""
        if key is not None:
            with self.lock:
                self.streams[key] -= 1
                if self.streams[key] <= 0:
                    del self.streams[key]
                self.forget(key)

    def sweep(self) -> None:
        """While draining: forget the keys whose answer's stream has not opened ``STREAM_OPENS_S`` after their last
        join and the drain's start."""
        if not self.lifecycle.draining:
            return
        with self.lock:
            self.drain_snapshot()
            cutoff = time.monotonic() - STREAM_OPENS_S
            for key, (_, last) in list(self.events.items()):
                if key not in self.streams and max(last, self.drain_started) < cutoff:
                    self.forget(key)

    def forget(self, key: str) -> None:
        done, _ = self.events.pop(key, (0, 0.0))
        if done:
            self.lifecycle.answered(done)
            self.waiting -= done
            self.on_waiting(self.waiting)


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
