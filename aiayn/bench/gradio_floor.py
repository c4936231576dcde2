"""Gradio's own floor for `aiayn bench --serve`: the page's translate API with nothing behind it.

The same event as the page's (``serve/page.py``): the same three inputs and two outputs, batched as the page
batches, the same queue bound and concurrency, launched by the same ``serve.server.launch``; but its handler
gives each text back as its "translation". What a crowd costs this server is what Gradio itself costs per request,
so the page's figures are read against it: ``python -m aiayn.bench.gradio_floor PORT``.
"""

from __future__ import annotations

import sys
from typing import Any

import gradio as gr

from aiayn.serve.page import BATCH_SIZE, BATCHES_AT_ONCE, MAX_WAITING
from aiayn.serve.server import apply_gradio_settings, launch


def echo(text: list[Any], direction: list[Any], beam_size: list[Any]) -> tuple[list[str], list[str]]:
    return [str(t) for t in text], ["" for _ in text]


def floor_app() -> gr.Blocks:
    with gr.Blocks() as app:
        source, output, status = gr.Textbox(), gr.Textbox(), gr.Markdown()
        direction, beam = gr.Dropdown(["floor"], value="floor"), gr.Slider(1, 8, value=4, step=1)
        gr.Button().click(
            echo,
            [source, direction, beam],
            [output, status],
            api_name="translate",
            batch=True,
            max_batch_size=BATCH_SIZE,
            concurrency_limit=BATCHES_AT_ONCE,
            preprocess=False,
        )
    app.queue(max_size=MAX_WAITING, default_concurrency_limit=BATCHES_AT_ONCE)
    return app


if __name__ == "__main__":
    apply_gradio_settings()
    app = floor_app()
    launch(app, port=int(sys.argv[1]))
    app.block_thread()
