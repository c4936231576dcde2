"""The access log: one line a request on stderr, as text or as JSON for log shippers. Its route (the route's
template: no session or event id), status, sentences (where the request said them: the JSON route) and
milliseconds; the user's text only when asked (``--log-text``). Torch-free."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TextIO

FORMATS = ("text", "json")


@dataclass(frozen=True)
class AccessLine:
    method: str
    route: str
    status: int
    milliseconds: float
    sentences: int | None  # None: not known to the HTTP request (a page request's are searched in Gradio's queue)
    text: list[str] | None  # the user's text, only with --log-text


@dataclass(frozen=True)
class AccessLog:
    format: str = "text"  # one of FORMATS
    with_text: bool = False
    out: TextIO | None = None  # None: stderr as it is when the line is written

    def write(self, line: AccessLine) -> None:
        (self.out or sys.stderr).write(self.formatted(line) + "\n")

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
            return json.dumps(fields | ({"text": text} if text is not None else {}), ensure_ascii=False)
        sentences = "-" if line.sentences is None else str(line.sentences)
        shown = f" text={json.dumps(text, ensure_ascii=False)}" if text is not None else ""
        return f"{at} {line.method} {line.route} {line.status} sentences={sentences} ms={line.milliseconds:.1f}{shown}"
