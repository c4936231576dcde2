"""`aiayn serve` as a process on loopback against a hostile client of its JSON route: a body of 1 GB sent in chunks
is cut at the limit (413) without the server's memory growing by it, a Content-Length over the limit is refused
before a byte of the body is sent, bad values are a 4xx with one JSON message through the whole server (Gradio's
app around the route), and `--request-timeout` answers a request past it with 503 (what a time limit drops from the
search: test_hostile_requests.py). And against a hostile client of its other doors (``doors.py``): Gradio's routes
the page does not use are 404, its direct REST routes closed, a page join bounded and parsed before Gradio reads it,
a client that leaves mid-body counted and logged without a traceback, no run history, no folder path in /metrics."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

import aiayn.serve.server
from aiayn.cli import main
from aiayn.serve.api import PATH
from aiayn.serve.limits import (
    MAX_BODY_BYTES,
    MAX_SENTENCES_PER_REQUEST,
    MAX_UPLOAD_BYTES,
    UPLOAD_FRAMING_BYTES,
    Limits,
)
from aiayn.text.sentences import MAX_CHARS

ROOT = Path(__file__).resolve().parents[2]
GB = 1024**3
CHUNK = 256 * 1024
MEMORY_GROWTH_MIB = 20


FLAGS = ["--host", "127.0.0.1", "--device", "cpu", "--model", "en-de"]


@pytest.fixture(scope="module")
def server(
    bundled: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, serve_page: Callable[..., Any]
) -> Iterator[Any]:
    flags = [*FLAGS[:-1], str(bundled["en-de"])]  # the model by its folder's path, which /metrics must not show
    with serve_page(flags, tmp_path_factory.mktemp("hostile") / "serve.log") as page:
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


def post(
    server: Any, body: bytes, content_type: str = "application/json", path: str = "/v1/translate"
) -> tuple[int, dict[str, str], Any]:
    with connect(server) as connection:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        connection.sendall(f"{head}Content-Type: {content_type}\r\nConnection: close\r\n\r\n".encode() + body)
        status, headers, raw = answer_of(connection)
    return status, headers, json.loads(raw)


def get(server: Any, path: str) -> tuple[int, bytes]:
    with connect(server) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        status, _, body = answer_of(connection)
    return status, body


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
        (b'{"sentences": ["dog \\ud800"]}', "application/json", 422, "character 5 is a lone surrogate (U+D800)"),
    ],
)
def test_a_bad_body_is_a_4xx_with_one_json_message_through_the_server(
    server: Any, body: bytes, content_type: str, status: int, message: str
) -> None:
    got, _, answer = post(server, body, content_type)
    assert got == status and list(answer) == ["error"] and message in answer["error"]


def test_the_lone_surrogate_is_refused_without_a_traceback(server: Any) -> None:
    assert post(server, b'{"sentences": ["dog \\udfff and cat"]}')[0] == 422
    assert "Traceback" not in server.log.read_text()


NOT_SERVED = [  # Gradio's routes the page never asks for: run history, monitoring, vibe editing, docs, a proxy, ...
    "/gradio_api/runs",
    "/gradio_api/run-history/buckets",
    "/monitoring",
    "/gradio_api/vibe-code",
    "/docs",
    "/gradio_api/openapi.json",
    "/gradio_api/proxy=http://127.0.0.1/",
    "/gradio_api/dev/reload",
    "/gradio_api/app_id",
    "/gradio_api/user",
    "/gradio_api/startup-events/../runs",
    "/nowhere",
    "/?page=%F0%9F%92%A9",  # a page the app has not (Gradio fails on it with a 500)
]


@pytest.mark.parametrize("path", NOT_SERVED)
def test_a_door_the_page_does_not_use_is_404_in_one_line(server: Any, path: str) -> None:
    status, body = get(server, path)
    assert status == 404 and list(json.loads(body)) == ["error"]


@pytest.mark.parametrize(
    "route", ["/gradio_api/run/translate", "/gradio_api/api/translate", "/gradio_api/call/v2/translate"]
)
def test_gradios_rest_routes_that_skip_the_queue_are_closed(server: Any, route: str) -> None:
    batch = {"data": [["A dog."] * 64, ["en-de"] * 64, [8] * 64], "batched": True}
    status, _, answer = post(server, json.dumps(batch).encode(), path=route)
    assert status == 404 and list(answer) == ["error"]


def test_the_pages_own_doors_still_answer(server: Any) -> None:
    for path in ["/", "/config", "/gradio_api/info", "/theme.css", "/healthz", "/readyz", "/metrics", "/openapi.json"]:
        assert get(server, path)[0] == 200, path
    status, _, answer = post(server, b'{"data": ["A dog.", "en-de", 4]}', path="/gradio_api/call/translate")
    assert status == 200 and list(answer) == ["event_id"]
    with connect(server) as connection:  # its stream read to its end: no drain waits for the request
        path = f"/gradio_api/call/translate/{answer['event_id']}"
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        stream = b"".join(iter(lambda: connection.recv(65536), b""))
    assert stream.startswith(b"HTTP/1.1 200") and b"event: complete" in stream


def test_run_history_is_off(server: Any) -> None:
    config = json.loads(get(server, "/config")[1])
    assert config["run_history"] is False and "runs" not in config["footer_links"]


def test_a_join_is_bounded_before_it_is_read_and_parsed_before_gradio_reads_it(server: Any) -> None:
    join = "/gradio_api/queue/join"
    with connect(server) as connection:  # 60 MB declared, not a byte sent: refused by its length
        head = f"POST {join} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {60 * 2**20}\r\n"
        connection.sendall(f"{head}Content-Type: application/json\r\n\r\n".encode())
        status, _, body = answer_of(connection)
    assert (status, json.loads(body)) == (413, {"error": f"the body has {60 * 2**20} bytes; at most {MAX_BODY_BYTES}"})
    deep = b"[" * 90_000 + b"]" * 90_000  # within the limit, deeper than Python parses
    assert post(server, deep, path=join)[:1] == (400,)
    assert post(server, deep, path="/gradio_api/call/translate")[:1] == (400,)
    status, _, answer = post(server, b'{"data": 5}', path=join)  # what Gradio's own check refuses: its 422
    assert status == 422
    status, _, answer = post(server, b'{"data": []}', path="/gradio_api/call/no_such_api_name")
    assert status == 422 and answer == {"error": "the page cannot read this request"}
    assert "Traceback" not in server.log.read_text()


@pytest.mark.parametrize(
    ("method", "path", "limit"),
    [
        ("POST", "/gradio_api/upload", MAX_UPLOAD_BYTES + UPLOAD_FRAMING_BYTES),
        ("GET", "/healthz", MAX_BODY_BYTES),
        ("POST", "/gradio_api/call/translate", MAX_BODY_BYTES),
    ],
)
def test_every_doors_body_is_refused_past_its_limit_before_it_is_read(
    server: Any, method: str, path: str, limit: int
) -> None:
    with connect(server) as connection:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {limit + 1}\r\n"
        connection.sendall(f"{head}Content-Type: multipart/form-data; boundary=x\r\n\r\n".encode())
        status, _, body = answer_of(connection)
    assert (status, json.loads(body)) == (413, {"error": f"the body has {limit + 1} bytes; at most {limit}"})


def test_a_join_in_chunks_is_cut_at_the_limit(server: Any) -> None:
    with connect(server) as connection:
        head = "POST /gradio_api/queue/join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        chunk = f"{CHUNK:x}\r\n".encode() + b" " * CHUNK + b"\r\n"
        try:
            for _ in range(MAX_BODY_BYTES // CHUNK + 2):
                connection.sendall(chunk)
        except OSError:  # the server answered and closed
            pass
        status, _, body = answer_of(connection)
    assert (status, json.loads(body)) == (
        413,
        {"error": f"the body has more than {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}"},
    )


def test_a_client_that_leaves_mid_body_is_counted_and_logged_without_a_traceback(server: Any) -> None:
    with connect(server) as connection:
        head = "POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode() + b'{"sentences": ["A')
    deadline = time.monotonic() + 30
    while "POST /v1/translate 499" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "POST /v1/translate 499" in server.log.read_text()
    assert "Traceback" not in server.log.read_text()
    status, metrics = get(server, "/metrics")
    assert 'aiayn_http_requests_total{route="/v1/translate",status="499"} 1.0' in metrics.decode()


def test_metrics_name_a_model_by_its_folders_name_never_its_path(
    server: Any, bundled: dict[str, Path], models_info: Callable[[str], list[dict[str, str]]]
) -> None:
    (model,) = models_info(server.url)
    assert model["model"] == "en-de"
    assert str(bundled["en-de"].parent) not in get(server, "/metrics")[1].decode()


def test_the_openapi_document_describes_our_doors_and_none_of_gradios(server: Any) -> None:
    status, body = get(server, "/openapi.json")
    document = json.loads(body)
    ours = ["/detect", "/healthz", "/languages", "/metrics", "/openapi.json", "/readyz", "/translate", PATH]
    assert status == 200 and sorted(document["paths"]) == ours  # LibreTranslate's doors beside ours
    translate = document["paths"][PATH]["post"]
    schema = translate["requestBody"]["content"]["application/json"]["schema"]
    sentences = schema["properties"]["sentences"]
    assert (sentences["maxItems"], sentences["items"]["maxLength"]) == (MAX_SENTENCES_PER_REQUEST, MAX_CHARS)
    assert schema["properties"]["direction"]["enum"] == ["en-de"]
    assert sorted(translate["responses"]) == ["200", "400", "403", "413", "415", "422", "429", "503"]
    error = translate["responses"]["422"]["content"]["application/json"]["schema"]
    assert error["required"] == ["error"]
    libre = document["paths"]["/translate"]["post"]
    assert sorted(libre["requestBody"]["content"]) == ["application/json", "application/x-www-form-urlencoded"]
    assert sorted(libre["responses"]) == sorted(translate["responses"])


def test_a_json_door_mounted_later_is_in_the_document() -> None:
    from fastapi.routing import APIRoute
    from starlette.routing import Mount

    from aiayn.serve import api
    from aiayn.serve.openapi import document_of
    from aiayn.serve.service import TranslationService

    # A new JSON door of this package, as it would be mounted (the route's handler at another path).
    door = APIRoute("/v2/another", api.json_route(TranslationService()).endpoint, methods=["POST"])
    gradios = Mount("", routes=[])  # the page mounted at the root, as Ray Serve's app has it
    assert sorted(document_of([door, gradios])["paths"]) == ["/v2/another"]


def schemathesis_passes(server: Any, *headers: str) -> None:
    """Schemathesis' default checks (schemathesis.toml: a 413 and a line the model cannot take are refusals it
    cannot read from a schema) on a bounded number of cases an operation, each request with ``headers``."""
    st = Path(sys.executable).parent / "st"
    command = [str(st), "run", f"{server.url}openapi.json", "--max-examples", "20", "--request-timeout", "60"]
    command += [part for header in headers for part in ("-H", header)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "Traceback" not in server.log.read_text()


def test_schemathesis_finds_no_server_error_and_every_answer_as_documented(server: Any) -> None:
    schemathesis_passes(server)


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
