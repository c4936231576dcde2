"""The page against a hostile or careless visitor, its handlers called as Gradio calls them (over fakes of the
service): whatever one request of a batch raises is that request's refusal line and its batch-mates are answered;
an upload is read only from Gradio's upload folder; translated files are deleted after their hour and kept to a
bound; `app.py`, the repository's and an exported Space's, listens on every interface only where Spaces runs it; a
lone surrogate is refused where text is checked; the access log keeps a line a request, whatever the text, and never
waits on its stream."""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from test_api_body import served

import aiayn.serve.page
import aiayn.serve.server
from aiayn.export.space import APP
from aiayn.serve import metrics
from aiayn.serve.access_log import LINE_BREAKS, QUEUED_LINES, AccessLine, AccessLog
from aiayn.serve.downloads import PREFIX, Downloads
from aiayn.serve.limits import Limits
from aiayn.serve.page import Handlers
from aiayn.serve.server import space_host
from aiayn.serve.service import Result, TranslationService

ROOT = Path(__file__).resolve().parents[2]


def result(text: str) -> Result:
    return Result(text, "CPUExecutionProvider", 12.0, 1, [], 0, [], [], [], [])


class Fragile(TranslationService):
    """The service whose search breaks on any batch holding "boom" (as an engine that fails on one input would
    fail every request searched with it); the rest in capitals. It keeps each call's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def translate_many(self, requests: Sequence[tuple[str, str, int | None]], timeout_s: float | None = None) -> Any:
        self.calls.append([text for text, _, _ in requests])
        if any("boom" in text for text, _, _ in requests):
            raise RuntimeError("the engine broke")
        return [result(text.upper()) for text, _, _ in requests]

    def translate_file(
        self, text: str, model: str, beam_size: int | None = None, timeout_s: float | None = None
    ) -> str:
        return text.upper()


def handlers(service: TranslationService) -> Handlers:
    return Handlers(service, served(), Downloads())


def test_whatever_one_request_raises_is_its_refusal_and_its_batch_mates_are_answered(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    checked = aiayn.serve.page.checked

    def picky(served: Any, text: Any, direction: Any, beam_size: Any, limits: Limits) -> Any:  # fails unforeseen
        if text == "odd":
            raise KeyError("odd")
        return checked(served, text, direction, beam_size, limits)

    monkeypatch.setattr(aiayn.serve.page, "checked", picky)
    monkeypatch.setattr(metrics.RECORDER, "metrics", counted := metrics.Metrics())
    service = Fragile()
    texts, statuses = handlers(service).translate(
        ["A dog.", "boom", "odd", "A cat.", "x", "y", "z" * 5001],
        ["en-de", "en-de", "en-de", "de-en", "fr-en", "en-de", "en-de"],
        [4, 4, 4, None, 4, 10**400, 4],
    )
    assert texts == ["A DOG.", "", "", "A CAT.", "", "", ""]
    assert statuses[0] == statuses[3] == "1 sentence(s) in 12 ms on CPUExecutionProvider"
    assert statuses[1:3] == [
        "not translated: the server failed on this request (RuntimeError); try again, or another text",
        "not translated: the server failed on this request (KeyError); try again, or another text",
    ]
    assert statuses[4:6] == [
        "not translated: fr-en is not in the list of choices: en-de, de-en",
        "not translated: beam size must be a whole number from 1 to 8, got a whole number of more than 40 digits",
    ]
    assert statuses[6].startswith("not translated: the text has 5001 characters; at most 5000 ")
    # The three searchable ones asked together; once that failed, each alone.
    assert service.calls == [["A dog.", "boom", "A cat."], ["A dog."], ["boom"], ["A cat."]]
    assert "the engine broke" in caplog.text and "KeyError" in caplog.text  # the tracebacks, for whoever runs it
    # The three bad inputs counted as refusals, each once; the server's own failures are not the visitors' fault.
    refusals = {
        sample.labels["reason"]: sample.value
        for family in counted.registry.collect()
        if family.name == "aiayn_refusals"
        for sample in family.samples
        if sample.name == "aiayn_refusals_total"
    }
    assert refusals == {"bad_field": 3}


@pytest.fixture
def upload_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "gradio"
    folder.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))  # where Gradio keeps uploads (its documented setting)
    return folder


def test_an_upload_is_read_only_from_gradios_upload_folder(upload_folder: Path, tmp_path: Path) -> None:
    page = handlers(Fragile())
    (upload_folder / "abc123").mkdir()
    uploaded = upload_folder / "abc123" / "lines.txt"
    uploaded.write_text("A dog.\nA cat.\n", encoding="utf-8")
    out = page.translate_file({"path": str(uploaded)}, "en-de", 4)
    assert out is not None and Path(out).name == "lines.en-de.txt"
    assert Path(out).read_text(encoding="utf-8") == "A DOG.\nA CAT.\n\n"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for visitors", encoding="utf-8")
    (upload_folder / "link.txt").symlink_to(secret)
    for path in [
        str(secret),
        str(upload_folder / ".." / "secret.txt"),
        str(upload_folder / "link.txt"),
        str(upload_folder),  # the folder itself
        "/etc/hostname",
        "lines.txt",  # relative: to the server's working folder
    ]:
        with pytest.raises(gr.Error) as refused:
            page.translate_file({"path": path}, "en-de", 4)
        assert refused.value.message == "the upload is not a file uploaded to this page; upload it again"
    with pytest.raises(gr.Error) as refused:
        page.translate_file({"path": ["a", 1]}, "en-de", 4)  # not even a path: the same one line
    assert refused.value.message == "the upload is not a file uploaded to this page; upload it again"
    with pytest.raises(gr.Error) as refused:
        page.translate_file({"path": str(uploaded)}, "en-de", 10**400)
    assert refused.value.message.startswith("beam size must be a whole number from 1 to 8, got a whole number")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def kept(downloads: Downloads) -> list[str]:
    return sorted(p.name for p in downloads.root.glob("*/*"))


def test_translated_files_are_deleted_after_their_hour_and_kept_to_a_count_and_a_size() -> None:
    clock = Clock()
    downloads = Downloads(Limits(download_max_age_s=3600, downloads_kept=3, download_bytes_kept=100), clock)
    assert downloads.root.name.startswith(PREFIX)
    downloads.write("a.txt", "a" * 10)
    clock.now += 1800
    downloads.write("b.txt", "b" * 10)
    downloads.write("c.txt", "c" * 10)
    assert kept(downloads) == ["a.txt", "b.txt", "c.txt"]
    downloads.write("d.txt", "d" * 10)  # a fourth: the oldest goes
    assert kept(downloads) == ["b.txt", "c.txt", "d.txt"]
    clock.now += 3600  # b, c and d are an hour old
    downloads.write("e.txt", "e" * 10)
    assert kept(downloads) == ["e.txt"]
    downloads.write("f.txt", "f" * 60)
    downloads.write("g.txt", "g" * 30)  # 10 + 60 + 30 bytes: at the size bound
    assert kept(downloads) == ["e.txt", "f.txt", "g.txt"]
    downloads.write("h.txt", "h")  # one byte more: the oldest goes
    assert kept(downloads) == ["f.txt", "g.txt", "h.txt"]
    assert len(list(downloads.root.iterdir())) == 3  # each file's folder deleted with it


def test_the_downloads_folder_goes_with_its_server_and_touches_nothing_else(tmp_path: Path) -> None:
    other = Path(tmp_path / f"{PREFIX}another-server")  # another server's, or anyone's: never ours to delete
    (other / "x").mkdir(parents=True)
    downloads = Downloads()
    downloads.write("a.txt", "a")
    root = downloads.root
    del downloads
    gc.collect()
    assert not root.exists() and (other / "x").is_dir()


@pytest.mark.parametrize(
    ("environ", "host"),
    [
        ({}, "127.0.0.1"),
        ({"SPACE_ID": "someone/aiayn-en-de"}, "0.0.0.0"),
        ({"SYSTEM": "spaces"}, "0.0.0.0"),
        ({"SYSTEM": "laptop", "SPACE_ID": ""}, "127.0.0.1"),
    ],
)
def test_app_py_listens_on_every_interface_only_where_spaces_runs_it(
    environ: dict[str, str], host: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert space_host(environ) == host
    for name in ("SPACE_ID", "SYSTEM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    asked: list[str] = []
    monkeypatch.setattr(aiayn.serve.server, "serve", lambda *args, **kwargs: asked.append(kwargs["host"]))
    exported = tmp_path / "app.py"  # an exported Space's, as `aiayn export --to space` writes it
    exported.write_text(
        APP.format(label="en → de", provenance="a test", model_dir="model", device="cpu", variant="fp32", mcp=False)
    )
    for app in (ROOT / "app.py", exported):
        runpy.run_path(str(app), run_name="__main__")
    assert asked == [host, host]
    assert os.environ.get("SPACE_ID") == environ.get("SPACE_ID")


def test_a_lone_surrogate_is_the_requests_refusal_on_the_page() -> None:
    texts, statuses = handlers(Fragile()).translate(["A dog \ud800.", "A cat."], ["en-de", "en-de"], [4, 4])
    assert texts == ["", "A CAT."]
    assert statuses[0] == (
        "not translated: the text is not Unicode text: character 7 is a lone surrogate (U+D800), "
        "which no encoding can write"
    )


def test_every_line_break_is_escaped_in_the_access_logs_text() -> None:
    every = "".join(chr(c) for c in range(sys.maxunicode + 1) if len(f"a{chr(c)}b".splitlines()) > 1)
    assert sorted(LINE_BREAKS) == sorted(every)  # str.splitlines' own list: \n, \r, \v, \f, \x1c-\x1e, NEL, U+2028/9
    text = ["one" + "".join(f"{ch}x" for ch in every) + " \ud800 end"]
    for format in ("text", "json"):
        log = AccessLog(format, with_text=True, out=(out := io.StringIO()))
        log.write(AccessLine("POST", "/v1/translate", 200, 1.0, 1, text))
        assert log.flush()
        (line,) = out.getvalue().splitlines()
        assert line.endswith('end"]' if format == "text" else 'end"]}')
        if format == "json":
            assert json.loads(line)["text"] == text  # JSON's escapes read back as the very text


def test_the_access_log_never_waits_on_a_stalled_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.RECORDER, "metrics", counted := metrics.Metrics())
    read_end, write_end = os.pipe()  # nobody reads: once the pipe's buffer is full, a write blocks
    stalled = os.fdopen(write_end, "w")
    try:
        log = AccessLog("text", out=stalled)
        line = AccessLine("GET", "/healthz", 200, 1.0, None, None)
        done = threading.Event()

        def requests() -> None:
            for _ in range(QUEUED_LINES + 5000):  # many times the pipe's buffer, and more than the queue holds
                log.write(line)
            done.set()

        threading.Thread(target=requests, daemon=True).start()
        assert done.wait(timeout=60)  # with the writes on the caller's thread, the first full buffer blocks it
        dropped = counted.registry.get_sample_value("aiayn_access_log_dropped_total")
        assert dropped is not None and dropped > 0  # beyond the queue's bound: dropped and counted
    finally:
        os.close(read_end)
