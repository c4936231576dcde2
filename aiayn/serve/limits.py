"""What the server takes from a visitor, and how it says no: the JSON route's own limits and the page's translated
files' in one dataclass (``Limits``, `aiayn serve`'s values as its defaults; ``--max-waiting`` and
``--request-timeout`` set two of them; a text's characters are ``text.sentences``'), and every refusal of the server
under one stable reason, which sets the route's answer's status and names it in the server's counts. Torch-free."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aiayn.text.sentences import MAX_FILE_CHARS

# Sentences the batcher takes off its queue at most per search (``batching.py``); the translator cuts them into
# length batches.
SENTENCES_PER_SEARCH = 256
# A request's work: its sentences as ``text.sentences`` splits them (a JSON request's strings together, each
# counting at least one; a page request's text), so that they fit one of the batcher's searches. Characters bound
# what is read; sentences bound what is searched: 5 000 characters may hold 2 500 sentences of one letter.
MAX_SENTENCES_PER_REQUEST = SENTENCES_PER_SEARCH
MAX_FILE_SENTENCES = 8 * SENTENCES_PER_SEARCH  # an uploaded file's: about 10 s of work on two cores
MAX_BODY_BYTES = 4 * MAX_FILE_CHARS  # UTF-8 text and JSON escapes of MAX_FILE_CHARS characters
# Sentences of the JSON route admitted and not yet answered. At the route's measured 200-250 sentences a second on
# two cores (docs/serve.md) this many are about 20 s of work: 16 requests of 256, or 128 clients' batches of 32, at
# once; the page's crowd waits in Gradio's queue, not here.
MAX_WAITING_SENTENCES = 4096
# Past this a request is answered 503 and its sentences still waiting are dropped from the search (``batching.py``):
# three times the time the waiting bound's work takes.
REQUEST_TIMEOUT_S = 60.0
RETRY_AFTER_S = 10  # what a 503 asks a client to wait before it tries again (``Retry-After``)
MAX_NUMBER_DIGITS = 18  # a JSON number's digits: every field is small; a longer one is refused before it is an int
MAX_UPLOAD_BYTES = 2**20  # a .txt upload (Gradio's max_file_size); its text must also stay within MAX_FILE_CHARS
UPLOAD_FRAMING_BYTES = 64 * 1024  # an upload's body beyond its file: multipart's boundaries and headers
DOWNLOAD_MAX_AGE_S = 3600  # the page's translated files, deleted this long after they were written
DOWNLOADS_KEPT = 500  # and at most this many of them, ...
DOWNLOAD_BYTES_KEPT = 256 * 1024 * 1024  # ... at most this many bytes together: the oldest go first


@dataclass(frozen=True)
class Limits:
    """The server's limits; the defaults are `aiayn serve`'s."""

    max_body_bytes: int = MAX_BODY_BYTES  # every body but an upload's, on every route (``doors.py``)
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_sentences: int = MAX_SENTENCES_PER_REQUEST  # per request of the page or the JSON route, once split
    max_file_sentences: int = MAX_FILE_SENTENCES  # per file uploaded to the page, once split
    max_waiting: int = MAX_WAITING_SENTENCES  # sentences of the JSON route waiting or searched at once
    # A request's: the JSON route's from its arrival to its answer, the page's from its handler's start (its wait in
    # Gradio's queue is the queue's bound's); past it, its searches not yet run are dropped.
    request_timeout_s: float = REQUEST_TIMEOUT_S
    retry_after_s: int = RETRY_AFTER_S
    max_number_digits: int = MAX_NUMBER_DIGITS
    download_max_age_s: float = DOWNLOAD_MAX_AGE_S
    downloads_kept: int = DOWNLOADS_KEPT
    download_bytes_kept: int = DOWNLOAD_BYTES_KEPT

    def __post_init__(self) -> None:
        if self.max_waiting < self.max_sentences:
            raise ValueError(
                f"--max-waiting must be at least {self.max_sentences} (one request's sentences), got {self.max_waiting}"
            )
        if not self.request_timeout_s > 0:
            raise ValueError(f"--request-timeout must be more than 0 seconds, got {self.request_timeout_s}")


DEFAULT_LIMITS = Limits()


class Reason(StrEnum):
    """Why the server refused a request: stable names, for its counts (``aiayn_refusals_total``, each refusal
    counted once: the route's in ``api.refusal``, the page's where it is answered). The JSON route's come first."""

    MEDIA_TYPE = "media_type"  # not sent as application/json
    TOO_LARGE = "too_large"  # a body over ``max_body_bytes``
    BAD_JSON = "bad_json"  # not JSON, nested too deep, a number out of range
    BAD_FIELD = "bad_field"  # JSON, but a field is missing, unknown or wrong
    NOT_TRANSLATED = "not_translated"  # a line the model cannot take (a single word over the token limit)
    QUEUE_FULL = "queue_full"  # ``max_waiting`` sentences already wait
    TIMEOUT = "timeout"  # not answered within ``request_timeout_s``
    PAGE_QUEUE_FULL = "page_queue_full"  # Gradio's queue of page requests is full (``page.MAX_WAITING``)
    DRAINING = "draining"  # the process is stopping: any route's new request (``operations.py``)
    NO_KEY = "no_key"  # ``--api-keys`` given, and no valid key sent (``api_keys.py``)
    KEY_RATE = "key_rate"  # a key over its requests per minute
    KEY_CHARS = "key_chars"  # a request over its key's characters


STATUS = {
    Reason.MEDIA_TYPE: 415,
    Reason.TOO_LARGE: 413,
    Reason.BAD_JSON: 400,
    Reason.BAD_FIELD: 422,
    Reason.NOT_TRANSLATED: 422,
    Reason.QUEUE_FULL: 503,
    Reason.TIMEOUT: 503,
    Reason.PAGE_QUEUE_FULL: 503,
    Reason.DRAINING: 503,
    Reason.NO_KEY: 403,
    Reason.KEY_RATE: 429,
    Reason.KEY_CHARS: 413,
}


class Refused(ValueError):
    """A request the route answers with a 4xx or 503 and one message; ``reason`` names why, ``retry_after_s``
    when to try again where not the server's ``Limits.retry_after_s`` (a key's rate)."""

    def __init__(self, reason: Reason, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.retry_after_s = reason, retry_after_s

    @property
    def status(self) -> int:
        return STATUS[self.reason]


def too_large(limit: int, length: int | None = None) -> Refused:
    """A body over ``limit`` bytes: by its ``Content-Length`` (``length``), or counted as it streamed."""
    size = f"more than {limit}" if length is None else str(length)
    return Refused(Reason.TOO_LARGE, f"the body has {size} bytes; at most {limit}")


def json_of(body: bytes, digits: int) -> Any:
    """The body as JSON, or ``bad_json``: not JSON (or not UTF-8), nested deeper than Python parses, a number of
    more than ``digits`` digits (no field takes one: it is refused before Python makes it an integer, which from
    4 301 digits it refuses itself), a non-finite number (``1e999``, ``NaN``)."""

    def whole(text: str) -> int:
        if len(text.lstrip("-")) > digits:
            raise ValueError(f"a number of {len(text.lstrip('-'))} digits is out of range (at most {digits})")
        return int(text)

    def real(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"the number {text[:digits]}{'…' if len(text) > digits else ''} is out of range")
        return number

    def constant(text: str) -> float:
        raise ValueError(f"{text} is not a JSON number")

    try:
        return json.loads(body, parse_int=whole, parse_float=real, parse_constant=constant)
    except RecursionError:
        raise Refused(Reason.BAD_JSON, "the body is not JSON this route reads: it is nested too deep") from None
    except ValueError as err:  # UnicodeDecodeError and json.JSONDecodeError among them
        raise Refused(Reason.BAD_JSON, f"the body is not JSON: {err}") from None
