"""The translation page (Gradio Blocks) and its named API endpoint ``translate``."""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

import gradio as gr
import numpy as np

from aiayn.model.folder import bundled_models
from aiayn.serve.service import MAX_BEAM, Attention, TranslationService
from aiayn.serve.text import MAX_CHARS, InputTooLong, split_sentences

CONCURRENCY_LIMIT = 4
FALLBACK_EXAMPLES = {  # when the Multi30k validation split is not at hand (a Space has no corpus)
    "en": ["A little girl climbs into a wooden playhouse.", "Two men are fishing from a small boat on a lake."],
    "de": ["Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "Zwei Männer angeln auf einem See."],
}


def examples_for(source_lang: str, count: int = 5) -> list[str]:
    """A few sentences of the validation split in ``source_lang``, or built-in ones without the corpus."""
    from aiayn.model.data import load_parallel

    target = "de" if source_lang != "de" else "en"
    try:
        return load_parallel("val", source_lang, target, download=False).src[:count]
    except (FileNotFoundError, ValueError):
        return FALLBACK_EXAMPLES.get(source_lang, FALLBACK_EXAMPLES["en"])


def heatmap_html(attention: Attention, head: str) -> str:
    """Source tokens × output tokens as a coloured table: darker is more attention."""
    weights = attention.weights.mean(axis=0) if head == "average" else attention.weights[int(head)]
    header = "".join(f"<th>{html.escape(t)}</th>" for t in attention.source_tokens)
    rows = []
    for out_token, row in zip(attention.output_tokens, weights, strict=True):
        cells = "".join(
            f'<td style="background: rgba(37, 99, 235, {w:.3f}); color: {"#fff" if w > 0.5 else "#111"}">{w:.2f}</td>'
            for w in np.asarray(row, dtype=float)
        )
        rows.append(f"<tr><th>{html.escape(out_token)}</th>{cells}</tr>")
    return (
        '<div id="attention-heatmap" style="overflow-x: auto">'
        '<table style="border-collapse: collapse; font-size: 12px">'
        f"<tr><th>output \\ source</th>{header}</tr>{''.join(rows)}</table></div>"
    )


def build_app(service: TranslationService, model_names: list[str] | None = None) -> gr.Blocks:
    names = model_names or list(bundled_models())
    if not names:
        raise FileNotFoundError("no bundled models found; pass --model DIR or add folders under pretrained/")
    heads = ["average"] + [str(h) for h in range(service.model(names[0]).config.n_heads)]

    def translate(text: str, direction: str, beam_size: float) -> tuple[str, str]:
        """The API: translation and a status line with latency and execution provider."""
        if direction not in names:
            raise gr.Error(f"unknown direction {direction!r}; choose one of {', '.join(names)}")
        try:
            result = service.translate(text or "", direction, int(beam_size))
        except (InputTooLong, ValueError) as err:
            raise gr.Error(str(err)) from None
        status = f"{result.sentences} sentence(s) in {result.latency_ms:.0f} ms on {result.provider}"
        return result.text, status

    def show_attention(text: str, direction: str, beam_size: float, head: str) -> str:
        sentences = split_sentences((text or "").splitlines()[0] if (text or "").strip() else "")
        if not sentences:
            return "<p>Translate a sentence to see where the model looked.</p>"
        try:
            attention = service.model(direction).attention(sentences[0], int(beam_size))
        except ValueError as err:
            return f"<p>{html.escape(str(err))}</p>"
        return heatmap_html(attention, head)

    def translate_file(path: str | None, direction: str, beam_size: float) -> str | None:
        if path is None:
            return None
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise gr.Error("the file is not UTF-8 text; save it as UTF-8 and upload it again") from None
        model = service.model(direction)
        lines = [model.translate(line, int(beam_size))[0] if line.strip() else "" for line in text.splitlines()]
        out = Path(tempfile.mkdtemp()) / (Path(path).stem + f".{direction}.txt")
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return str(out)

    def swap(direction: str, source: str, target: str) -> tuple[str, str, str]:
        src, _, tgt = direction.partition("-")
        reverse = f"{tgt}-{src}"
        return (reverse if reverse in names else direction), target, source

    with gr.Blocks(title="aiayn — Attention Is All You Need") as app:
        gr.Markdown(
            "# aiayn: the Transformer of *Attention Is All You Need*\n"
            f"Trained on Multi30k, running with ONNX Runtime and NumPy. Up to {MAX_CHARS} characters per request."
        )
        with gr.Row():
            direction = gr.Dropdown(names, value=names[0], label="Direction", scale=3)
            swap_button = gr.Button("⇄ Swap", scale=1)
            beam = gr.Slider(1, MAX_BEAM, value=4, step=1, label="Beam size (1 = greedy)", scale=3)
        with gr.Row():
            source = gr.Textbox(lines=6, label="Source text", elem_id="source-text", max_length=MAX_CHARS)
            output = gr.Textbox(lines=6, label="Translation", elem_id="translation", buttons=["copy"])
        status = gr.Markdown(elem_id="status")
        translate_button = gr.Button("Translate", variant="primary", elem_id="translate-button")
        gr.Examples(examples_for(names[0].split("-")[0]), inputs=source, label="Examples (Multi30k validation)")
        with gr.Accordion("Cross-attention (last decoder layer)", open=True):
            head = gr.Radio(heads, value="average", label="Head")
            heatmap = gr.HTML(elem_id="heatmap")
        with gr.Accordion("Translate a .txt file", open=False):
            upload = gr.File(file_types=[".txt"], label="UTF-8 text file, one or more lines")
            download = gr.File(label="Translation")

        translate_button.click(
            translate,
            [source, direction, beam],
            [output, status],
            api_name="translate",
            concurrency_limit=CONCURRENCY_LIMIT,
        ).then(show_attention, [source, direction, beam, head], heatmap, api_name=False)
        head.change(show_attention, [source, direction, beam, head], heatmap, api_name=False)
        swap_button.click(swap, [direction, source, output], [direction, source, output], api_name=False)
        upload.upload(translate_file, [upload, direction, beam], download, api_name="translate_file")
    app.queue(default_concurrency_limit=CONCURRENCY_LIMIT, max_size=64)
    return app
