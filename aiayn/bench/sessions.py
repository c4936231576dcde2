"""`aiayn bench --sessions`: the page server's memory over many fresh visitor sessions (a memory figure).

Every visitor who opens the page gets a Gradio session; a server that keeps each one grows for good. The
bench starts the page (``serving.start_server``), sends ``WARMUP`` requests each from a fresh session (the
kept sessions fill up, caches warm), reads the server's resident memory, sends ``sessions`` more requests
from fresh sessions and reads it again. The growth is the figure: with Gradio's defaults it was ~40 KB a
session (+98 MiB over 2 000); ``app.SESSIONS_KEPT`` bounds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from aiayn.bench.process import status_mb
from aiayn.bench.serving import start_server
from aiayn.core.folder import ModelFolder

WARMUP = 200
SENTENCE = "A dog runs through the snow."


@dataclass(frozen=True)
class SessionsFigure:
    sessions: int
    rss_before_mb: float
    rss_after_mb: float
    errors: int
    seconds: float

    @property
    def growth_mb(self) -> float:
        return self.rss_after_mb - self.rss_before_mb


def measure_sessions(folder: Path, sessions: int) -> SessionsFigure:
    from gradio_client import Client

    from aiayn.serve.requests import pair_value

    direction = pair_value(ModelFolder.open(folder))
    server, url = start_server(folder)
    try:
        client = Client(url, verbose=False)
        errors = 0

        def visit(count: int) -> None:
            nonlocal errors
            for _ in range(count):
                client.reset_session()  # a new visitor
                try:
                    client.predict(SENTENCE, direction, 1, api_name="/translate")
                except Exception:  # counted, whatever the client raised
                    errors += 1

        visit(WARMUP)
        before = status_mb("VmRSS", server.pid)
        started = time.perf_counter()
        visit(sessions)
        seconds = time.perf_counter() - started
        return SessionsFigure(sessions, before, status_mb("VmRSS", server.pid), errors, seconds)
    finally:
        server.terminate()
        server.wait(timeout=30)


def sessions_report(figure: SessionsFigure) -> str:
    return (
        f"{figure.sessions} fresh sessions after {WARMUP} to warm up ({figure.seconds:.0f} s, {figure.errors} errors): "
        f"server RSS {figure.rss_before_mb:.1f} → {figure.rss_after_mb:.1f} MiB, growth {figure.growth_mb:+.1f} MiB "
        "(goal: ≤ 20)"
    )
