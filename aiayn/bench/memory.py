"""`aiayn bench --memory`: the page server's resident memory with both bundled models, when ready and over
2 000 requests (the goal: ≤ 300 MiB ready, ≤ 350 MiB after).

The bench starts `aiayn serve` (every bundled model, on the CPU) and sends ``REQUESTS`` requests from
``VISITORS`` visitors at once, each on one keep-alive connection (``crowd.Connection``): the page's directions
take turns, and so do greedy and beam 4; every fourth request is a batch of 1–5 sentences on the JSON route, every
seventh a paragraph with a long sentence cut into clauses, and every tenth page request is followed by the
heatmap the page asks for after a translation (its event, through Gradio's queue, as the browser sends it).
The server's VmRSS is read when ready and at ``MARKS`` requests, its peak (VmHWM) at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass

from aiayn.bench.crowd import HOST, Connection, ask_page
from aiayn.bench.process import status_mb
from aiayn.bench.serving import free_port, wait_until_serving

REQUESTS = 2000
VISITORS = 100
MARKS = (100, 500, 1000, 2000)
HEATMAP_EVERY, JSON_EVERY, PARAGRAPH_EVERY = 10, 4, 7


@dataclass(frozen=True)
class MemoryFigure:
    ready_mb: float
    after_mb: dict[int, float]  # requests done → VmRSS
    peak_mb: float
    errors: int


def heatmap_event(port: int) -> int:
    """The index of the page's heatmap event: the one from the source text to the heatmap."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/config") as response:
        config = json.loads(response.read())
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"] if "props" in c}
    return next(
        index
        for index, event in enumerate(config["dependencies"])
        if ids["heatmap"] in event["outputs"] and ids["source-text"] in event["inputs"]
    )


async def ask_heatmap(connection: Connection, event: int, text: str, direction: str, beam: int) -> None:
    """The heatmap's event as the page sends it: joined to the queue, then its stream read to the end."""
    session = uuid.uuid4().hex[:10]
    body = {"data": [text, direction, beam, "average"], "fn_index": event, "session_hash": session}
    await connection.request("POST", "/gradio_api/queue/join", body)
    stream = await connection.request("GET", f"/gradio_api/queue/data?session_hash={session}")
    if b'"success":true' not in stream.replace(b" ", b""):
        raise RuntimeError(f"the heatmap failed: {stream[-300:]!r}")


def request_text(sources: dict[str, list[str]], number: int) -> tuple[str, str, int]:
    """Request ``number``'s (text, direction, beam)."""
    direction = list(sources)[number % len(sources)]
    lines = sources[direction]
    text = lines[number % len(lines)]
    if number % PARAGRAPH_EVERY == PARAGRAPH_EVERY // 2:  # two sentences, then three captions joined by ", and"
        a, b, c = (lines[(number + k) % len(lines)] for k in (1, 2, 3))
        text = f"{a} {b}\n{text.rstrip('.')}, and {c}"
    return text, direction, 4 if (number // 2) % 2 == 0 else 1


async def visitor(
    port: int, pid: int, event: int, sources: dict[str, list[str]], state: dict[str, int], after: dict[int, float]
) -> None:
    connection = await Connection.open(port)
    try:
        while (number := state["next"]) < REQUESTS:
            state["next"] += 1
            text, direction, beam = request_text(sources, number)
            try:
                if number % JSON_EVERY == JSON_EVERY - 1:
                    lines = sources[direction]
                    batch = [lines[(number + k) % len(lines)] for k in range(1 + number % 5)]
                    body = {"sentences": batch, "direction": direction, "beam": beam}
                    await connection.request("POST", "/v1/translate", body)
                else:
                    await ask_page(connection, text, direction, beam)
                    if number % HEATMAP_EVERY == 0:
                        await ask_heatmap(connection, event, text, direction, beam)
            except Exception:  # counted, whatever went wrong
                state["errors"] += 1
            if number + 1 in MARKS:
                after[number + 1] = status_mb("VmRSS", pid)
    finally:
        connection.close()


def measure_memory(sources: dict[str, list[str]]) -> MemoryFigure:
    """``sources``: the page's direction values (every bundled model's), each with sentences in its source
    language."""
    port = free_port()
    command = [sys.executable, "-m", "aiayn.cli", "serve", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_until_serving(server, f"http://{HOST}:{port}/")
        ready = status_mb("VmRSS", server.pid)
        event = heatmap_event(port)
        state = {"next": 0, "errors": 0}
        after: dict[int, float] = {}

        async def crowd() -> None:
            await asyncio.gather(*(visitor(port, server.pid, event, sources, state, after) for _ in range(VISITORS)))

        asyncio.run(crowd())
        return MemoryFigure(ready, dict(sorted(after.items())), status_mb("VmHWM", server.pid), state["errors"])
    finally:
        server.terminate()
        server.wait(timeout=30)


def memory_report(figure: MemoryFigure) -> str:
    after = ", ".join(f"{mb:.0f} MiB after {n}" for n, mb in figure.after_mb.items())
    return (
        f"page server, both bundled models, {VISITORS} visitors at once ({figure.errors} errors): "
        f"RSS {figure.ready_mb:.0f} MiB when ready, {after} requests, peak {figure.peak_mb:.0f} MiB "
        "(the goals: ≤ 300 MiB when ready, ≤ 350 MiB after 2000 requests)"
    )
