"""`aiayn serve` as a process on loopback against a hostile client of its JSON route: a body of 1 GB sent in chunks
is cut at the limit (413) without the server's memory growing by it, a Content-Length over the limit is refused
before a byte of the body is sent, bad values are a 4xx with one JSON message through the whole server (Gradio's
app around the route), and `--request-timeout` answers a request past it with 503 (what a time limit drops from the
search: test_hostile_requests.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

import aiayn.serve.server
from aiayn.cli import main
from aiayn.serve.limits import MAX_BODY_BYTES, Limits

GB = 1024**3
CHUNK = 256 * 1024
MEMORY_GROWTH_MIB = 20


FLAGS = ["--host", "127.0.0.1", "--device", "cpu", "--model", "en-de"]


@pytest.fixture(scope="module")
def server(
    bundled: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, serve_page: Callable[..., Any]
) -> Iterator[Any]:
    with serve_page(FLAGS, tmp_path_factory.mktemp("hostile") / "serve.log") as page:
        yield page


def memory_mib(pid: int) -> tuple[float, float]:
    """Resident memory now and at its peak (VmRSS, VmHWM) of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def connect(server: Any) -> socket.socket:
    url = urlparse(server.url)
    return socket.create_connection((url.hostname, url.port), timeout=60)


def answer_of(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the answer on ``connection`` (read until the server closes it or the body,
    by its Content-Length, is whole)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = connection.recv(65536)
        if not chunk:
            break
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def post(server: Any, body: bytes, content_type: str = "application/json") -> tuple[int, dict[str, str], Any]:
    with connect(server) as connection:
        head = f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        connection.sendall(f"{head}Content-Type: {content_type}\r\nConnection: close\r\n\r\n".encode() + body)
        status, headers, raw = answer_of(connection)
    return status, headers, json.loads(raw)


def test_a_body_of_1_gb_in_chunks_is_cut_at_the_limit_and_the_server_holds_none_of_it(server: Any) -> None:
    assert post(server, b"{}")[0] == 422  # the route's first request, before the memory is read
    before = memory_mib(server.pid)
    sent = [0]
    with connect(server) as connection:
        head = "POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())

        def stream() -> None:  # 1 GB, for as long as the server takes it
            chunk = f"{CHUNK:x}\r\n".encode() + b" " * CHUNK + b"\r\n"
            try:
                while sent[0] < GB:
                    connection.sendall(chunk)
                    sent[0] += CHUNK
                connection.sendall(b"0\r\n\r\n")
            except OSError:  # the server answered and closed the connection
                pass

        sender = threading.Thread(target=stream, daemon=True)
        sender.start()
        status, headers, body = answer_of(connection)
        sender.join(timeout=120)
    after = memory_mib(server.pid)
    assert status == 413 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": f"the body has more than {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}"}
    growth = max(after[0] - before[0], after[1] - before[1])
    print(
        f"\n1 GB in chunks: {sent[0] / 2**20:.0f} MiB sent before the server closed; resident memory "
        f"{before[0]:.0f} -> {after[0]:.0f} MiB, peak {before[1]:.0f} -> {after[1]:.0f} MiB"
    )
    assert growth < MEMORY_GROWTH_MIB
    assert not sender.is_alive() and sent[0] < GB // 10  # cut: the server closed the connection, read no more


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_sent(server: Any) -> None:
    with connect(server) as connection:
        head = f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {GB}\r\n"
        connection.sendall(f"{head}Content-Type: application/json\r\n\r\n".encode())  # and not a byte more
        started = time.monotonic()
        status, _, body = answer_of(connection)
    assert (status, json.loads(body)) == (413, {"error": f"the body has {GB} bytes; at most {MAX_BODY_BYTES}"})
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b'{"sentences": ["A dog."]}', "text/plain", 415, "the body must be sent as Content-Type: application/json"),
        (b"[" * 50_000 + b"]" * 50_000, "application/json", 400, "nested too deep"),
        (b'{"sentences": ["A dog."], "beam": ' + b"9" * 400 + b"}", "application/json", 400, "out of range"),
        (b'{"sentences": ["A dog."], "beam": ' + b"9" * 5000 + b"}", "application/json", 400, "out of range"),
        (b'{"sentences": ["A dog."], "beam": 1e999}', "application/json", 400, "out of range"),
        (b'{"sentences": ["A dog."], "beam": "4"}', "application/json", 422, "beam size must be a whole number"),
        (b'{"sentences": [1]}', "application/json", 422, "sentences must be a list of strings"),
    ],
)
def test_a_bad_body_is_a_4xx_with_one_json_message_through_the_server(
    server: Any, body: bytes, content_type: str, status: int, message: str
) -> None:
    got, _, answer = post(server, body, content_type)
    assert got == status and list(answer) == ["error"] and message in answer["error"]


def test_past_request_timeout_a_request_is_answered_503_with_retry_after(
    bundled: dict[str, Path], tmp_path: Path, serve_page: Callable[..., Any]
) -> None:
    with serve_page([*FLAGS, "--request-timeout", "0.001"], tmp_path / "serve.log") as page:  # past for any request
        status, headers, answer = post(page, b'{"sentences": ["Two dogs play in the snow."]}')
        assert (status, headers["retry-after"]) == (503, "10")
        assert answer == {"error": "not answered within 0.001 s: the server is busy; try again shortly"}
        assert "Traceback" not in page.log.read_text()


def test_the_limit_flags_are_checked_before_any_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[dict[str, Any]] = []
    monkeypatch.setattr(aiayn.serve.server, "serve", lambda *args, **kwargs: served.append(kwargs))
    assert main(["serve", "--max-waiting", "255"]) == 2
    assert capsys.readouterr().err == (
        "aiayn serve: error: --max-waiting must be at least 256 (one request's sentences), got 255\n"
    )
    with pytest.raises(SystemExit):
        main(["serve", "--request-timeout", "0"])
    assert "--request-timeout: must be a number of seconds above 0, got '0'" in capsys.readouterr().err
    assert served == []
    assert main(["serve"]) == 0 and main(["serve", "--max-waiting", "1000", "--request-timeout", "2.5"]) == 0
    assert [kwargs["limits"] for kwargs in served] == [Limits(), Limits(max_waiting=1000, request_timeout_s=2.5)]
