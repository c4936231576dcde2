"""The translation page (Gradio Blocks) and its named API endpoints ``translate`` and ``translate_file``, through
Gradio's public API only. Torch-free."""

from __future__ import annotations

import html
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from aiayn.core.folder import named_or_bundled
from aiayn.search.translator import MAX_BEAM
from aiayn.serve import metrics
from aiayn.serve.downloads import Downloads
from aiayn.serve.limits import DEFAULT_LIMITS, Limits, Reason
from aiayn.serve.requests import (
    BadRequest,
    Direction,
    Request,
    beam_of,
    check_work,
    checked,
    direction_of,
    directions,
    read_upload,
    refusal_of,
)
from aiayn.serve.service import Attention, LoadedModel, Result, TimedOut, TranslationService
from aiayn.serve.status import refused_line, status_line
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS, check_length

# The page's translate event is batched: Gradio hands its handler up to BATCH_SIZE waiting requests at once, and
# their searches run together in the batcher's worker threads (``batching.py``); Gradio's own work per request
# (its session state, pre- and post-processing) is then paid once per batch. Two batches at once let Gradio
# prepare the next while one is searched.
BATCH_SIZE = 128
BATCHES_AT_ONCE = 2
# The queue's bound: about 30 s of work at the page's measured rate on two cores (docs/serve.md, A crowd), and
# within what Gradio keeps a message queue for (its 2 000 most recent sessions; each request that waits or runs
# needs its own): 1 700 + 2 batches of 128 < 2 000.
MAX_WAITING = 1700
RECENT_RESULTS = 1024  # translations kept for the marks the page shows after each (the private event reads them)
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


def heads_of(model: LoadedModel) -> list[str]:
    return ["average"] + [str(h) for h in range(model.config.n_heads)]


@dataclass
class RecentResults:
    """The page's last translations by request, so that its marks are not searched a second time."""

    kept: OrderedDict[Request, Result] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, request: Request, result: Result) -> None:
        with self.lock:
            self.kept[request] = result
            while len(self.kept) > RECENT_RESULTS:
                self.kept.popitem(last=False)

    def get(self, request: Request) -> Result | None:
        with self.lock:
            return self.kept.get(request)


def marked(result: Result) -> list[tuple[str, str | None]]:
    """The translation as the page's marks show it: its unsure words labelled ``unsure``, the rest unlabelled."""
    spans = result.details().unsure_words
    if not spans:
        return []  # nothing to mark: the box stays empty
    segments: list[tuple[str, str | None]] = []
    at = 0
    for start, end in spans:
        segments += [(result.text[at:start], None), (result.text[start:end], "unsure")]
        at = end
    return [(text, label) for text, label in [*segments, (result.text[at:], None)] if text]


@dataclass(frozen=True)
class Handlers:
    """What the page's events run, over the served directions. Their parameter names are the API's."""

    service: TranslationService
    served: dict[str, Direction]
    downloads: Downloads  # the translated files
    limits: Limits = DEFAULT_LIMITS  # a request's sentences and time
    recent: RecentResults = field(default_factory=RecentResults)

    def translate(self, text: list[Any], direction: list[Any], beam_size: list[Any]) -> tuple[list[str], list[str]]:
        """Translate text with a Transformer of "Attention Is All You Need" trained on short image captions (Multi30k
        by default): it translates plain, everyday sentences well, and other text poorly. Line breaks are kept; each
        sentence is translated on its own. A text that cannot be translated gets an empty translation, and a status
        starting "not translated:" that says why.

        Args:
            text: the text to translate, at most 5000 characters.
            direction: the served direction as source-target language codes, e.g. "en-de" (English to German).
            beam_size: the beam search's width, 1 (greedy, fastest) to 8; 4 is a good default.

        Returns:
            the translation, and a status line (latency, the engine, and any warning, e.g. an unsure translation).
        """
        # Batched (each argument a list, one item a request): Gradio fails a whole batch on an exception, so whatever
        # one request raises, checked or translated, is its own refusal and the others are translated.
        requests: list[Request | str] = []  # a checked request, or the status of a refused one
        for inputs in zip(text, direction, beam_size, strict=True):
            try:
                requests.append(checked(self.served, *inputs, self.limits))
            except Exception as err:
                refused(err, Reason.BAD_FIELD)
                requests.append(refused_line(refusal_of(err)))
        wanted = [r for r in requests if isinstance(r, Request)]
        timeout_s = self.limits.request_timeout_s  # past it, a request's status says so and its searches stop
        results = iter(self.service.translate_each([(r.text, r.model, r.beam_size) for r in wanted], timeout_s))
        texts, statuses = [], []
        for request in requests:
            result = request if isinstance(request, str) else next(results)
            if isinstance(request, Request) and isinstance(result, Result):
                self.recent.put(request, result)
                value = next(d.value for d in self.served.values() if d.name == request.model)
                metrics.translated(value, result.lines)
            elif isinstance(result, Exception):
                refused(result, Reason.TIMEOUT if isinstance(result, TimedOut) else Reason.NOT_TRANSLATED)
            texts.append(result.text if isinstance(result, Result) else "")
            statuses.append(answer_line(result))
        return texts, statuses

    def show_marks(self, text: Any, direction: Any, beam_size: Any) -> list[tuple[str, str | None]]:
        """The translation's unsure words marked, asked for by the page after a translation (its result kept)."""
        try:
            request = checked(self.served, text, direction, beam_size, self.limits)
            result = self.recent.get(request) or self.service.translate(
                request.text, request.model, request.beam_size, self.limits.request_timeout_s
            )
        except (BadRequest, TimedOut):
            return []
        return marked(result)

    def show_attention(self, text: Any, direction: Any, beam_size: Any, head: str) -> tuple[Attention | None, str]:
        """The heatmap, asked for by the page after a translation (the API's callers never pay for it)."""
        try:
            request = checked(self.served, text, direction, beam_size, self.limits)
            timeout_s = self.limits.request_timeout_s
            attention = self.service.attention(request.text, request.model, request.beam_size, timeout_s)
        except (BadRequest, TimedOut):
            return None, heatmap_html(None, head)  # a refused request: no heatmap beside its message
        return attention, heatmap_html(attention, head)

    def translate_file(self, upload: Any, direction: Any, beam_size: Any) -> str | None:
        """Translate an uploaded UTF-8 .txt file line by line into a file to download."""
        path = upload.get("path") if isinstance(upload, dict) else None  # unprocessed: the client's word
        if path is None:
            return None  # the upload was cleared
        try:
            file = uploaded(path)
            chosen, beam = direction_of(self.served, direction), beam_of(beam_size)
            text = read_upload(file)
            check_length(text, MAX_FILE_CHARS, "the file")  # what was read, before what it would cost to search
            check_work([text], chosen, self.limits.max_file_sentences, "the file")
            translated = self.service.translate_file(text, chosen.name, beam, self.limits.request_timeout_s)
            return str(self.downloads.write(f"{file.stem}.{'-'.join(chosen.pair)}.txt", translated + "\n"))
        except Exception as err:  # a BadRequest, a file over MAX_FILE_CHARS, a sentence the model cannot take, ...
            raise user_error(refusal_of(err)) from None

    def swap(self, direction: str, source: str, target: str) -> tuple[str, str, str]:
        """The reverse direction, where it is served, with the texts swapped; else nothing changes."""
        pair = self.served[direction].pair
        back = next((d.value for d in self.served.values() if d.pair == pair[::-1]), None)
        return (back, target, source) if back is not None else (direction, source, target)

    def change_direction(self, direction: str) -> tuple[gr.Dataset, gr.Slider, gr.Radio, None]:
        """The direction's examples, beam size (its folder's) and heads; no heatmap of the other model left."""
        model = direction_of(self.served, direction).model
        samples, label = examples_for(model)
        beam = gr.Slider(value=model.search.beam_size)
        return gr.Dataset(samples=[[s] for s in samples], label=label), beam, gr.Radio(heads_of(model)), None


def refused(err: Exception, reason: Reason) -> None:
    """A page request's refusal counted: a bad input's (a ``ValueError``, ``requests.refusal_of``) or one past its
    time, not a failure of the server's."""
    if isinstance(err, ValueError | TimedOut):
        metrics.refused(reason)


def answer_line(result: Result | Exception | str) -> str:
    """The status a request is answered with: its translation's, or the refusal line of what it raised (or was
    refused with)."""
    if isinstance(result, Result):
        return status_line(result)
    return result if isinstance(result, str) else refused_line(refusal_of(result))


def upload_folder() -> Path:
    """Where Gradio keeps what visitors upload: ``GRADIO_TEMP_DIR``, else the temporary folder's ``gradio`` (its
    documented default)."""
    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio").resolve()


def uploaded(path: Any) -> Path:
    """The file an upload names, once it is seen to lie in Gradio's upload folder (links followed): the page's
    events take their inputs unprocessed, so the path is the client's word, and any other file is refused."""
    file = Path(str(path)).resolve()
    if not (file.is_relative_to(upload_folder()) and file.is_file()):
        raise BadRequest("the upload is not a file uploaded to this page; upload it again")
    return file


def cleared() -> tuple[str, str, list[Any], None, str]:
    """After a failed translation: no earlier translation, timing, marks or heatmap left beside its error."""
    return "", "", [], None, heatmap_html(None, "average")


@dataclass
class Components:
    direction: gr.Dropdown
    swap_button: gr.Button
    beam: gr.Slider
    source: gr.Textbox
    output: gr.Textbox
    status: gr.Markdown
    marks: gr.HighlightedText
    translate_button: gr.Button
    examples: gr.Dataset
    head: gr.Radio
    heatmap: gr.HTML
    upload: gr.File
    download: gr.File
    attention: gr.State


def lay_out(served: dict[str, Direction], variant: str) -> Components:
    """The page's components, in a ``gr.Blocks`` context, set for the first served direction; each model's
    ``variant`` of weights and what it knows (its folder's provenance) said at the top."""
    first = next(iter(served.values()))
    gr.Markdown(
        "# aiayn: the Transformer of *Attention Is All You Need*\n"
        f"ONNX Runtime and NumPy on **{first.model.provider}** (the {first.model.engine.name} engine), "
        f"{variant} weights. "
        f"Up to {MAX_CHARS} characters per request; sentences are translated one by one, line breaks kept. "
        f"When many translate at once, requests wait in line (at most {MAX_WAITING}): "
        "the place in line shows on the translation."
        + "".join(f"\n\n**{d.label}**: {d.model.folder.provenance()}." for d in served.values())
    )
    with gr.Row():
        choices = [(d.label, d.value) for d in served.values()]
        direction = gr.Dropdown(choices, value=first.value, label="Direction", elem_id="direction", scale=3)
        swap_button = gr.Button("⇄ Swap", elem_id="swap-button", scale=1)
        default_beam = first.model.search.beam_size
        beam = gr.Slider(
            1,
            MAX_BEAM,
            value=default_beam,
            step=1,
            precision=0,
            label="Beam size (1 = greedy)",
            elem_id="beam",
            scale=3,
        )
    with gr.Row():
        source = gr.Textbox(lines=6, label="Source text", elem_id="source-text")
        output = gr.Textbox(lines=6, label="Translation", elem_id="translation", buttons=["copy"])
    status = gr.Markdown(label="Status", elem_id="status")  # the label names the API's second output
    marks = gr.HighlightedText(label="Unsure words", elem_id="unsure-words", color_map={"unsure": "orange"})
    translate_button = gr.Button("Translate", variant="primary", elem_id="translate-button")
    samples, label = examples_for(first.model)
    examples = gr.Dataset(components=[source], samples=[[s] for s in samples], label=label, elem_id="examples")
    title = "Cross-attention of the last decoder layer (first sentence; of a long one, its first clause)"
    with gr.Accordion(title, open=True):
        head = gr.Radio(heads_of(first.model), value="average", label="Head")
        heatmap = gr.HTML(heatmap_html(None, "average"), elem_id="heatmap")
    with gr.Accordion(f"Translate a UTF-8 .txt file (up to {MAX_FILE_CHARS} characters)", open=False):
        upload = gr.File(file_types=[".txt"], label="Text file, one or more lines", elem_id="upload")
        download = gr.File(label="Translation", elem_id="download")
    attention = gr.State(None)
    return Components(
        direction,
        swap_button,
        beam,
        source,
        output,
        status,
        marks,
        translate_button,
        examples,
        head,
        heatmap,
        upload,
        download,
        attention,
    )


def wire(c: Components, handlers: Handlers) -> None:
    """The page's events. The API's two endpoints take their inputs unprocessed (preprocess=False) and check them
    themselves: Gradio's own checks answer a bad beam size with a generic error, and print a traceback in the log
    for every refusal."""
    private: dict[str, Any] = {"api_visibility": "private"}
    translated = c.translate_button.click(
        handlers.translate,
        [c.source, c.direction, c.beam],
        [c.output, c.status],
        api_name="translate",
        batch=True,
        max_batch_size=BATCH_SIZE,
        concurrency_limit=BATCHES_AT_ONCE,
        preprocess=False,
    )
    translated.success(
        handlers.show_attention, [c.source, c.direction, c.beam, c.head], [c.attention, c.heatmap], **private
    )
    translated.success(handlers.show_marks, [c.source, c.direction, c.beam], c.marks, **private)
    translated.failure(cleared, None, [c.output, c.status, c.marks, c.attention, c.heatmap], **private)
    c.head.change(heatmap_html, [c.attention, c.head], c.heatmap, **private)
    c.swap_button.click(handlers.swap, [c.direction, c.source, c.output], [c.direction, c.source, c.output], **private)
    c.direction.change(handlers.change_direction, c.direction, [c.examples, c.beam, c.head, c.attention], **private)
    c.examples.click(lambda sample: sample[0], c.examples, c.source, **private)
    c.upload.upload(
        handlers.translate_file,
        [c.upload, c.direction, c.beam],
        c.download,
        api_name="translate_file",
        concurrency_limit=1,
        preprocess=False,
    ).failure(lambda: None, None, c.download, **private)  # no earlier file beside the error


def build_app(
    service: TranslationService, model_names: list[str] | None = None, limits: Limits = DEFAULT_LIMITS
) -> gr.Blocks:
    """The page over ``model_names`` (default: the bundled models), loaded and checked before it starts; its
    translated files kept as ``limits`` say."""
    served = directions({name: service.model(name) for name in named_or_bundled(model_names)})
    handlers = Handlers(service, served, Downloads(limits), limits)
    # Served from their folder as they are, never copied into Gradio's cache: downloads.py's bounds are the only ones.
    gr.set_static_paths([handlers.downloads.root])
    with gr.Blocks(title="aiayn — Attention Is All You Need", delete_cache=(3600, 3600)) as app:
        wire(lay_out(served, service.options.variant), handlers)
    # A request beyond MAX_WAITING is refused by Gradio with HTTP 503 and its own message ("Queue is full").
    app.queue(max_size=MAX_WAITING, default_concurrency_limit=BATCHES_AT_ONCE)
    return app
