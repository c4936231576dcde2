"""The translation page (Gradio Blocks) and its named API endpoint ``translate``. Torch-free."""

from __future__ import annotations

import html
import socket
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import gradio as gr
import numpy as np
from gradio.data_classes import FileData
from pydantic import ValidationError
from starlette.routing import BaseRoute

from aiayn.core.folder import ModelFolder, bundled_models
from aiayn.serve import admission
from aiayn.serve.service import MAX_BEAM, Attention, LoadedModel, Result, TranslationService
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS, check_length

# The page's translate event is batched: Gradio hands its handler up to BATCH_SIZE waiting requests at once, and
# their searches run together in the batcher's one worker thread (``batching.py``); Gradio's own work per request
# (its session state, pre- and post-processing) is then paid once per batch. Two batches at once let Gradio
# prepare the next while one is searched. The queue's bound and the door for bad requests: ``admission.py``.
BATCH_SIZE = 128
BATCHES_AT_ONCE = 2
MAX_UPLOAD = "1mb"  # a .txt upload; its text must also stay within MAX_FILE_CHARS
# Gradio keeps a copy of every component's config per visitor session (~40 KB here), by default for 10 000
# sessions (~400 MB); the oldest beyond this many are dropped. A dropped visitor's page still translates; only
# switching the heatmap's head asks to translate again.
SESSIONS_KEPT = 100
# Gradio's queue also keeps a message queue per session, the last 2 000 (+3 MiB a thousand sessions); each request
# that waits or runs needs its own (at most admission.MAX_WAITING + BATCHES_AT_ONCE * BATCH_SIZE at once).
MESSAGE_QUEUES_KEPT = admission.MAX_WAITING + BATCHES_AT_ONCE * BATCH_SIZE
HEATMAP_MAX_TOKENS = 60  # per axis; a longer sentence's heatmap shows its beginning
VAL_EXAMPLES = 6
FALLBACK_EXAMPLES = {  # written for this page (not from Multi30k), for when the corpus is absent, as on a Space
    "en": [
        "A brown dog carries a stick through the tall grass.",
        "Two children are building a sandcastle near the water.",
        "A woman in a red jacket is reading a book on a bench.",
        "An old man is selling fruit at a market stall.",
    ],
    "de": [
        "Ein brauner Hund trägt einen Stock durch das hohe Gras.",
        "Zwei Kinder bauen eine Sandburg am Wasser.",
        "Eine Frau in einer roten Jacke liest ein Buch auf einer Bank.",
        "Ein alter Mann verkauft Obst an einem Marktstand.",
    ],
}


def examples_for(model: LoadedModel) -> tuple[list[str], str]:
    """Source sentences of the validation pairs the folder kept (a user's own corpus), else of the Multi30k
    validation split where the pair is Multi30k's, else the built-in ones of the source language; and a label."""
    from aiayn.data.multi30k import is_multi30k_pair, load_parallel

    kept = model.folder.validation_sample()
    if kept:
        return [src for src, _ in kept[:VAL_EXAMPLES]], "Examples (validation sentences kept in the model folder)"
    src, tgt = model.config.src_lang, model.config.tgt_lang
    if is_multi30k_pair(src, tgt):
        try:
            return load_parallel("val", src, tgt, download=False).src[:VAL_EXAMPLES], "Examples (Multi30k validation)"
        except FileNotFoundError:
            pass
    return FALLBACK_EXAMPLES.get(src, []), "Examples"


def status_line(result: Result) -> str:
    if not result.sentences:
        return f"Nothing to translate · {result.provider}"
    parts = [f"{result.sentences} sentence(s) in {result.latency_ms:.0f} ms on {result.provider}"]
    if result.left_out:
        parts.append("not in the model's vocabulary, left out: " + " ".join(result.left_out[:20]))
    if result.kept:
        parts.append(f"{result.kept} sentence(s) without a known word kept as they are")
    if result.short_lines:
        lines = ", ".join(str(n + 1) for n in result.short_lines[:20])
        parts.append(f"line(s) {lines}: the translation looks short for its source, a part may be missing")
    if result.unsure_lines:
        lines = ", ".join(str(n + 1) for n in result.unsure_lines[:20])
        parts.append(f"line(s) {lines}: the model is unsure of this translation, check it")
    parts += [f"line {line + 1} not translated: {reason}" for line, reason in result.refused]
    return " · ".join(parts)


def heatmap_html(attention: Attention | None, head: str) -> str:
    """Output tokens (rows) × source tokens (columns) as a coloured table: darker is more attention."""
    if attention is None:
        return "<p>Translate a sentence to see where the model looked.</p>"
    weights = attention.weights.mean(axis=0) if head == "average" else attention.weights[int(head)]
    n_out = min(len(attention.output_tokens), HEATMAP_MAX_TOKENS)
    n_src = min(len(attention.source_tokens), HEATMAP_MAX_TOKENS)
    header = "".join(f"<th>{html.escape(t)}</th>" for t in attention.source_tokens[:n_src])
    rows = []
    for out_token, row in zip(attention.output_tokens[:n_out], weights[:n_out, :n_src], strict=True):
        cells = "".join(
            f'<td style="background: rgba(37, 99, 235, {w:.3f}); color: {"#fff" if w > 0.5 else "#111"}">{w:.2f}</td>'
            for w in np.asarray(row, dtype=float)
        )
        rows.append(f"<tr><th>{html.escape(out_token)}</th>{cells}</tr>")
    shown = f"{n_out} × {n_src} of {len(attention.output_tokens)} × {len(attention.source_tokens)} tokens"
    note = f"<p>Showing the first {shown}.</p>" if (n_out, n_src) != weights.shape else ""
    return (
        f'<div id="attention-heatmap" style="overflow-x: auto">{note}'
        '<table style="border-collapse: collapse; font-size: 12px">'
        f"<tr><th>output \\ source</th>{header}</tr>{''.join(rows)}</table></div>"
    )


def user_error(message: str) -> gr.Error:
    """A bad input's message for the page and the API, without the traceback Gradio would print in the server
    log for every one. Gradio shows the message as HTML: the user's own text in it is escaped."""
    return gr.Error(html.escape(message, quote=False), print_exception=False)


def beam_size_of(value: Any) -> int:
    """The beam size as the page or the API sent it: a whole number from 1 to MAX_BEAM, else one user error for
    every way it can be wrong. (Gradio's own check of the slider fails on text or None with a generic error,
    rounds 2.7 to 2, and words 0 and 9 differently.)"""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not float(value).is_integer()
        or not 1 <= value <= MAX_BEAM
    ):
        raise user_error(f"beam size must be a whole number from 1 to {MAX_BEAM}, got {value!r}")
    return int(value)


class Upload(FileData):
    """A UTF-8 .txt file to translate; from Python, send gradio_client.handle_file(path)."""

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        """Gradio checks an API's file input here even with preprocess=False, and answers anything but an
        uploaded file with a generic error (its check raises no gr.Error): this one says what to send."""
        try:
            return super().model_validate(obj, **options)
        except ValidationError:
            raise user_error(f"the file must be uploaded (gradio_client.handle_file(path)), got {obj!r:.80}") from None


def upload_path(payload: Any) -> str | None:
    """The server path of an uploaded file as Gradio hands it over unprocessed (already checked to be one of
    its uploads, in its cache), or None when the upload was cleared."""
    return payload.get("path") if isinstance(payload, dict) else None


def read_upload(path: str) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise user_error(
            f"the file is not UTF-8 text (byte {err.start} cannot be read); save it as UTF-8 and upload it again"
        ) from None


@dataclass(frozen=True)
class Direction:
    """A served model as the page and the API name it."""

    value: str  # the API's: its pair, ``en-es``; ``en-es:FOLDER`` where several served models share the pair
    label: str  # the page's: ``en → es``, and ``(FOLDER)`` where several share the pair
    name: str  # what the service loaded it by: a bundled name or a folder
    pair: tuple[str, str]
    model: LoadedModel


def pair_value(folder: ModelFolder) -> str:
    """The API's direction value of a folder's pair, ``en-es`` (``directions`` adds the folder's name where two
    served folders share a pair)."""
    config = folder.config
    return f"{config.src_lang}-{config.tgt_lang}"


def directions(models: dict[str, LoadedModel]) -> dict[str, Direction]:
    """The served models by their API value, from each folder's own languages (config.json), never its path."""
    pairs = Counter((m.config.src_lang, m.config.tgt_lang) for m in models.values())
    found: dict[str, Direction] = {}
    for name, model in models.items():
        src, tgt = pair = model.config.src_lang, model.config.tgt_lang
        value, label = pair_value(model.folder), f"{src} → {tgt}"
        if pairs[pair] > 1:
            folder = model.folder.path.name
            value, label = f"{value}:{folder}", f"{label} ({folder})"
        if value in found:
            raise ValueError(f"{found[value].name} and {name} are both {label}: serve one, or rename a folder")
        found[value] = Direction(value, label, name, pair, model)
    return found


def build_app(service: TranslationService, model_names: list[str] | None = None) -> gr.Blocks:
    """The page over ``model_names`` (default: the bundled models), loaded and checked before it starts."""
    names = model_names or list(bundled_models())
    if not names:
        raise FileNotFoundError("no bundled models found; pass --model DIR or add folders under pretrained/")
    served = directions({name: service.model(name) for name in names})
    first = next(iter(served.values()))
    reverse = {  # direction → the first served one of the reverse pair, for the swap button
        d.value: next((r.value for r in served.values() if r.pair == d.pair[::-1]), None) for d in served.values()
    }
    downloads = Path(tempfile.mkdtemp(prefix="aiayn-downloads-"))

    # The API's two endpoints take their inputs unprocessed (preprocess=False) and check them here: Gradio's own
    # checks answer a bad beam size with a generic error, and print a traceback in the log for every refusal.
    def direction_of(value: Any) -> Direction:
        if not isinstance(value, str) or value not in served:
            raise user_error(f"{value} is not in the list of choices: {', '.join(served)}")
        return served[value]

    def checked(text: Any, direction: Any, beam_size: Any) -> tuple[str, str, int]:
        """A request's (text, model, beam size) as the service takes them, or the page's message for it."""
        model, beam = direction_of(direction).name, beam_size_of(beam_size)
        text = "" if text is None else str(text)
        try:
            check_length(text)
        except ValueError as err:
            raise user_error(str(err)) from None
        return text, model, beam

    def is_valid(inputs: Sequence[Any]) -> bool:
        try:
            checked(*inputs)
        except (gr.Error, TypeError):  # TypeError: not three inputs
            return False
        return True

    # Batched: each argument is a list, one item a request; named as one request's inputs, since view_api() shows
    # these names to the API's callers.
    def translate(text: list[Any], direction: list[Any], beam_size: list[Any]) -> tuple[list[str], list[str]]:
        """Translate up to 5000 characters; returns the translation and a line with latency and execution provider."""
        requests = [checked(*inputs) for inputs in zip(text, direction, beam_size, strict=True)]
        results = service.translate_many(requests)
        return [result.text for result in results], [status_line(result) for result in results]

    def translate_alone(text: Any, direction: Any, beam_size: Any) -> tuple[str, str]:
        """A request the queue's door found bad (``admission.py``): answered alone, with the page's message."""
        texts, statuses = translate([text], [direction], [beam_size])
        return texts[0], statuses[0]

    def show_attention(text: Any, direction: Any, beam_size: Any, head: str) -> tuple[Attention | None, str]:
        """The heatmap, asked for by the page after a translation (the API's callers never pay for it)."""
        attention = service.attention(*checked(text, direction, beam_size))
        return attention, heatmap_html(attention, head)

    def translate_file(upload: Any, direction: Any, beam_size: Any) -> str | None:
        """Translate an uploaded UTF-8 .txt file line by line into a file to download."""
        path = upload_path(upload)
        if path is None:
            return None
        chosen, beam = direction_of(direction), beam_size_of(beam_size)
        text = read_upload(path)  # its error is already the user's, not a ValueError to wrap again
        try:
            translated = service.translate_file(text, chosen.name, beam)
        except ValueError as err:
            raise user_error(str(err)) from None
        out = Path(tempfile.mkdtemp(dir=downloads)) / f"{Path(path).stem}.{'-'.join(chosen.pair)}.txt"
        out.write_text(translated + "\n", encoding="utf-8")
        return str(out)

    def swap(direction: str, source: str, target: str) -> tuple[str, str, str]:
        back = reverse[direction]
        return (back, target, source) if back is not None else (direction, source, target)

    def change_direction(direction: str) -> tuple[gr.Dataset, gr.Radio, None]:
        model = served[direction].model
        samples, label = examples_for(model)
        heads = ["average"] + [str(h) for h in range(model.config.n_heads)]
        return gr.Dataset(samples=[[s] for s in samples], label=label), gr.Radio(heads, value="average"), None

    def cleared() -> tuple[str, str, None, str]:
        """After a refused request: no earlier translation, timing or heatmap left beside its error."""
        return "", "", None, heatmap_html(None, "average")

    first_examples, examples_label = examples_for(first.model)
    with gr.Blocks(title="aiayn — Attention Is All You Need", delete_cache=(3600, 3600)) as app:
        gr.Markdown(
            "# aiayn: the Transformer of *Attention Is All You Need*\n"
            f"ONNX Runtime and NumPy on **{first.model.provider}**, {service.variant} weights. "
            f"Up to {MAX_CHARS} characters per request; sentences are translated one by one, line breaks kept. "
            f"When many translate at once, requests wait in line, at most about {admission.LONGEST_WAIT_S} s: "
            "the place in line and the expected wait show on the translation."
        )
        with gr.Row():
            direction = gr.Dropdown(
                [(d.label, d.value) for d in served.values()],
                value=first.value,
                label="Direction",
                elem_id="direction",
                scale=3,
            )
            swap_button = gr.Button("⇄ Swap", elem_id="swap-button", scale=1)
            beam = gr.Slider(1, MAX_BEAM, value=4, step=1, precision=0, label="Beam size (1 = greedy)", scale=3)
        with gr.Row():
            source = gr.Textbox(lines=6, label="Source text", elem_id="source-text")
            output = gr.Textbox(lines=6, label="Translation", elem_id="translation", buttons=["copy"])
        status = gr.Markdown(label="Status", elem_id="status")  # the label names the API's second output
        translate_button = gr.Button("Translate", variant="primary", elem_id="translate-button")
        examples = gr.Dataset(
            components=[source], samples=[[s] for s in first_examples], label=examples_label, elem_id="examples"
        )
        title = "Cross-attention of the last decoder layer (first sentence; of a long one, its first clause)"
        with gr.Accordion(title, open=True):
            head = gr.Radio(
                ["average"] + [str(h) for h in range(first.model.config.n_heads)], value="average", label="Head"
            )
            heatmap = gr.HTML(heatmap_html(None, "average"), elem_id="heatmap")
        with gr.Accordion(f"Translate a UTF-8 .txt file (up to {MAX_FILE_CHARS} characters)", open=False):
            upload = gr.File(file_types=[".txt"], label="Text file, one or more lines", elem_id="upload")
            upload.data_model = Upload  # its check of an API call says what to send
            download = gr.File(label="Translation", elem_id="download")
        attention = gr.State(None)

        translated = translate_button.click(
            translate,
            [source, direction, beam],
            [output, status],
            api_name="translate",
            batch=True,
            max_batch_size=BATCH_SIZE,
            concurrency_limit=BATCHES_AT_ONCE,
            preprocess=False,
        )
        translated.success(
            show_attention, [source, direction, beam, head], [attention, heatmap], api_visibility="private"
        )
        refused = gr.on(
            [], translate_alone, [source, direction, beam], [output, status], preprocess=False, api_visibility="private"
        )
        for event in (translated, refused):  # no earlier translation, timing or heatmap left beside an error
            event.failure(cleared, None, [output, status, attention, heatmap], api_visibility="private")
        head.change(heatmap_html, [attention, head], heatmap, api_visibility="private")
        swap_button.click(swap, [direction, source, output], [direction, source, output], api_visibility="private")
        direction.change(change_direction, direction, [examples, head, attention], api_visibility="private")
        examples.click(lambda sample: sample[0], examples, source, api_visibility="private")
        upload.upload(
            translate_file,
            [upload, direction, beam],
            download,
            api_name="translate_file",
            concurrency_limit=1,
            preprocess=False,
        ).failure(lambda: None, None, download, api_visibility="private")  # no earlier file beside the error
    app.queue(default_concurrency_limit=BATCHES_AT_ONCE)
    admission.admit(app, translated["id"], refused["id"], is_valid)
    return app


def port_error(host: str, port: int) -> ValueError:
    return ValueError(
        f"cannot listen on {host}:{port}: the port is in use (or {host} is not an address of this machine); "
        "stop what listens there or choose another --port"
    )


def check_port(host: str, port: int) -> None:
    """Refuse a port that cannot be listened on before the models load (``launch`` only finds out after)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: only a listener blocks
        try:
            probe.bind((host, port))
        except OSError:
            raise port_error(host, port) from None


def launch(
    app: gr.Blocks,
    host: str = "127.0.0.1",
    port: int = 7860,
    share: bool = False,
    block: bool = True,
    routes: Sequence[BaseRoute] = (),
) -> None:
    """Serve the page, and ``routes`` beside it (``api.json_route``); ``block=False`` returns once the server is
    up. A port in use is one clear error."""
    try:
        app.launch(
            server_name=host,
            server_port=port,
            share=share,
            max_file_size=MAX_UPLOAD,
            prevent_thread_lock=True,
            quiet=not block,
            state_session_capacity=SESSIONS_KEPT,
            app_kwargs={"routes": list(routes)},
        )
    except OSError:  # Gradio's "Cannot find empty port", whatever the cause
        raise port_error(host, port) from None
    app._queue.pending_messages_per_session.max_size = MESSAGE_QUEUES_KEPT
    if block:
        app.block_thread()
