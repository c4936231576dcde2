"""`aiayn export --to web`: the static folder, served by its preview.py, translates in Debian's Chromium
exactly as `aiayn translate` does, untidy lines included, greedy and beam 4, in both directions; and so does a
Marian-like folder with a SentencePiece tokenizer, at greedy and at its own beam."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.bench.web import (
    CHROMIUM,
    batch_mates,
    chromium,
    cli_translations,
    downloaded_files,
    first_parts,
    open_page,
    served_folder,
    translate_in_page,
    untidy,
)
from aiayn.cli import main
from aiayn.core.folder import ModelFolder
from aiayn.engines import BLOCK_VARIANTS
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE
from aiayn.engines.options import EngineOptions
from aiayn.export.npm import PACKAGES, matches
from aiayn.export.web import ISOLATION_HEADERS, PREVIEW_FILE, export_web
from aiayn.search import beam_search
from aiayn.search.step import FullDistributionStep
from aiayn.serve.service import LoadedModel, TranslationService

# The parts of a page's loading that page/aiayn.js times.
STARTUP_PARTS = (
    "config",
    "device",
    "tokenizer",
    "sentencex",
    "engine",
    "runtime",
    "weights",
    "encoder session",
    "decoder session",
)
CAPTIONS = 30  # test captions per direction (`aiayn bench --web` runs 200)
# Lines the captions do not have: white space of every kind, an emoji and another script (left out or kept),
# two sentences, a long sentence cut into clauses, a character whose NFKC leaves the vocabulary (¼), an empty line.
EXTRA = {
    "en": [
        "",
        "\u00a0A dog\u2003runs\u3000on the  beach 🐕. Привет!",
        "Two men talk. A woman watches them from the door.",
        "A man in a red shirt is riding a bike down the street, and a woman in a blue dress is walking her dog "
        "in the park, while two children play.",
        "A ¼ pound burger on a plate.",
    ],
    "de": [
        "",
        "\u00a0Ein Hund\u2003rennt\u3000am  Strand 🐕. Привет!",
        "Zwei Männer reden. Eine Frau sieht ihnen von der Tür aus zu.",
        "Ein Mann in einem roten Hemd fährt mit dem Fahrrad die Straße entlang, und eine Frau in einem blauen Kleid "
        "geht mit ihrem Hund im Park spazieren, während zwei Kinder spielen.",
    ],
}

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium (Debian's package)"
)


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    return TranslationService(EngineOptions(device="cpu"))  # as `aiayn translate` runs on a CPU


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as opened:
        yield opened


@pytest.fixture(scope="module")
def pages(bundled: dict[str, Path], browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Each bundled pair's folder, written and served, open in Chromium."""
    opened, sites = {}, {}
    for pair in ("en-de", "de-en"):
        out = tmp_path_factory.mktemp(pair)
        try:
            export_web(ModelFolder.open(pair), out)
        except FileNotFoundError as err:  # the npm registry unreachable, and nothing cached
            pytest.skip(f"the npm files for the browser folder are unavailable: {err}")
        sites[pair] = out
    with served_folder(sites["en-de"]) as en_de, served_folder(sites["de-en"]) as de_en:
        for pair, url in (("en-de", en_de), ("de-en", de_en)):
            page, _ = open_page(browser, url)
            opened[pair] = page
        yield opened
        for page in opened.values():
            page.close()


def lines_for(multi30k_dir: Path, language: str) -> list[str]:
    with gzip.open(multi30k_dir / f"test_2016_flickr.{language}.gz", "rt", encoding="utf-8") as f:
        captions = f.read().split("\n")[:CAPTIONS]
    return untidy(captions) + EXTRA[language]


@pytest.mark.parametrize("pair", ["en-de", "de-en"])
@pytest.mark.parametrize("beam", [1, 4])
def test_the_browser_translates_as_the_cli(
    pages: dict[str, Any], service: TranslationService, multi30k_dir: Path, pair: str, beam: int
) -> None:
    model: LoadedModel = service.model(pair)
    lines = lines_for(multi30k_dir, model.config.src_lang)
    got, _ = translate_in_page(pages[pair], lines, beam)
    assert got == cli_translations(model, lines, beam)


def test_the_browser_marks_the_words_the_cli_marks(
    pages: dict[str, Any], service: TranslationService, multi30k_dir: Path
) -> None:
    """``translateMarked``: each line's translation and the spans of its unsure words, as `--report` gives them."""
    model: LoadedModel = service.model("en-de")
    out_of_domain = (Path(__file__).parents[1] / "serve" / "out_of_domain.tsv").read_text(encoding="utf-8")
    lines = lines_for(multi30k_dir, "en") + [line.split("\t")[0] for line in out_of_domain.splitlines()[:10]]
    marked = pages["en-de"].evaluate("lines => window.aiayn.translateMarked(lines, {beam: 4})", lines)
    done = model.run(model.prepare(lines), 4)
    assert [m["translation"] for m in marked] == done.line_texts()
    expected = [[list(span) for span in line.unsure_words] for line in done.lines]
    assert [m["unsure_words"] for m in marked] == expected and sum(map(bool, expected)) >= 5


# A scripted decoder for beam 2, as log-probabilities after each prefix (ids: <pad> 0, <s> 1, </s> 2, then a, b, c);
# any other prefix ends. Its second step ranks <s> a </s>, the live <s> a c, then <s> b </s> (one live candidate
# above it, but not among the best 2): fairseq's rule drops that </s>, and <s> a c </s> wins at α 1.
SCRIPTED = {
    (1,): [-np.inf, -np.inf, np.log(0.1), np.log(0.6), np.log(0.2), np.log(0.1)],
    (1, 3): [-np.inf, -np.inf, np.log(0.45), np.log(0.075), np.log(0.075), np.log(0.4)],
    (1, 4): [-np.inf, -np.inf, np.log(0.4), np.log(0.2), np.log(0.2), np.log(0.2)],
}
SCRIPTED_END = [-np.inf, -np.inf, 0.0, -9.0, -9.0, -9.0]


@dataclass(frozen=True)
class Scripted(FullDistributionStep[list[tuple[int, ...]]]):
    bos_id, eos_id, pad_id = 1, 2, 0
    never_generate: tuple[int, ...] = ()

    def start(self, src_ids: np.ndarray) -> list[tuple[int, ...]]:
        return [() for _ in src_ids]

    def step(self, state: list[tuple[int, ...]], tgt_ids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        state = [(*prefix, int(t)) for prefix, t in zip(state, tgt_ids[:, 0], strict=True)]
        return np.array([SCRIPTED.get(prefix, SCRIPTED_END) for prefix in state], np.float32), state

    def select(self, state: list[tuple[int, ...]], rows: np.ndarray) -> list[tuple[int, ...]]:
        return [state[i] for i in rows]


def test_the_browser_search_ends_a_hypothesis_by_fairseqs_rule(pages: dict[str, Any]) -> None:
    """search.js's beam over the scripted decoder: only a </s> among the best k ends a hypothesis, as beam.py."""
    script = """async ([rows, end]) => {
        const { searchAll } = await import(new URL("search.js", location.href));
        const table = new Map(rows);
        const engine = {
            bos: 1, eos: 2, vocab: end.length, neverGenerate: new Set(),
            async start(srcIds) { return srcIds.map(() => []); },
            async step(state, last) {
                const prefixes = state.map((prefix, r) => [...prefix, last[r]]);
                const values = prefixes.flatMap((prefix) => table.get(prefix.join(",")) ?? end);
                return [Float32Array.from(values, (v) => (v === null ? -Infinity : v)), prefixes];
            },
            select(state, rows) { return rows.map((r) => state[r]); },
        };
        const settings = { max_sentences: 8, max_tokens: 1000, max_extra_len: 5, length_penalty: 1.0,
                           length_normalization: "gnmt" };
        return (await searchAll(engine, [[3, 2]], settings, 2))[0].tokens;
    }"""
    finite = {",".join(map(str, key)): [None if v == -np.inf else v for v in row] for key, row in SCRIPTED.items()}
    end = [None if v == -np.inf else v for v in SCRIPTED_END]
    got = pages["en-de"].evaluate(script, [list(finite.items()), end])
    (ours,) = beam_search(Scripted(), np.array([[3, 2]]), 2, 1.0, max_len=7)
    assert got == ours.tokens == [3, 5]


@pytest.fixture(scope="module")
def variant_pages(
    bundled: dict[str, Path], browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Any, Path]]]:
    """en-de's folder in each weight-only variant, written and served, open in Chromium, with its folder."""
    sites = {}
    for variant in BLOCK_VARIANTS:
        sites[variant] = tmp_path_factory.mktemp(variant)
        try:
            export_web(ModelFolder.open("en-de"), sites[variant], variant)
        except FileNotFoundError as err:
            pytest.skip(f"the npm files for the browser folder are unavailable: {err}")
    with served_folder(sites["w8"]) as w8, served_folder(sites["w4"]) as w4:
        opened = {variant: (open_page(browser, url)[0], sites[variant]) for variant, url in (("w8", w8), ("w4", w4))}
        yield opened
        for page, _ in opened.values():
            page.close()


@pytest.mark.parametrize("variant", list(BLOCK_VARIANTS))
@pytest.mark.parametrize("beam", [1, 4])
def test_a_quantized_folder_translates_as_the_cli_variant(
    variant_pages: dict[str, tuple[Any, Path]], multi30k_dir: Path, variant: str, beam: int
) -> None:
    """Nearly always identical: the CLI's int8 products are MLAS's integer kernels, the browser's the same int8
    values multiplied in fp32 (web_graphs.py); the two round differently in the last bit, and a value on a rounding
    edge then becomes another int8 code (`aiayn bench --web`: 193-197 of 200 captions identical)."""
    model = TranslationService(EngineOptions(device="cpu", variant=variant)).model("en-de")
    lines = lines_for(multi30k_dir, "en")
    got, _ = translate_in_page(variant_pages[variant][0], lines, beam)
    same = sum(a == b for a, b in zip(got, cli_translations(model, lines, beam), strict=True))
    assert same >= 0.9 * len(lines)


@pytest.mark.parametrize("variant", list(BLOCK_VARIANTS))
def test_batch_mates_change_nothing_in_a_quantized_folder(
    variant_pages: dict[str, tuple[Any, Path]], multi30k_dir: Path, variant: str
) -> None:
    """Each line translated alone as in a batch: at greedy, every one; at beam 4 nearly every one. The int8
    activations are quantized per row, but the fp32 operators before them (softmax over a padded source, products
    over more rows) round differently in the last bit with other shapes, and a value on a rounding edge then becomes
    another int8 code (`aiayn bench --web` has the figures; fp32 and fp32 activations keep every line)."""
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")[CAPTIONS : CAPTIONS + 64]
    page = variant_pages[variant][0]
    assert batch_mates(page, lines, 1) == len(lines)
    assert batch_mates(page, lines, 4) >= 0.9 * len(lines)


def test_the_weights_are_fetched_once_for_both_graphs(variant_pages: dict[str, tuple[Any, Path]]) -> None:
    page, folder = variant_pages["w8"]
    names = page.evaluate("performance.getEntriesByType('resource').map((entry) => entry.name)")
    assert sum(name.endswith("/" + EXTERNAL_DATA_FILE) for name in names) == 1
    fetched = {f.name for f in downloaded_files(page, folder)}
    assert {"encoder.onnx", "decoder.onnx", EXTERNAL_DATA_FILE, "ort-wasm-simd-threaded.wasm"} <= fetched
    assert "ort-wasm-simd-threaded.asyncify.wasm" not in fetched  # WebGPU's build: only where a page uses it


def test_the_page_box_and_bad_calls(pages: dict[str, Any], service: TranslationService) -> None:
    page = pages["en-de"]
    text = "Two dogs play in the snow.\n\n  A man\trides a bike. "
    page.locator("#source").fill(text)
    page.locator("#beam").fill("1")
    page.locator("#translate").click()
    expected = "\n".join(cli_translations(service.model("en-de"), text.split("\n"), 1))
    page.wait_for_function("expected => document.getElementById('translation').value === expected", arg=expected)
    assert "Translated in" in page.locator("#status").inner_text()
    for call, message in (
        ("window.aiayn.translate(['a\\nb'])", "line 1 holds a line break"),
        ("window.aiayn.translate('a dog')", "lines must be an array of strings"),
        ("window.aiayn.translate(['a dog'], {beam: 0})", "beam must be a positive integer"),
    ):
        with pytest.raises(Exception, match=message):
            page.evaluate(call)


def test_the_folder_is_static_and_names_what_it_holds(pages: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    """Its README asks the Space for the headers that isolate the page and names the preview that sends them; a
    plain static server sends none, and the page runs one thread and says why."""
    out = tmp_path / "site"
    lines = export_web(ModelFolder.open("en-de"), out)
    names = {p.name for p in out.iterdir()}
    assert {"index.html", "aiayn.js", "encoder.onnx", "decoder.onnx", EXTERNAL_DATA_FILE, "tokenizer.json"} <= names
    assert {Path(f).name for package in PACKAGES for f in package.files} <= names
    readme = (out / "README.md").read_text()
    assert "sdk: static" in readme and f"`python {PREVIEW_FILE}`" in readme
    front = readme.split("---\n")[1]
    assert "custom_headers:\n" + "".join(f"  {name}: {value}\n" for name, value in ISOLATION_HEADERS.items()) in front
    web = json.loads((out / "config.json").read_text())["web"]
    assert (web["variant"], web["weights"]) == ("fp32", EXTERNAL_DATA_FILE)
    assert lines[0].startswith(f"wrote {out}: ") and " MB " in lines[0]
    assert f"python {out / PREVIEW_FILE}" in lines[1]
    with served_folder(out, isolated=False) as url:
        page, _ = open_page(browser, url)
        assert page.evaluate("window.aiayn.ready")["threads"] == 1
        expect_status = "WASM on 1 thread: the server does not make this page cross-origin isolated"
        page.wait_for_function(
            "text => document.getElementById('status').textContent.includes(text)", arg=expect_status
        )
        page.close()


def test_an_isolated_page_runs_a_thread_per_core_and_its_lines_are_one_threads(
    pages: dict[str, Any], browser: Any, multi30k_dir: Path
) -> None:
    """preview.py sends the headers the Space sends: the page runs one WASM thread per core (at most 4) and says so,
    and its translations are one thread's, greedy and beam 4."""
    page = pages["en-de"]
    cores = page.evaluate("navigator.hardwareConcurrency")
    ready = page.evaluate("window.aiayn.ready")
    assert ready["isolated"] and ready["threads"] == min(cores, 4)
    parts = first_parts(page)  # where the first translation's time went, as `aiayn bench --web` reports it
    assert set(parts) == {*STARTUP_PARTS, "first translation"}
    assert parts["weights"][0] < parts["runtime"][1]  # the weights download while the runtime's module loads
    assert max(end for _, end in parts.values()) == parts["first translation"][1]
    one, _ = open_page(browser, page.url.split("?")[0], threads=1)
    assert one.evaluate("window.aiayn.ready")["threads"] == 1
    one.wait_for_function("document.getElementById('status').textContent.includes('WASM on 1 thread).')")
    lines = lines_for(multi30k_dir, "en")
    for beam in (1, 4):
        assert translate_in_page(page, lines, beam)[0] == translate_in_page(one, lines, beam)[0]
    one.close()


def test_export_to_web_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "en-de", "--to", "web"]) == 2
    assert "--out DIR goes with --to web" in capsys.readouterr().err
    assert main(["export", "en-de", "--out", "somewhere"]) == 2
    assert main(["export", "en-de", "--variant", "w8"]) == 2
    assert "--variant w8 is no ONNX graph variant; --to onnx writes fp32, int8, fp16" in capsys.readouterr().err
    assert main(["export", "en-de", "--to", "web", "--out", "somewhere", "--variant", "w9"]) == 2
    assert "unknown browser variant 'w9'; choose one of fp32, w8, w4" in capsys.readouterr().err


def test_a_tarball_is_refused_unless_its_sha512_is_the_pinned_one() -> None:
    abc = "sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPpUyknw=="
    assert matches(b"abc", abc) and not matches(b"abd", abc)


def test_the_page_picks_webgpu_only_where_the_browser_offers_an_adapter(pages: dict[str, Any], browser: Any) -> None:
    url = pages["en-de"].url.split("?")[0]
    page = browser.new_page()
    page.goto(url)  # ?device=auto, the default
    has_adapter = page.evaluate("async () => 'gpu' in navigator && (await navigator.gpu.requestAdapter()) !== null")
    ready = page.evaluate("window.aiayn.ready")
    assert ready["device"] == ("webgpu" if has_adapter else "wasm")
    assert page.evaluate("window.aiayn.translate(['Two dogs play in the snow.'], {beam: 1})")[0]
    asked = browser.new_page()
    asked.goto(f"{url}?device=webgpu")
    if has_adapter:
        assert asked.evaluate("window.aiayn.ready")["device"] == "webgpu"
    else:  # the page says why it cannot, and how to open it instead
        asked.wait_for_function("document.getElementById('status').textContent.includes('no WebGPU adapter')")
        assert "?device=wasm" in asked.locator("#status").inner_text()
    page.close()
    asked.close()


# A Marian (OPUS-MT) folder as `aiayn import` writes it: a SentencePiece Unigram tokenizer.json (spm's nmt_nfkc
# charsmap as a Precompiled normalizer, Metaspace), </s> 0, <unk> 1, <pad> last as the start token and never
# generated, and its own beam with |Y|^α. The lines add what SentencePiece's normalizer rewrites.
MARIAN_SEARCH = {"beam_size": 5, "length_penalty": 1.0, "length_normalization": "power"}
MARIAN_EXTRA = [
    "A café with a naïve façade, à la carte, Ångström, Zoë and Ñandú.",
    "Decomposed: cafe\u0301, nai\u0308ve, A\u030angstro\u0308m.",
    "Two   men    and a\t\tdog  run  .",
    "Ｆｕｌｌ－ｗｉｄｔｈ ｌｅｔｔｅｒｓ ａｎｄ ｄｉｇｉｔｓ １２３，ｏｋ？",
    "The ﬁrst ﬂoor has ½ of the room, 2² m, ① and ™ signs.",
    "A man\u00a0in\u2009a\u3000hat\u200bwith\u200da cane\u061c～ waves.",
    "“Quotes” — dashes – and … ellipses ‘here’.",
    "A family 👨\u200d👩\u200d👧 walks; Привет, 東京!",
    "ＡＢＣ   ｄｅｆ",
    "",
]


@pytest.fixture(scope="module")
def marian_spm_folder(marian_like_folder: Path, multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``marian_like_folder``'s config around a real SentencePiece Unigram model of 600 Multi30k captions
    (transformers' SpmConverter, as for OPUS-MT), with new random weights, its graphs and a Marian search section."""
    import sentencepiece as spm
    import torch
    from transformers.convert_slow_tokenizer import SpmConverter

    from aiayn.core.config import SpecialTokens
    from aiayn.core.folder import SEARCH_SECTION
    from aiayn.core.tokenizer import SubwordTokenizer
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.transformer import Transformer
    from aiayn.model.weights import load_model, save_weights

    work = tmp_path_factory.mktemp("marian-spm")
    with gzip.open(multi30k_dir / "train.en.gz", "rt", encoding="utf-8") as f:
        captions = f.read().split("\n")[:600]
    vocab_size = 200
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(captions),
        model_prefix=str(work / "source"),
        model_type="unigram",
        vocab_size=vocab_size,
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=vocab_size - 1,
        character_coverage=1.0,
        minloglevel=2,
    )

    class SlowTokenizer:  # what SpmConverter reads of a slow tokenizer
        vocab_file = str(work / "source.model")

    raw = SpmConverter(SlowTokenizer()).converted()
    raw.add_special_tokens(["<unk>"])  # SentencePiece's unknown piece, special as in an OPUS-MT tokenizer.json
    pad = vocab_size - 1
    config = ModelFolder.open(marian_like_folder).config.replace(
        vocab_size=vocab_size,
        special_tokens=SpecialTokens(pad=pad, unk=1, bos=pad, eos=0),
        never_generate=(pad,),
    )
    folder_path = work / "model"
    torch.manual_seed(0)
    model = Transformer(config)
    with torch.no_grad():
        # <pad> the favourite wherever the search let it be, </s> likely enough that hypotheses of many lengths
        # finish: without never_generate most lines change, with GNMT's normalisation some do.
        model.embedding.bias.normal_(0.0, 0.2)
        model.embedding.bias[pad] += 3.0
        model.embedding.bias[0] += 1.5
    folder = ModelFolder.create(folder_path, config, SubwordTokenizer(raw))
    assert folder.tokenizer.tidies_itself
    save_weights(model, folder)
    folder.write_section(SEARCH_SECTION, MARIAN_SEARCH)
    export_onnx(load_model(folder_path), folder_path)
    return folder_path


@pytest.fixture(scope="module")
def marian_page(marian_spm_folder: Path, browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    out = tmp_path_factory.mktemp("marian-web")
    if main(["export", str(marian_spm_folder), "--to", "web", "--out", str(out)]) != 0:
        pytest.skip("the npm files for the browser folder are unavailable")
    with served_folder(out) as url:
        page, _ = open_page(browser, url)
        yield page
        page.close()


def test_a_marian_folder_translates_in_the_browser_as_the_cli(
    marian_spm_folder: Path, marian_page: Any, multi30k_dir: Path
) -> None:
    cpu = EngineOptions(device="cpu")  # as `aiayn translate` runs on a CPU
    model = TranslationService(cpu).model(str(marian_spm_folder))
    web = json.loads((marian_spm_folder / "config.json").read_text())["search"]
    assert web == MARIAN_SEARCH and model.search.length_normalization == "power"
    lines = lines_for(multi30k_dir, "en")[:40] + MARIAN_EXTRA
    greedy, _ = translate_in_page(marian_page, lines, 1)
    assert greedy == cli_translations(model, lines, 1)
    # No beam given: the folder's own (5, |Y|^1.0), as `aiayn translate` takes it from config.json.
    beam = marian_page.evaluate("lines => window.aiayn.translate(lines)", lines)
    assert beam == cli_translations(model, lines, MARIAN_SEARCH["beam_size"])
    assert marian_page.evaluate("window.aiayn.ready")["beam"] == MARIAN_SEARCH["beam_size"]


def test_tokenizers_js_normalizes_a_sentencepiece_tokenizer_as_hf_tokenizers(
    marian_spm_folder: Path, marian_page: Any
) -> None:
    """tokenizers.js's Precompiled ignores the charsmap (NFKC and fixed tables in its place), and its Strip trims
    JavaScript's white space: every code point that its normalizer then rewrites otherwise than HF tokenizers must
    be one that the text pipelines never pass on: white space (runs of it become one space) or unknown to both."""
    tokenizers_js = """async () => {
        const { Tokenizer } = await import("./tokenizers.min.mjs");
        return new Tokenizer(await (await fetch("tokenizer.json")).json(), {});
    }"""
    changed = f"""async () => {{
        const tokenizer = await ({tokenizers_js})();
        const changed = {{}};
        for (let c = 0; c <= 0x10ffff; c++) {{
            if (c >= 0xd800 && c <= 0xdfff) continue;
            const ch = String.fromCodePoint(c);
            const normalized = tokenizer.normalizer.normalize(ch);
            if (normalized !== ch) changed[c] = normalized;
        }}
        return changed;
    }}"""
    in_page = {int(c): text for c, text in marian_page.evaluate(changed).items()}
    tokenizer = ModelFolder.open(marian_spm_folder).tokenizer
    normalize = tokenizer.tokenizer.normalizer.normalize_str
    in_python = {}
    for c in range(0x110000):
        if not 0xD800 <= c <= 0xDFFF and (text := normalize(chr(c))) != chr(c):
            in_python[c] = text
    differ = sorted(c for c in in_page.keys() | in_python.keys() if in_page.get(c) != in_python.get(c))
    assert len(in_python) > 1000 and len(differ) < 10, differ
    chars = [chr(c) for c in differ if not chr(c).isspace()]
    unknown_in_page = f"""async chars => {{
        const tokenizer = await ({tokenizers_js})();
        return chars.filter((ch) => {{
            const ids = tokenizer.encode(ch, {{ add_special_tokens: false }}).ids;
            return !ids.length || ids.includes({tokenizer.tokenizer.token_to_id("<unk>")});
        }});
    }}"""
    assert tokenizer.unknown_characters("".join(chars)) == set(chars)
    assert set(marian_page.evaluate(unknown_in_page, chars)) == set(chars)
