"""Visitor sessions on the page: Gradio keeps each one's state, and only the most recent are kept."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client

import aiayn.serve.server
from aiayn.engines.options import EngineOptions
from aiayn.serve.page import build_app
from aiayn.serve.server import launch
from aiayn.serve.service import TranslationService

KEPT = 5


@pytest.fixture
def app(bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[gr.Blocks]:
    monkeypatch.setattr(aiayn.serve.server, "SESSIONS_KEPT", KEPT)
    page = build_app(TranslationService(EngineOptions(device="cpu")), ["en-de"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch(page, port=port)
    yield page
    page.close()


def test_only_the_most_recent_sessions_are_kept_and_a_dropped_one_still_translates(app: gr.Blocks) -> None:
    client = Client(app.local_url, verbose=False)
    first = client.session_hash
    answers = set()
    for _ in range(3 * KEPT):
        answers.add(client.predict("A dog runs.", "en-de", 1, api_name="/translate")[0])
        client.reset_session()
    assert len(app.state_holder.session_data) == KEPT and first not in app.state_holder.session_data
    client.session_hash = first  # a visitor whose session was dropped comes back
    assert client.predict("A dog runs.", "en-de", 1, api_name="/translate")[0] in answers and len(answers) == 1
