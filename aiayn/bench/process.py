"""A measuring process of its own, asked over pipes: one JSON line in, one JSON line out.

Runtimes that share a process slow each other down (torch's and CTranslate2's OpenMP pools: CTranslate2
by more than ten times here), so every engine or training variant lives in its own process; the benches
keep them all alive and ask each in turn, round by round, so that a slow moment of the shared machine hits
every one alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def status_mb(field: str, pid: int | str = "self") -> float:
    """A process's ``VmRSS`` (resident memory now) or ``VmHWM`` (its peak; unlike ru_maxrss it does not carry over
    across exec), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def gpu_mb(pid: int | None = None) -> float:
    """The GPU memory a process holds (this one by default), in MiB, as ``nvidia-smi`` reports it; 0 without one.
    ONNX Runtime's and CTranslate2's allocators keep what they took, so after a run it is that run's peak."""
    pid = os.getpid() if pid is None else pid
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    used = 0.0
    for line in listing.splitlines():
        owner, _, mb = line.partition(",")
        if owner.strip() == str(pid) and mb.strip().isdigit():  # "[N/A]" where the driver does not tell
            used += float(mb)
    return used


# A file run as ``__main__`` with the working folder first on the path: its imports are that checkout's.
RUN_FILE = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"


class Worker:
    """``python -m MODULE ARGS...`` (or, with ``script``, that file run over ``cwd``'s ``aiayn``, for a checkout
    that lacks the module): says ``{"ready": true}`` once loaded (or false, and why), then answers requests."""

    def __init__(
        self,
        name: str,
        module: str,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        script: Path | None = None,
    ) -> None:
        self.name = name
        launch = ["-c", RUN_FILE, str(script)] if script is not None else ["-m", module]
        self.process = subprocess.Popen(
            [sys.executable, *launch, *args],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.ready = self.read()  # {"ready": true} once loaded, or {"ready": false, "reason": ...}

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None and self.process.stderr is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"bench of {self.name} failed:\n{self.process.stderr.read()[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def requests() -> Any:
    """A worker's side: the requests on stdin, one JSON object a line."""
    for line in sys.stdin:
        yield json.loads(line)


def answer(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)
