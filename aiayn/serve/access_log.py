"""The access log: one line a request on stderr, as text or as JSON for log shippers. Its route (the route's
template: no session or event id), status, sentences (where the request said them: the JSON route) and
milliseconds; the user's text only when asked (``--log-text``), with every character that could break its line
escaped. A line is written by a thread of the log's own, never on the event loop: a stalled stream (a full stderr
pipe) stalls no request; its lines wait in a bounded queue, and beyond it are dropped and counted
(``aiayn_access_log_dropped_total``). Torch-free."""

from __future__ import annotations

import atexit
import json
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from aiayn.serve import metrics

FORMATS = ("text", "json")
QUEUED_LINES = 10_000  # lines waiting for a stalled stream before new ones are dropped (~2 MB)
FLUSH_S = 2.0  # how long the process's exit waits for the lines still queued
# Every character at which str.splitlines breaks a line (and some log shippers do), written as JSON escapes
# (JSON's own escapes already cover \n, \r and the other control characters below U+0020).
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
ESCAPED = str.maketrans({ch: f"\\u{ord(ch):04x}" for ch in LINE_BREAKS})


@dataclass(frozen=True)
class AccessLine:
    method: str
    route: str
    status: int
    milliseconds: float
    sentences: int | None  # None: not known to the HTTP request (a page request's are searched in Gradio's queue)
    text: list[str] | None  # the user's text, only with --log-text


def escaped(text: str) -> str:
    """``text`` on one line whatever it holds: each line break escaped, and a lone surrogate (which no stream can
    encode) as its Python escape."""
    return text.translate(ESCAPED).encode("utf-8", "backslashreplace").decode("utf-8")


class AccessLog:
    def __init__(self, format: str = "text", with_text: bool = False, out: TextIO | None = None) -> None:
        self.format, self.with_text = format, with_text
        self.out = out  # None: stderr as it is when the line is written
        self.lines: queue.Queue[str] = queue.Queue(maxsize=QUEUED_LINES)
        threading.Thread(target=self.writing, name="aiayn-access-log", daemon=True).start()
        atexit.register(self.flush)

    def write(self, line: AccessLine) -> None:
        """The line queued for the log's thread, or dropped and counted where the queue is full."""
        try:
            self.lines.put_nowait(self.formatted(line))
        except queue.Full:
            metrics.log_dropped()

    def writing(self) -> None:
        while True:
            text = self.lines.get()
            try:
                out = self.out or sys.stderr
                out.write(text + "\n")
                out.flush()
            except (OSError, ValueError):  # a closed stream: the line is lost, the server goes on
                pass
            finally:
                self.lines.task_done()

    def flush(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait (at most ``timeout_s``) until every queued line is written; whether they are."""
        with self.lines.all_tasks_done:
            return self.lines.all_tasks_done.wait_for(lambda: not self.lines.unfinished_tasks, timeout_s)

    def formatted(self, line: AccessLine) -> str:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = line.text if self.with_text else None
        if self.format == "json":
            fields = {
                "time": at,
                "method": line.method,
                "route": line.route,
                "status": line.status,
                "sentences": line.sentences,
                "ms": round(line.milliseconds, 1),
            }
            return escaped(json.dumps(fields | ({"text": text} if text is not None else {}), ensure_ascii=False))
        sentences = "-" if line.sentences is None else str(line.sentences)
        shown = f" text={json.dumps(text, ensure_ascii=False)}" if text is not None else ""
        head = f"{at} {line.method} {line.route} {line.status} sentences={sentences} ms={line.milliseconds:.1f}"
        return escaped(head + shown)
