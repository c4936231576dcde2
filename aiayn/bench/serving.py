"""The serving row: 16 visitors at once against the same 16 requests one by one, through the page's API.

A server process runs the page on a loopback port (``python -m aiayn.bench.serving FOLDER PORT``); the bench
drives it with gradio_client, one client per visitor, a bounded number of requests, and stops it after.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.bench.engines import THREADS
from aiayn.core.folder import ModelFolder

BEAM = 4
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class ServingRound:
    one_by_one_s: float
    together_s: float
    errors: int
    identical: bool  # every concurrent answer equals its one-by-one answer

    @property
    def ratio(self) -> float:
        return self.one_by_one_s / self.together_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "aiayn.bench.serving", str(folder), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    wait_until_serving(server, url)
    return server, url


def wait_until_serving(server: subprocess.Popen[bytes], url: str) -> None:
    """Until the page answers at ``url``; a server that exits or stays silent is killed and reported."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the bench's page server exited before it served")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"the bench's page server did not answer at {url} within {START_TIMEOUT_S} s")


def ask(client: Any, sentence: str, model: str) -> str | None:
    try:
        return str(client.predict(sentence, model, BEAM, api_name="/translate")[0])
    except Exception:  # counted as an error of the serving row, whatever the client raised
        return None


def measure_serving(folder: Path, sentences: list[str], rounds: int) -> list[ServingRound]:
    """Per round: the requests one by one from one client, then all at once from one client each."""
    from gradio_client import Client

    from aiayn.serve.requests import pair_value

    direction = pair_value(ModelFolder.open(folder))
    server, url = start_server(folder)
    try:
        clients = [Client(url, verbose=False) for _ in sentences]
        results = []
        for _ in range(rounds):
            started = time.perf_counter()
            alone = [ask(clients[0], s, direction) for s in sentences]
            one_by_one = time.perf_counter() - started
            with ThreadPoolExecutor(len(sentences)) as pool:
                started = time.perf_counter()
                together = list(pool.map(ask, clients, sentences, [direction] * len(sentences)))
                concurrent = time.perf_counter() - started
            errors = sum(answer is None for answer in alone + together)
            results.append(ServingRound(one_by_one, concurrent, errors, together == alone))
        return results
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    """The page on ``FOLDER`` at 127.0.0.1:``PORT``, ONNX Runtime on the CPU with the bench's threads."""
    from aiayn.engines.options import EngineOptions
    from aiayn.serve.server import serve

    folder, port = sys.argv[1], int(sys.argv[2])
    serve([folder], "127.0.0.1", port, options=EngineOptions(device="cpu", lanes=THREADS))


if __name__ == "__main__":
    main()
