"""`aiayn export MODEL --to web`: a static folder that translates in the visitor's browser with onnxruntime-web.

The folder holds the page and its ES modules (``page/``), the contract's graphs in the variant asked for with their
one weights file (``web_graphs.py``), the model folder's ``tokenizer.json`` and ``config.json`` and the pinned npm
files (``npm.py``), and ``preview.py``, a local server that sends the headers a static Space sends
(``ISOLATION_HEADERS``); any static file server serves it, a Hugging Face static Space included, and where it sends
those headers the page runs ONNX Runtime's WASM on several threads (``page/engine.js``). The modules port the CLI's
text pipeline and search line by line; every rule they need that Python knows (the white space ``str.split`` splits
on, which characters start a sentence, the clause table, the batching limits) is written here into ``config.json``'s
``web`` section, never repeated in the JavaScript. Torch-free: the graphs are already exported.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from aiayn.core.contract import (
    DECODER_FILE,
    ENCODER_FILE,
    LOG_PROBS,
    POSITION_OFFSET,
    SRC_IDS,
    SRC_MASK,
    TGT_IDS,
    kv_names,
)
from aiayn.core.folder import CONFIG_FILE, IMPORTED_SECTION, ModelFolder
from aiayn.core.normalizer import char_class, code_points, is_tidy, tidied, whitespace_run
from aiayn.core.public import public_sections, yaml_quoted
from aiayn.core.tokenizer import SPECIAL_TOKEN_TEXT, TOKENIZER_FILE, SubwordTokenizer
from aiayn.engines import ONNX_PORTABLE
from aiayn.engines.load import load_engine
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE
from aiayn.engines.options import EngineOptions
from aiayn.export.npm import CACHE_DIR, PACKAGES, copy_files
from aiayn.export.web_graphs import check_variant, write_browser_graphs
from aiayn.search.translator import LENGTH_BATCH_SENTENCES, LENGTH_BATCH_TOKENS, SearchSettings
from aiayn.text.clauses import MAX_DEPTH, MIN_PIECE_TOKENS, SENTENCE_END, ClauseSplitter
from aiayn.text.sentences import LINE_BREAK, MAX_SENTENCE_TOKENS, OPENING, OTHER_BREAKS, opens_sentence

PAGE_DIR = Path(__file__).with_name("page")
WEB_SECTION = "web"
# WASM threads share memory (SharedArrayBuffer), which a browser gives only a cross-origin isolated page: one served
# with these headers. A static Space sends them where its front matter's ``custom_headers`` asks; so does the preview.
ISOLATION_HEADERS = {
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "cross-origin",
}
PREVIEW_FILE = "preview.py"
PREVIEW_PORT = 8000
PREVIEW = '''"""This folder on http://127.0.0.1:PORT/ with the headers its Space sends, so that the page is cross-origin
isolated and runs on all its threads (`python -m http.server` sends none of them): python preview.py [PORT]

Written by aiayn's `aiayn export MODEL --to web`; the standard library only.
"""

import functools
import http.server
import sys
from pathlib import Path

HEADERS = {headers!r}


class IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        for name, value in HEADERS.items():
            self.send_header(name, value)
        super().end_headers()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else {port}
    handler = functools.partial(IsolatedHandler, directory=str(Path(__file__).resolve().parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving on http://127.0.0.1:{{port}}/ (cross-origin isolated), Ctrl-C to stop", flush=True)
        server.serve_forever()
'''


def web_section(folder: ModelFolder, variant: str) -> dict[str, Any]:
    """What the page's modules need beyond the model's config: graph and tensor names, and the CLI's text rules."""
    config, splitter, settings = folder.config, ClauseSplitter.of(folder), SearchSettings.of(folder)
    points = code_points()
    return {
        "variant": variant,
        "encoder": ENCODER_FILE,
        "decoder": DECODER_FILE,
        "weights": EXTERNAL_DATA_FILE,
        "names": {
            "src_ids": SRC_IDS,
            "tgt_ids": TGT_IDS,
            "position_offset": POSITION_OFFSET,
            "src_mask": SRC_MASK,
            "log_probs": LOG_PROBS,
        },
        "cross": kv_names(config, "cross"),
        "past": kv_names(config, "past"),
        "present": kv_names(config, "present"),
        "kv_shape": [config.n_heads, config.d_head],
        # Ids (core/config.py): the decoder starts from bos, which may be pad itself (Marian's <pad>).
        "special_tokens": dataclasses.asdict(config.special_tokens),
        # Text (text/sentences.py): regexes as character classes of the characters themselves (normalizer.py).
        "line_break": LINE_BREAK.pattern,
        "other_breaks": OTHER_BREAKS.pattern,
        "whitespace": whitespace_run().removesuffix("+"),
        "alnum": char_class(c for c in points if c.isalnum()),
        "opens_sentence": char_class(c for c in points if opens_sentence(c)),
        "opening": OPENING,
        "max_sentence_tokens": min(MAX_SENTENCE_TOKENS, config.max_len),
        "max_src_len": config.max_len,
        # Clauses (text/clauses.py): the source words, longest first, and what each becomes.
        "split_over_tokens": splitter.max_tokens,
        "conjunctions": [[word, splitter.table[word]] for word in splitter.words],
        "min_piece_tokens": MIN_PIECE_TOKENS,
        "max_depth": MAX_DEPTH,
        "sentence_end": list(SENTENCE_END),
        # Search (search/translator.py): the folder's defaults, an imported checkpoint's beam and |Y|^α included.
        "never_generate": list(config.never_generate),
        "beam_size": settings.beam_size,
        "length_penalty": settings.length_penalty,
        "length_normalization": settings.length_normalization,
        "max_extra_len": settings.max_extra_len,
        "max_sentences": LENGTH_BATCH_SENTENCES,
        "max_tokens": LENGTH_BATCH_TOKENS,
    }


def space_readme(folder: ModelFolder) -> str:
    """README.md of the folder: the front matter that makes it a Hugging Face static Space."""
    config = folder.config
    headers = "".join(f"  {name}: {value}\n" for name, value in ISOLATION_HEADERS.items())
    return (
        f"---\ntitle: {yaml_quoted(f'aiayn {config.src_lang}-{config.tgt_lang} in the browser')}\nemoji: 🌐\n"
        "colorFrom: blue\n"
        "colorTo: green\nsdk: static\napp_file: index.html\npinned: false\n"
        f"custom_headers:\n{headers}---\n\n"
        f"Translates {config.src_lang} → {config.tgt_lang} on the visitor's own device with onnxruntime-web (WASM): "
        "the page, its modules, the ONNX graphs and the tokenizer are static files; no server code runs. The front "
        "matter's `custom_headers` make the page cross-origin isolated, so that WASM runs on as many threads as the "
        "visitor's cores (up to 4); a server without them gets one thread, and the page says which.\n\n"
        f"Try it here: `python {PREVIEW_FILE}`, then open http://127.0.0.1:{PREVIEW_PORT}/ (it sends the same "
        "headers; `python -m http.server` does not).\n\n"
        "Written by aiayn's `aiayn export MODEL --to web --out DIR`.\n\nThird-party files, from npm: "
        + "; ".join(f"{p.name} {p.version} ({p.license})" for p in PACKAGES)
        + ".\n"
    )


def export_web(folder: ModelFolder, out_dir: Path, variant: str = "fp32", cache_dir: Path = CACHE_DIR) -> list[str]:
    """Write the static folder with the graphs of ``variant`` (``aiayn.engines.WEB_VARIANTS``); the report lines name
    its size. The fp32 graphs they are made from are checked against the folder first (its weights and config, the
    contract), as every engine checks them."""
    check_variant(variant)
    load_engine(folder, EngineOptions(ONNX_PORTABLE, "cpu", lanes=1))
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file; give a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    graphs = write_browser_graphs(folder, variant, out_dir)
    tokenizer = folder.tokenizer.tokenizer
    if not is_tidy(tokenizer):  # a folder written before the text contract moved into the file
        tokenizer = tidied(tokenizer, SPECIAL_TOKEN_TEXT.values())
    # An imported SentencePiece tokenizer.json goes as it is: tokenizers.js reads its Unigram model, Metaspace,
    # Replace and Strip, and in place of the Precompiled charsmap applies NFKC and fixed tables, which differ from
    # spm's nmt_nfkc only on characters the text pipeline never passes on (tests/export/test_web.py).
    SubwordTokenizer(tokenizer).save(out_dir / TOKENIZER_FILE)
    # As an export publishes them (core/public.py): an imported checkpoint's local folder by its name alone.
    sections = {**public_sections(folder.sections, IMPORTED_SECTION), WEB_SECTION: web_section(folder, variant)}
    (out_dir / CONFIG_FILE).write_text(json.dumps(sections, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for page_file in sorted(PAGE_DIR.iterdir()):
        if page_file.is_file():
            shutil.copyfile(page_file, out_dir / page_file.name)
    (out_dir / "README.md").write_text(space_readme(folder), encoding="utf-8")
    preview = PREVIEW.format(headers=ISOLATION_HEADERS, port=PREVIEW_PORT)
    (out_dir / PREVIEW_FILE).write_text(preview, encoding="utf-8")
    for package in PACKAGES:
        copy_files(package, out_dir, cache_dir)
    size = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    graphs_size = sum(f.stat().st_size for f in graphs)
    versions = ", ".join(f"{p.name} {p.version}" for p in PACKAGES)
    return [
        f"wrote {out_dir}: {size / 1e6:.1f} MB, of which {graphs_size / 1e6:.1f} MB {variant} graphs ({versions})",
        f"try it: python {out_dir / PREVIEW_FILE}, then open http://127.0.0.1:{PREVIEW_PORT}/ (cross-origin "
        "isolated, as its Space: WASM on all cores)",
    ]
