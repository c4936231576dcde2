"""The page's API through gradio_client against a real server on loopback, the bundled en-de model."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from aiayn.serve.app import build_app
from aiayn.serve.service import TranslationService

SENTENCES = ["Two dogs play in the snow.", "A man in a blue shirt is riding a bike.", "A girl jumps into the pool."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(bundled: dict[str, Path]) -> Iterator[str]:
    app = build_app(TranslationService(engine="onnx", device="cpu"))
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    app.close()


@pytest.fixture(scope="module")
def client(server: str) -> Client:
    return Client(server, verbose=False)


def cli_translate(lines: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "aiayn.cli", "translate", "--model", "en-de", "--device", "cpu"],
        input="\n".join(lines),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_api_translation_equals_the_cli_and_reports_the_provider(client: Client) -> None:
    expected = cli_translate(SENTENCES)
    for sentence, want in zip(SENTENCES, expected, strict=True):
        text, status = client.predict(sentence, "en-de", 4, api_name="/translate")
        assert text == want
        assert "CPUExecutionProvider" in status
    assert client.predict("Zwei Hunde spielen im Schnee.", "de-en", 4, api_name="/translate")[0] == (
        "Two dogs play in the snow."
    )


@pytest.mark.parametrize("text", ["", "   \n  "])
def test_empty_input_gives_an_empty_answer(client: Client, text: str) -> None:
    assert client.predict(text, "en-de", 4, api_name="/translate")[0].strip() == ""


def test_bad_inputs_get_clear_answers_and_the_server_keeps_serving(client: Client, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="5000"):
        client.predict("Dogs run. " * 1000, "en-de", 4, api_name="/translate")
    long_sentence = " ".join(["the big dog runs and the small cat sleeps"] * 45)  # ~400 tokens
    translated, _ = client.predict(long_sentence, "en-de", 1, api_name="/translate")
    assert translated.count("Hund") >= 20  # split into pieces, every piece translated
    mixed, _ = client.predict("A dog 🐕 runs — 狗 runs. Привет!", "en-de", 4, api_name="/translate")
    assert isinstance(mixed, str) and mixed
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Ein Hund läuft.".encode("latin-1"))
    with pytest.raises(Exception, match="UTF-8"):
        client.predict(handle_file(str(bad)), "de-en", 4, api_name="/translate_file")
    good = tmp_path / "lines.txt"
    good.write_text("Two dogs play in the snow.\n\nA girl jumps into the pool.\n", encoding="utf-8")
    out = Path(client.predict(handle_file(str(good)), "en-de", 4, api_name="/translate_file"))
    assert out.read_text(encoding="utf-8").splitlines() == [
        cli_translate([SENTENCES[0]])[0],
        "",
        cli_translate([SENTENCES[2]])[0],
    ]
    assert client.predict(SENTENCES[0], "en-de", 4, api_name="/translate")[0]


def test_concurrent_load_matches_serial_answers(server: str) -> None:
    serial = {s: Client(server, verbose=False).predict(s, "en-de", 4, api_name="/translate")[0] for s in SENTENCES}
    clients = [Client(server, verbose=False) for _ in range(8)]

    def request(i: int) -> tuple[str, str, float]:
        sentence = SENTENCES[i % len(SENTENCES)]
        started = time.perf_counter()
        text, _ = clients[i % 8].predict(sentence, "en-de", 4, api_name="/translate")
        return sentence, text, time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(request, range(200)))
    assert all(text == serial[sentence] for sentence, text, _ in results)
    latencies = sorted(seconds * 1000 for _, _, seconds in results)
    print(
        f"\n200 requests, 8 clients: median {statistics.median(latencies):.0f} ms, "
        f"p95 {latencies[int(0.95 * len(latencies)) - 1]:.0f} ms"
    )
